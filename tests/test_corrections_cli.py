"""`artemis-coordinator pending | approve | deny | correct` against a running coordinator
process, fed by an agent link of protocol 1.2 over TCP (its controls recorded): what
waits, what is sent once approved, what is refused and why (unknown or expired id,
unknown action)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from artemis.protocol.auth import load_secret
from artemis.protocol.client import AgentLink
from artemis.protocol.messages import Control, RankInfo, Windows
from artemis.protocol.records import RankWindow
from artemis.protocol.session import AgentIdentity
from artemis.protocol.tcp import TcpTransport
from daemon_harness import BIN, Coordinator, write_secret
from test_corrections_service import locked_window

pytestmark = pytest.mark.slow

JOB = "cc"
NRANKS = 8


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "artemis-coordinator"), *args], capture_output=True, text=True, timeout=60
    )


def rw(rank: int, window: int, slow: set[int]) -> RankWindow:
    """Ranks in `slow` compute 30% longer with their SM clock locked low (no throttle)."""
    return locked_window(JOB, rank, window, slow, NRANKS, NRANKS)


async def ask(*args: str, sock: Path) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(_cli, *args, "--socket", str(sock))


async def until(what: str, cond: Any, timeout: float = 60.0) -> Any:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        got = await cond()
        if got:
            return got
        if loop.time() > end:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


def test_pending_approve_deny_expire_and_bad_input(tmp_path: Path) -> None:
    secret = write_secret(tmp_path / "secret")
    det = {
        "corrections": "apply",
        "corrections_approve": ["reset_clocks"],
        "corrections_max_gpus_per_job": 8,
    }
    c = Coordinator(tmp_path, secret, detector=det).start()
    sock = c.sock
    got: list[Control] = []

    async def on_control(ctl: Control) -> tuple[bool, str]:
        got.append(ctl)
        return True, ""

    async def pending() -> list[dict[str, Any]]:
        r = await ask("pending", sock=sock)
        assert r.returncode == 0, r.stderr
        return [json.loads(x) for x in r.stdout.splitlines()]

    async def run() -> None:
        ident = AgentIdentity(
            agent_id="a0",
            host="h0",
            agent_version="test",
            ranks=tuple(RankInfo(job=JOB, comm="c0", rank=r, nranks=NRANKS) for r in range(8)),
        )
        link = AgentLink(TcpTransport(), c.address, load_secret(secret), ident, on_control)
        link.start()
        try:
            for w in range(16):
                recs = tuple(rw(r, w, {2, 5}) for r in range(NRANKS))
                await link.send(Windows(host="h0", windows=recs), wait=True, timeout=30)
            waiting = await until("two approvals", lambda: _two(pending))
            by_rank = {p["rank"]: p for p in waiting}
            assert set(by_rank) == {2, 5} and all(p["action"] == "reset_clocks" for p in waiting)
            a, b = by_rank[2]["id"], by_rank[5]["id"]

            r = await ask("approve", "c-nope-1", sock=sock)
            assert r.returncode == 1 and "unknown correction id 'c-nope-1'" in r.stderr
            r = await ask("approve", a, sock=sock)
            assert r.returncode == 0 and json.loads(r.stdout)["status"] == "approved", r.stderr
            sent = await until("the apply control", lambda: _controls(got, a))
            assert sent[0].body["op"] == "apply" and sent[0].body["rank"] == 2
            assert sent[0].body["gpu"] == 2 and sent[0].body["action"] == "reset_clocks"
            # this agent acks without a result (it applies no corrections): the
            # correction ends failed with why, and is not resent forever
            incidents = tmp_path / "incidents.jsonl"
            failed = await until("A failed", lambda: _entry(incidents, a, "failed"))
            assert "carries no result" in failed["reason"]
            r = await ask("deny", b, sock=sock)
            assert r.returncode == 0 and json.loads(r.stdout)["status"] == "denied", r.stderr
            r = await ask("deny", b, sock=sock)
            assert r.returncode == 1 and "is denied, not awaiting approval" in r.stderr
            assert await pending() == []
            assert not _sync_controls(got, b)  # a denied correction is never sent

            # Approvals made from now on expire at once; a third GPU slows.
            r = await ask("set", "approval_expiry_s", "0", sock=sock)
            assert r.returncode == 0, r.stderr
            for w in range(16, 30):
                recs = tuple(rw(r, w, {2, 5, 6}) for r in range(NRANKS))
                await link.send(Windows(host="h0", windows=recs), wait=True, timeout=30)
            entry = await until("the expired approval", lambda: _entry(incidents, None, "expired"))
            r = await ask("approve", entry["id"], sock=sock)
            assert r.returncode == 1 and "expired" in r.stderr, r.stderr

            open_id = entry["incident"]
            r = await ask("correct", open_id, "reboot", sock=sock)
            assert r.returncode == 1 and "unknown correction action 'reboot'" in r.stderr
            r = await ask("correct", "no-such-incident", "reset_clocks", sock=sock)
            assert r.returncode == 1 and "no open incident 'no-such-incident'" in r.stderr
            r = await ask("correct", open_id, "reset_clocks", sock=sock)
            assert r.returncode == 0, r.stderr
            forced = json.loads(r.stdout)
            assert forced["forced"] and forced["status"] == "approved"
            await until("the forced control", lambda: _controls(got, forced["id"]))
        finally:
            await link.close(timeout=1)

    try:
        asyncio.run(run())
    finally:
        assert c.daemon is not None
        assert c.daemon.stop() == 0


async def _two(pending: Any) -> list[dict[str, Any]] | None:
    p = await pending()
    return p if len(p) == 2 else None


def _sync_controls(got: list[Control], cid: str) -> list[Control]:
    return [x for x in got if x.action == "correction" and x.body.get("id") == cid]


async def _controls(got: list[Control], cid: str) -> list[Control]:
    return _sync_controls(got, cid)


async def _entry(path: Path, cid: str | None, status: str) -> dict[str, Any] | None:
    """A correction entry (of id `cid`, or any) in `status`, with its incident's id, from
    the incidents file."""
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        for a in rec.get("actions") or []:
            if a.get("type") != "correction" or a["status"] != status:
                continue
            if cid is None or a["id"] == cid:
                return {**a, "incident": rec["id"]}
    return None
