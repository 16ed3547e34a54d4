"""A watchdog behind pytest-timeout, as pytest hooks (tests/conftest.py loads them).

pytest-timeout's signal method raises in the test when its alarm comes, which
needs the main thread back in Python: a test stuck in C code (a thread join
deadlocked on the GIL hung a CI run for its whole 90 minutes) never gets there.
So a grace period past each test's timeout, every thread's Python stack is
printed to the real stderr and the session exits (faulthandler: a C thread, no
GIL needed).
"""

from __future__ import annotations

import faulthandler
import os
from collections.abc import Iterator

import pytest

GRACE_S = float(os.environ.get("ARTEMIS_WATCHDOG_GRACE_S", "60"))
_real_stderr: list[int] = []


def pytest_configure(config: pytest.Config) -> None:
    # Output capture is suspended while plugins configure: fd 2 is the terminal's.
    _real_stderr.append(os.dup(2))


def _timeout_s(item: pytest.Item) -> float:
    mark = item.get_closest_marker("timeout")
    if mark is not None and (mark.args or "timeout" in mark.kwargs):
        return float(mark.args[0] if mark.args else mark.kwargs["timeout"])
    return float(item.config.getini("timeout") or 0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    limit = _timeout_s(item)
    if limit > 0 and _real_stderr:
        faulthandler.dump_traceback_later(limit + GRACE_S, exit=True, file=_real_stderr[0])
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
