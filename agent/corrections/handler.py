"""The agent's part of a correction: consent, at-most-once application, the result.

A ``Control(action="correction")`` (docs/DESIGN.md "Corrections: the node side")
has a body ``{"op": "apply" | "rollback", "id", "action", "rank", "gpu",
"incident", "before"}``. Delivery is at least once, so the agent applies each id
at most once:

1. consent: ``[policy] allow_corrections = false`` answers ``refused``;
2. an id the journal holds as done is answered with its persisted result again;
3. otherwise the state before is read and persisted (``phase = "applying"``)
   BEFORE the hardware call, then the call is made and the result persisted
   (``phase = "done"``). An agent killed between the two finds the id at
   ``applying`` when the correction is redelivered, and does not call again: it
   reads the state now and answers ``applied`` with the persisted ``before``,
   marked ``recovered``. (A kill before the call leaves it unapplied; the
   coordinator's verification then finds no gain and rolls back, which restores
   ``before``: the GPU ends as it was, never changed twice.)

The journal is one small JSON file in the agent's ``state_dir``, replaced
atomically and fsynced (file and folder) at each step, so it survives a SIGKILL
and a power cut. It keeps the last ``JOURNAL_KEEP`` entries.

A rollback (``op = "rollback"``) is journalled under ``<id>:rollback`` the same
way and restores the ``before`` its body carries (else the one persisted for the
id). Library errors are results (``failed`` with the library's text), never an
exception out of here.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
from artemis.agent.corrections.base import CorrectionError, GpuControl, check_action

log = structlog.get_logger("artemis.agent.corrections")

JOURNAL_NAME = "corrections.json"
JOURNAL_KEEP = 256
REFUSED_DETAIL = "corrections are off on this node ([policy] allow_corrections = false)"
# Fault injection (tests/test_corrections_agent.py): "kill_after_apply" makes the agent
# SIGKILL itself right after the hardware call, before the result is persisted or
# acknowledged: the window an at-least-once delivery must not apply twice across.
FAILPOINT_ENV = "ARTEMIS_CORRECTION_FAILPOINT"

# (ok, detail, result): what the agent acknowledges a correction with.
Outcome = tuple[bool, str, dict[str, Any]]


def write_durable(path: Path, obj: Any) -> None:
    """Replace ``path`` with ``obj`` as JSON, on disk before this returns (the file and
    the rename fsynced): a crash leaves the old content or the new, never a torn file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.write(fd, json.dumps(obj, allow_nan=False).encode())
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, path)
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class Journal:
    """id -> entry, persisted in ``<state_dir>/corrections.json``."""

    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.path = Path(state_dir) / JOURNAL_NAME
        self._entries: dict[str, dict[str, Any]] | None = None

    def _load(self) -> dict[str, dict[str, Any]]:
        if self._entries is None:
            try:
                doc = json.loads(self.path.read_text())
            except FileNotFoundError:
                doc = {}
            except (OSError, ValueError) as e:
                # Refuse to act without knowing what was applied: an error, not a guess.
                raise CorrectionError(f"correction journal {self.path} unreadable: {e}") from None
            self._entries = doc if isinstance(doc, dict) else {}
        return self._entries

    def get(self, key: str) -> dict[str, Any] | None:
        return self._load().get(key)

    def put(self, key: str, entry: dict[str, Any]) -> None:
        entries = dict(self._load())
        entries.pop(key, None)
        entries[key] = entry  # last: the oldest go first below
        while len(entries) > JOURNAL_KEEP:
            entries.pop(next(iter(entries)))
        try:
            write_durable(self.path, entries)
        except OSError as e:
            raise CorrectionError(f"cannot persist the correction journal {self.path}: {e}") from e
        self._entries = entries


class CorrectionHandler:
    """Applies correction controls through ``backend_for(rank)`` within node consent."""

    def __init__(
        self,
        allowed: Callable[[], bool],
        state_dir: str | os.PathLike[str],
        backend_for: Callable[[int], GpuControl],
        gpu_for: Callable[[int], int | None] = lambda rank: None,
    ) -> None:
        self.allowed = allowed
        self.journal = Journal(state_dir)
        self.backend_for = backend_for
        self.gpu_for = gpu_for
        self.applied = 0  # hardware calls made by this process (tests, logs)

    def handle(self, body: dict[str, Any]) -> Outcome:
        cid = body.get("id")
        op = body.get("op", "apply")
        try:
            if not isinstance(cid, str) or not cid:
                raise ValueError(f"correction without an id: {cid!r}")
            action = check_action(body.get("action"))
            if op not in ("apply", "rollback"):
                raise ValueError(f"unknown correction op {op!r}; known: apply, rollback")
            rank = body.get("rank")
            if isinstance(rank, bool) or not isinstance(rank, int):
                raise ValueError(f"correction {cid}: rank {rank!r} is not a rank number")
        except ValueError as e:
            return False, str(e), {"status": "failed", "id": cid, "error": str(e)}
        base = {"id": cid, "action": action, "gpu": body.get("gpu")}
        if not self.allowed():
            return False, REFUSED_DETAIL, {**base, "status": "refused", "error": REFUSED_DETAIL}
        key = cid if op == "apply" else f"{cid}:rollback"
        try:
            return self._run(key, op, action, rank, base, body)
        except CorrectionError as e:
            log.warning("correction failed", id=cid, op=op, action=action, error=str(e))
            return False, str(e), {**base, "status": "failed", "error": str(e)}

    def _run(
        self, key: str, op: str, action: str, rank: int, base: dict[str, Any], body: dict[str, Any]
    ) -> Outcome:
        done = self.journal.get(key)
        if done is not None and done.get("phase") == "done":
            res = dict(done["result"])
            return res["status"] in ("applied", "rolled_back"), "already done: " + key, res
        backend = self.backend_for(rank)
        gpu = base["gpu"]
        if not isinstance(gpu, int) or isinstance(gpu, bool):
            gpu = self.gpu_for(rank) if backend.needs_gpu else -1
            if gpu is None:
                raise CorrectionError(f"rank {rank}'s GPU is not known on this node")
            if gpu >= 0:
                base = {**base, "gpu": gpu}
        ok_status = "applied" if op == "apply" else "rolled_back"
        if done is not None:  # "applying": the call may have been made before a kill
            res = {
                **base,
                "status": ok_status,
                "before": done.get("before") or {},
                "after": backend.state(action, gpu),
                "recovered": True,
            }
            self._finish(key, done, res)
            return True, f"{key} found half-done after a restart: not applied again", res
        before = self._before(op, action, gpu, backend, body, base["id"])
        entry = {"phase": "applying", "op": op, "rank": rank, "before": before, "t": time.time()}
        self.journal.put(key, entry)
        try:
            if op == "apply":
                after = backend.apply(action, gpu, before)
            else:
                after = backend.rollback(action, gpu, before)
        except CorrectionError as e:
            res = {**base, "status": "failed", "before": before, "error": str(e)}
            self._finish(key, entry, res)
            return False, str(e), res
        finally:
            self.applied += 1
            if os.environ.get(FAILPOINT_ENV) == "kill_after_apply":
                log.warning("failpoint: SIGKILL after applying a correction", key=key)
                os.kill(os.getpid(), signal.SIGKILL)
        res = {**base, "status": ok_status, "before": before, "after": after}
        self._finish(key, entry, res)
        log.info("correction done", key=key, action=action, gpu=gpu, before=before, after=after)
        return True, f"{action} {ok_status} on GPU {gpu}", res

    def _before(
        self,
        op: str,
        action: str,
        gpu: int,
        backend: GpuControl,
        body: dict[str, Any],
        cid: str,
    ) -> dict[str, Any]:
        """Apply: the state now. Rollback: the state to restore (the body's, else the
        one persisted when ``cid`` was applied)."""
        if op == "apply":
            return backend.state(action, gpu)
        before = body.get("before")
        if not isinstance(before, dict) or not before:
            applied = self.journal.get(cid) or {}
            before = applied.get("before")
        if not isinstance(before, dict) or not before:
            raise CorrectionError(f"rollback of {cid}: no state before to restore")
        return before

    def _finish(self, key: str, entry: dict[str, Any], res: dict[str, Any]) -> None:
        self.journal.put(key, {**entry, "phase": "done", "result": res})
