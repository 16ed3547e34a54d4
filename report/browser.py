"""Headless Chromium over its DevTools protocol on a pipe (stdlib only).

Used by the report's browser test and by ``make docs-screenshot``. Chromium's
``--remote-debugging-pipe`` reads protocol messages (JSON, each ended by a NUL
byte) on its fd 3 and writes them on fd 4, so no port, websocket or driver is
involved. ``open_page`` loads a file and returns what the page did: console
errors, exceptions, every network request, and a handle to evaluate
JavaScript in it and take a PNG screenshot.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NAMES = ("chromium", "chromium-browser", "google-chrome")


class BrowserError(Exception):
    pass


def find_chromium() -> str | None:
    """The browser's path: $CHROMIUM, else the first of NAMES on PATH."""
    env = os.environ.get("CHROMIUM")
    if env:
        return env
    for n in NAMES:
        p = shutil.which(n)
        if p:
            return p
    return None


@dataclass
class PageLog:
    console_errors: list[str] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)
    log_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        return self.console_errors + self.exceptions + self.log_errors + self.failed


class Browser:
    """One headless Chromium process and its DevTools pipe."""

    def __init__(self, exe: str | None = None, timeout_s: float = 30.0) -> None:
        exe = exe or find_chromium()
        if not exe:
            raise BrowserError("no chromium on PATH (tests/setup/install-chromium.sh installs it)")
        self.timeout_s = timeout_s
        self._profile = tempfile.mkdtemp(prefix="artemis-chromium-")
        to_r, self._to_w = os.pipe()
        self._from_r, from_w = os.pipe()

        args = [
            exe,
            "--headless",
            "--remote-debugging-pipe",
            "--no-sandbox",  # CI runs as root, where the sandbox refuses to start
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--hide-scrollbars",
            "--mute-audio",
            f"--user-data-dir={self._profile}",
            "about:blank",
        ]
        # Its log goes to a file: a pipe nobody drains would stall it once full.
        self._stderr_path = Path(self._profile) / "chromium.log"
        # The pipe ends go to fds 3 and 4 by a shell redirection (no preexec_fn: that
        # is unsafe in a process with threads); bash, as dash refuses fds past 9.
        cmd = f"exec {' '.join(shlex.quote(a) for a in args)} 3<&{to_r} 4>&{from_w}"
        with open(self._stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [shutil.which("bash") or "/bin/bash", "-c", cmd],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                pass_fds=(to_r, from_w),
            )
        os.close(to_r)
        os.close(from_w)
        self._buf = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ protocol
    def _send(self, msg: dict[str, Any]) -> None:
        data = json.dumps(msg).encode() + b"\0"
        while data:
            n = os.write(self._to_w, data)
            data = data[n:]

    def _read_one(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("chromium did not answer in time")
            r, _, _ = select.select([self._from_r], [], [], left)
            if not r:
                continue
            chunk = os.read(self._from_r, 1 << 20)
            if not chunk:
                err = self._stderr_path.read_text(errors="replace")
                raise BrowserError(f"chromium closed its DevTools pipe: {err[-2000:]}")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        msg: dict[str, Any] = json.loads(raw)
        return msg

    def call(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> dict[str, Any]:
        """Send one command and wait for its answer; events on the way are kept."""
        self._next_id += 1
        mid = self._next_id
        msg: dict[str, Any] = {"id": mid, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        self._send(msg)
        deadline = time.monotonic() + self.timeout_s
        while True:
            m = self._read_one(deadline)
            if m.get("id") == mid:
                if "error" in m:
                    raise BrowserError(f"{method}: {m['error']}")
                result: dict[str, Any] = m.get("result", {})
                return result
            if "method" in m:
                self.events.append(m)

    def wait_event(self, method: str, session: str | None = None) -> dict[str, Any]:
        for i, e in enumerate(self.events):
            if e.get("method") == method and (session is None or e.get("sessionId") == session):
                return self.events.pop(i)
        deadline = time.monotonic() + self.timeout_s
        while True:
            m = self._read_one(deadline)
            if "method" not in m:
                continue
            if m["method"] == method and (session is None or m.get("sessionId") == session):
                return m
            self.events.append(m)

    def close(self) -> None:
        with suppress(OSError):
            self._send({"id": 0, "method": "Browser.close", "params": {}})
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_w, self._from_r):
            with suppress(OSError):
                os.close(fd)
        shutil.rmtree(self._profile, ignore_errors=True)


class Page:
    """A tab attached over the pipe (flat sessions)."""

    def __init__(self, browser: Browser, session: str, log: PageLog) -> None:
        self.browser = browser
        self.session = session
        self.log = log

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.browser.call(method, params, self.session)

    def evaluate(self, expr: str) -> Any:
        """The value of a JavaScript expression in the page (returned by value)."""
        r = self.call(
            "Runtime.evaluate", {"expression": expr, "returnByValue": True, "awaitPromise": True}
        )
        if "exceptionDetails" in r:
            raise BrowserError(f"evaluate: {r['exceptionDetails']}")
        return r.get("result", {}).get("value")

    def screenshot(self, width: int = 1100, max_height: int | None = None) -> bytes:
        """A PNG of the page at ``width`` CSS pixels: all of it, or its top ``max_height``."""
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False},
        )
        metrics = self.call("Page.getLayoutMetrics")
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        height = size["height"] if max_height is None else min(size["height"], max_height)
        r = self.call(
            "Page.captureScreenshot",
            {
                "format": "png",
                "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1},
            },
        )
        return base64.b64decode(r["data"])


def _collect(log: PageLog, events: list[dict[str, Any]]) -> None:
    for e in events:
        m, p = e.get("method"), e.get("params", {})
        if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            log.console_errors.append(
                " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", []))
            )
        elif m == "Runtime.exceptionThrown":
            log.exceptions.append(json.dumps(p.get("exceptionDetails", {}))[:500])
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            log.log_errors.append(p["entry"].get("text", ""))
        elif m == "Network.requestWillBeSent":
            log.requests.append(p.get("request", {}).get("url", ""))
        elif m == "Network.loadingFailed":
            log.failed.append(f"request failed: {p.get('errorText')}")


def new_page(b: Browser, path: Path) -> Page:
    """Load ``path`` in a new tab of ``b``; the page's log has what happened as it loaded."""
    target = b.call("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = b.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for dom in ("Page", "Runtime", "Log", "Network"):
        b.call(f"{dom}.enable", {}, session)
    b.events = [e for e in b.events if e.get("sessionId") != session]  # about:blank's own
    b.call("Page.navigate", {"url": path.resolve().as_uri()}, session)
    b.wait_event("Page.loadEventFired", session)
    # One round trip more so that events queued behind the load are read.
    b.call("Runtime.evaluate", {"expression": "1"}, session)
    log = PageLog()
    _collect(log, [e for e in b.events if e.get("sessionId") == session])
    b.events = [e for e in b.events if e.get("sessionId") != session]
    return Page(b, session, log)


@contextmanager
def open_page(path: Path, exe: str | None = None, timeout_s: float = 30.0) -> Iterator[Page]:
    """Load ``path`` in a fresh headless Chromium (closed on exit)."""
    b = Browser(exe, timeout_s)
    try:
        yield new_page(b, path)
    finally:
        b.close()


def screenshot(html: Path, png: Path, width: int = 1100, max_height: int | None = None) -> PageLog:
    """Write a PNG of an HTML file (its top ``max_height`` pixels); return the page's log."""
    with open_page(html) as page:
        png.write_bytes(page.screenshot(width, max_height))
        return page.log


if __name__ == "__main__":
    import sys

    if len(sys.argv) not in (3, 4):
        sys.exit("usage: python -m artemis.report.browser PAGE.html OUT.png [MAX_HEIGHT]")
    lg = screenshot(
        Path(sys.argv[1]),
        Path(sys.argv[2]),
        max_height=int(sys.argv[3]) if len(sys.argv) == 4 else None,
    )
    if lg.problems():
        sys.exit("page problems: " + "; ".join(lg.problems()))
