"""Who removes a ring, and when (``artemis_ring.h`` "Lifetime", docs/DESIGN.md "Ring").

Three marks, none of them a header field, so a reader needs no write access to a
ring (the agent may run as another user than the job; it needs the folder only):

- the writer's lock: the writer holds ``flock(LOCK_SH)`` on its ring for its life
  and sets ``LIFE_FLOCK`` (header ``life_flags``, minor 2). The kernel drops it when the process dies, however it
  dies, so a ring whose lock can be taken exclusively has no writer left. A pid in
  the header could not say that: pids are reused, and an agent in another pid
  namespace sees other ones.
- the agent's lock: an agent serving a folder holds ``flock(LOCK_EX)`` on
  ``<folder>/agent.lock``, so a writer knows it serves before it has scanned.
- the reader's mark: a reader that will read a ring to its end (the agent) leaves
  an empty ``<name>.ring.reader`` beside it.

A writer that finishes cleanly removes its ring (``retire``) unless an agent serves
the folder, a reader marked the ring, or ``ARTEMIS_KEEP_RINGS=1`` (rings kept for
reading after the job: post-mortem tools, tests). Otherwise the reader removes it
once read to the end. The ring of a writer that died unfinished is reclaimed by the
agent ``RECLAIM_AFTER_S`` after its lock went, or, where no agent serves the
folder, by the next managed writer (``reclaim_dead``) once it is that old.
Only the standard library, like the rest of this room's writer side.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import time
from collections.abc import Mapping
from pathlib import Path

from artemis.ring import format as rf

AGENT_LOCK = "agent.lock"
READER_SUFFIX = ".reader"
KEEP_ENV = "ARTEMIS_KEEP_RINGS"
# How long a dead writer's ring stays: the agent's reads of a few ticks, with room
# for a slow uplink's ack (the agent counts from the lock's release, a writer's
# sweep from the ring's creation: it cannot know when the writer died).
RECLAIM_AFTER_S = 30.0
# magic, flags, created_ns and life_flags of a header, read with the standard library
_PROBE = struct.Struct("<Q44xI8xQ288xI")
assert _PROBE.size == rf.header_offset("life_flags") + 4
_TRUE = ("1", "true", "yes", "on")


def reader_mark_path(ring: str | os.PathLike[str]) -> str:
    return os.fspath(ring) + READER_SUFFIX


def mark_read(ring: str | os.PathLike[str]) -> bool:
    """Leave the reader's mark beside ``ring``; False when the folder refuses it."""
    try:
        os.close(os.open(reader_mark_path(ring), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
        return True
    except OSError:
        return False


def marked(ring: str | os.PathLike[str]) -> bool:
    return os.path.exists(reader_mark_path(ring))


def keep_requested(env: Mapping[str, str] = os.environ) -> bool:
    """``ARTEMIS_KEEP_RINGS`` set to a true value: no writer removes its rings."""
    return env.get(KEEP_ENV, "").strip().lower() in _TRUE


def _lock_free(
    path: str | os.PathLike[str], mode: int, absent: type[OSError] = FileNotFoundError
) -> bool | None:
    """Whether the flock ``mode`` on ``path`` could be taken now (a probe: taken and
    dropped at once); None when opening it fails with ``absent`` (no such file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except absent:
        return None
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # drops our probe's lock with it


def agent_serves(folder: str | os.PathLike[str]) -> bool:
    """An agent holds the folder's lock now."""
    # A lock file we cannot open (None) is as none: no agent ever served this folder.
    return _lock_free(os.path.join(folder, AGENT_LOCK), fcntl.LOCK_SH, OSError) is False


def hold_writer_lock(fd: int) -> None:
    """The writer's lock, on the ring's open file, held until ``fd`` closes."""
    fcntl.flock(fd, fcntl.LOCK_SH)


def writer_gone(ring: str | os.PathLike[str]) -> bool:
    """No process holds the writer's lock of ``ring`` (meaningful when its header has
    ``LIFE_FLOCK``); a ring already removed counts as gone."""
    return _lock_free(ring, fcntl.LOCK_EX) is not False


def remove(ring: str | os.PathLike[str]) -> bool:
    """Remove a ring and its sidecars; True when the ring itself was removed here."""
    removed = True
    try:
        os.unlink(ring)
    except FileNotFoundError:
        removed = False
    for side in (rf.env_sidecar_path(ring), reader_mark_path(ring)):
        with contextlib.suppress(OSError):
            os.unlink(side)
    return removed


def retire(ring: str | os.PathLike[str]) -> bool:
    """A writer's clean finish: remove the ring when no one will read it (see the
    module's text); True when it was removed."""
    if keep_requested() or agent_serves(Path(ring).parent) or marked(ring):
        return False
    return remove(ring)


def reclaim_dead(folder: str | os.PathLike[str], min_age_s: float | None = None) -> list[str]:
    """The next writer's sweep, where no agent serves ``folder``: remove the rings whose
    writer died unfinished (``LIFE_FLOCK`` set, its lock free), no reader marked, made
    at least ``min_age_s`` (default ``RECLAIM_AFTER_S``) ago. Returns their paths."""
    age_ns = int((RECLAIM_AFTER_S if min_age_s is None else min_age_s) * 1e9)
    if keep_requested() or agent_serves(folder):
        return []
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".ring"))
    except OSError:
        return []
    out = []
    for name in names:
        path = os.path.join(folder, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            raw = os.pread(fd, _PROBE.size, 0)
            if len(raw) < _PROBE.size:
                continue
            magic, flags, created_ns, life = _PROBE.unpack(raw)
            if magic != rf.RING_MAGIC or flags & rf.RING_FINISHED or not life & rf.LIFE_FLOCK:
                continue
            if time.time_ns() - created_ns < age_ns or marked(path):
                continue
            try:  # held while removing: no writer can be inside it
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            if remove(path):
                out.append(path)
        finally:
            os.close(fd)
    return out


class FolderLock:
    """The agent's lock on the folder it serves, taken when the folder exists (the
    agent does not make the folder: its writers do, with their own owner)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.path = os.path.join(folder, AGENT_LOCK)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def hold(self) -> bool:
        """Take the lock if not held yet; False while the folder is missing or another
        agent holds it (this one takes it over when that one ends)."""
        if self._fd is not None:
            return True
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
