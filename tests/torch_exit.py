"""Spawned torch workers leave with ``os._exit`` once their work is done.

A DDP job's process group outlives ``destroy_process_group``: DDP's C++ reducer
keeps references to it that no garbage collection breaks (a 2-rank gloo DDP
script: 2 gloo worker threads still alive after the worker returned and after
``gc.collect()``; 0 without DDP). So the group and its gloo workers are still
there when the interpreter finalizes, and a worker that drops a finished Work
then (its tensors' Python objects need the GIL) is ended with ``pthread_exit``,
whose unwinding meets a ``noexcept`` frame: ``std::terminate``, and the rank dies
of SIGABRT ("terminate called without an active exception"). A core of one:
``ProcessGroupGloo::runLoop`` -> ``~AsyncBarrierWork`` -> ``decref_pyobject`` ->
``take_gil`` -> ``PyThread_exit_thread``, the main thread in ``Py_FinalizeEx``.
It is torch's race (plain gloo, tests/test_job_ddp.py: 1 run in 16, and once in
CI), not something that test checks, so its worker skips finalization once it is
done: its results are already on disk, stdout and stderr are flushed. A worker
that raised exits as before (torch's spawn reports the error).

Jobs on the ``artemis`` backend too: a ring is finished by the last owed
completion, which a gloo worker runs after the training thread has returned
from its last wait (docs/DESIGN.md, "Closing"), and ``destroy_process_group``
waits for it (up to ``backend.CLOSE_WAIT_S``). Before it waited, exiting at
once lost that completion, and the rank's last window with it (a ``missing``
finding at the end of a clean `artemis run`, seen when the job scripts used this).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any


def exit_when_done(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``; when it returns, the process ends there (exit code 0)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        fn(*args, **kwargs)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    return run
