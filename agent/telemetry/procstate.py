"""How much of the wall time a rank's process was stopped, by sampling its state.

The kernel counts a process's time on a CPU (``/proc/<pid>/stat`` utime and
stime), runnable but waiting (``schedstat`` run delay) and, for its cgroup,
throttled. It counts nothing for a stopped process: SIGSTOP, a job scheduler's
suspend, a debugger's stop (state ``T`` or ``t``). A rank stopped inside a CPU
collective holds every rank there, and its peers, asleep in the same
collective, show the same CPU and wait figures as it does (detect/DETECTOR.md
"The host's evidence"). So the state itself is sampled: a thread reads each
watched process's state about every INTERVAL_S (20 ms), at a jittered interval
so that a stop with a round period (100 ms) is not aliased, and ``take(pid)``
is the share of samples in a stopped state since the last take, in %: about
50 samples a second, so a 1-s telemetry sample's binomial error is at most 7
points.

A process's state is its main thread's (the ``/proc/<pid>/stat`` of the thread
group leader). Measured on the 2-core development machine: 0.7% of a core
watching 1 rank, 1.1% watching 8 (at 10 ms: 1.4% and 2.2%); the thread stops
when nothing is watched (bench/README.md "Agent CPU").
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

INTERVAL_S = 0.02  # mean time between two passes
JITTER = 0.5  # each interval drawn from INTERVAL_S x [1 - JITTER, 1 + JITTER]
# Fewer since the last take: no figure yet, and they count into the next. A healthy
# process reads exactly 0 (no error to guard against); a stopped one's error at 10
# samples is at most 16 points (p = 0.5), and windows of 0.4 s (the MLP job's) with
# no 1-s telemetry sample of their own still get one (the agent samples at their end).
MIN_SAMPLES = 10
FORGET_S = 10.0  # a pid not asked for in this long is no longer sampled
STOPPED = frozenset("Tt")


def parse_state(text: str) -> str | None:
    """Field 3 of /proc/<pid>/stat, the state letter (the name may hold spaces and parens)."""
    rest = text[text.rfind(")") + 1 :].split(maxsplit=1)
    return rest[0] if rest and len(rest[0]) == 1 else None


def _state(path: str) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return parse_state(os.read(fd, 512).decode(errors="replace"))
    except OSError:
        return None
    finally:
        os.close(fd)


class StateSampler:
    """Samples watched processes' states on a thread of its own; `take` reads them out.

    `poll()` is one pass, callable without the thread (tests drive it so)."""

    def __init__(
        self,
        root: str | os.PathLike[str] = "/",
        interval_s: float = INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._proc = str(Path(root) / "proc")
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        # pid -> [samples, stopped samples, last asked for (clock)]
        self._counts: dict[int, list[float]] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._rng = random.Random()

    def take(self, pid: int) -> float | None:
        """% of samples with the process stopped since the last take that gave one (None:
        too few yet, or the first call for this pid, which starts sampling it)."""
        now = self._clock()
        with self._lock:
            c = self._counts.get(pid)
            if c is None:
                self._counts[pid] = [0, 0, now]
                self._ensure_thread()
                return None
            c[2] = now
            n, stopped = c[0], c[1]
            if n < MIN_SAMPLES:
                return None
            c[0] = c[1] = 0
        return 100.0 * stopped / n

    def poll(self) -> None:
        """One pass: every watched pid's state; a pid gone or long unasked is dropped."""
        now = self._clock()
        with self._lock:
            pids = list(self._counts)
        seen: dict[int, str | None] = {pid: _state(f"{self._proc}/{pid}/stat") for pid in pids}
        with self._lock:
            for pid, state in seen.items():
                c = self._counts.get(pid)
                if c is None:
                    continue
                if state is None or now - c[2] > FORGET_S:
                    del self._counts[pid]
                    continue
                c[0] += 1
                c[1] += state in STOPPED

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            self._thread = None

    def _ensure_thread(self) -> None:
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._run, name="artemis-procstate", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        lo, hi = self.interval_s * (1 - JITTER), self.interval_s * (1 + JITTER)
        while not self._stop.is_set():
            time.sleep(self._rng.uniform(lo, hi))
            if self._stop.is_set():
                return
            self.poll()
            with self._lock:
                if not self._counts:  # nothing watched: the next take starts it again
                    self._thread = None
                    return
