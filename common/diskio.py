"""Files the daemons append to, on a disk that may fill: whole lines or nothing, a
bounded backlog, size and age rotation, and a health record per file.

Every append-only output of the coordinator (findings, incidents, plans) goes
through `JsonlAppender`; the journal, the job state files, the dumps and the
store report their write errors to a `FileHealth` the same way. The rules
(docs/RELIABILITY.md "3. Full disks"):

* A write that fails (ENOSPC, EDQUOT, EIO, ...) is rolled back to the last
  whole line (``ftruncate`` to the size before it), so a reader never sees a
  cut line, and the lines stay in memory, in order, up to a bound
  (`BACKLOG_LINES` lines or `BACKLOG_BYTES` bytes); lines past the bound are
  counted lost with the reason ``backlog_full``. The backlog is written first at
  the next append, or at `retry` (the coordinator's tick), so it drains by itself
  when space returns.
* One ERROR log line names the file when a write first fails, one INFO line
  when writes resume; `FileHealth` keeps the counts the metrics export
  (``straggler_write_errors_total{file,reason}``, ``straggler_disk_full{file}``,
  ``straggler_write_backlog_lines{file}``, ``straggler_write_lost_total{file,reason}``).
* Rotation (`Retention`): when the live file would pass ``max_bytes``, or its
  oldest line is older than ``max_age_s``, it is renamed ``NAME.1`` (``.1`` to
  ``.2``, ...), and only ``keep_files`` rotated files are kept; rotated files
  older than ``max_age_s`` (by mtime) are deleted. `rotated_paths` lists a file's
  generations oldest first, for readers that want the whole history.
"""

from __future__ import annotations

import errno
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger("artemis.diskio")

BACKLOG_LINES = 100_000
BACKLOG_BYTES = 64 << 20

_REASONS = {
    errno.ENOSPC: "no_space",
    errno.EDQUOT: "quota",
    errno.EROFS: "read_only",
    errno.EIO: "io",
    errno.EACCES: "permission",
    errno.EPERM: "permission",
    errno.EFBIG: "too_big",
}


def reason_of(e: BaseException) -> str:
    """A short metrics label for a write error."""
    if isinstance(e, OSError) and e.errno in _REASONS:
        return _REASONS[e.errno]
    text = str(e).lower()
    if "disk is full" in text or "no space" in text:  # sqlite3: SQLITE_FULL
        return "no_space"
    return "os_error" if isinstance(e, OSError) else "error"


@dataclass
class FileHealth:
    """The write state of one output (a label: findings, journal, store, ...)."""

    label: str
    path: str = ""
    errors: Counter[str] = field(default_factory=Counter)  # failed writes by reason
    lost: Counter[str] = field(default_factory=Counter)  # lines/records given up, by reason
    failing: bool = False  # the last write failed
    backlog: int = 0  # lines held in memory, waiting for space
    last_error: str = ""
    _loss_logged: bool = False

    @property
    def _log(self) -> Any:
        """The logger with this output named in every line (file, path)."""
        return log.bind(file=self.label, path=self.path)

    def failed(self, e: BaseException, what: str = "write") -> str:
        """Count a failed write; the first of an outage is logged as an ERROR."""
        reason = reason_of(e)
        self.errors[reason] += 1
        self.last_error = str(e)
        if not self.failing:
            self._log.error(
                "write failed: output not written until space returns",
                reason=reason,
                what=what,
                error=str(e),
            )
        self.failing = True
        return reason

    def ok(self) -> None:
        if self.failing:
            self._log.info("writes resumed", lost=sum(self.lost.values()))
        self.failing = False
        self._loss_logged = False

    def give_up(self, n: int, reason: str) -> None:
        """Count output given up; the first loss of an outage is logged (the rest counted)."""
        if n <= 0:
            return
        self.lost[reason] += n
        if not self._loss_logged:
            self._loss_logged = True
            self._log.error(
                "output lost (counted in straggler_write_lost_total)", n=n, reason=reason
            )


@dataclass(frozen=True)
class Retention:
    """How much of one output is kept: see the module docstring. 0 = no limit."""

    max_bytes: int = 0
    max_age_s: float = 0.0
    keep_files: int = 5


def rotated_paths(path: str | Path) -> list[Path]:
    """A file's generations that exist, oldest first: NAME.N, ..., NAME.1, NAME."""
    p = Path(path)
    gens: list[tuple[int, Path]] = []
    if p.parent.is_dir():
        for q in p.parent.iterdir():
            suffix = q.name[len(p.name) + 1 :]
            if q.name.startswith(p.name + ".") and suffix.isdigit():
                gens.append((int(suffix), q))
    out = [q for _, q in sorted(gens, reverse=True)]
    if p.exists():
        out.append(p)
    return out


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class JsonlAppender:
    """Appends lines (str, without the newline) to `path`: see the module docstring."""

    def __init__(
        self,
        path: str | Path,
        label: str,
        retention: Retention | None = None,
        *,
        backlog_lines: int = BACKLOG_LINES,
        backlog_bytes: int = BACKLOG_BYTES,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(path)
        self.retention = retention or Retention()
        self.health = FileHealth(label, str(self.path))
        self.backlog_lines = backlog_lines
        self.backlog_bytes = backlog_bytes
        self.wall = wall
        self._fd: int | None = None
        self._size = 0
        self._born = 0.0  # when the live file's oldest line was written (about)
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self.written = 0  # lines written (over the life of this object)

    # ------------------------------------------------------------------ files
    def _open(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            st = os.fstat(self._fd)
            self._size = st.st_size
            # An existing file's oldest line is at least as old as its last change.
            self._born = st.st_mtime if st.st_size else self.wall()
        return self._fd

    def _rotate_if_due(self, incoming: int) -> None:
        r = self.retention
        if self._size == 0:
            return
        big = r.max_bytes > 0 and self._size + incoming > r.max_bytes
        old = r.max_age_s > 0 and self.wall() - self._born > r.max_age_s
        if not (big or old):
            return
        self._close_fd()
        keep = max(1, r.keep_files)
        gens = [q for q in rotated_paths(self.path) if q != self.path]
        for q in gens:
            n = int(q.name.rsplit(".", 1)[1])
            if n >= keep:
                q.unlink(missing_ok=True)
        for n in range(keep - 1, 0, -1):
            src = self.path.with_name(f"{self.path.name}.{n}")
            if src.exists():
                os.replace(src, self.path.with_name(f"{self.path.name}.{n + 1}"))
        if self.path.exists():
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
        log.info("output rotated", file=self.health.label, path=str(self.path), size=self._size)
        self.prune()

    def prune(self) -> int:
        """Delete rotated generations older than the retention age; returns how many."""
        if self.retention.max_age_s <= 0:
            return 0
        cutoff = self.wall() - self.retention.max_age_s
        n = 0
        for q in rotated_paths(self.path):
            if q == self.path:
                continue
            try:
                if q.stat().st_mtime < cutoff:
                    q.unlink()
                    n += 1
            except OSError:
                continue
        return n

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # ------------------------------------------------------------------ writes
    def write_lines(self, lines: Iterable[str]) -> int:
        """Queue the lines and write everything queued; returns lines written now."""
        for line in lines:
            b = line.encode() + b"\n"
            if (
                len(self._pending) >= self.backlog_lines
                or self._pending_bytes + len(b) > self.backlog_bytes
            ):
                self.health.give_up(1, "backlog_full")
                continue
            self._pending.append(b)
            self._pending_bytes += len(b)
        return self.retry()

    def retry(self) -> int:
        """Write the lines waiting in memory (all or none); returns how many went out."""
        if not self._pending:
            return 0
        data = b"".join(self._pending)
        try:
            self._rotate_if_due(len(data))
            fd = self._open()
            if self._size == 0:
                self._born = self.wall()
            try:
                _write_all(fd, data)
            except OSError:
                # Back to the last whole line: a reader never sees a cut one.
                try:
                    os.ftruncate(fd, self._size)
                except OSError:
                    self._close_fd()  # reopened (and re-measured) at the next try
                raise
        except OSError as e:
            self.health.failed(e)
            self.health.backlog = len(self._pending)
            return 0
        n = len(self._pending)
        self._size += len(data)
        self._pending, self._pending_bytes = [], 0
        self.written += n
        self.health.backlog = 0
        self.health.ok()
        return n

    def close(self) -> None:
        self.retry()
        if self._pending:
            self.health.give_up(len(self._pending), "unwritten_at_exit")
            self._pending, self._pending_bytes = [], 0
            self.health.backlog = 0
        self._close_fd()


def prune_dir(folder: str | Path, *, max_bytes: int, max_age_s: float, now: float) -> int:
    """Delete a folder's files older than `max_age_s` (by mtime), then the oldest ones
    until the rest fit in `max_bytes` (0 = no limit); returns how many went."""
    d = Path(folder)
    if not d.is_dir():
        return 0
    files: list[tuple[float, int, Path]] = []
    for q in d.iterdir():
        try:
            st = q.stat()
        except OSError:
            continue
        if q.is_file():
            files.append((st.st_mtime, st.st_size, q))
    files.sort()
    total = sum(size for _, size, _ in files)
    n = 0
    for mtime, size, q in files:
        too_old = max_age_s > 0 and now - mtime > max_age_s
        too_big = max_bytes > 0 and total > max_bytes
        if not (too_old or too_big):
            continue
        try:
            q.unlink()
        except OSError:
            continue
        total -= size
        n += 1
    return n
