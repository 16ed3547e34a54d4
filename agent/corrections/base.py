"""The narrow hardware interface a correction goes through, and the two corrections.

A correction changes one GPU setting back to what it should be and records what
it was, so it can be put back (docs/DESIGN.md "Corrections: the node side"):

* ``reset_clocks`` (cause ``clocks``): unlock the SM and memory clocks. The state
  before is what the backend can read of the clocks (``clock_state``); the
  rollback sets that again (``restore_clocks``).
* ``restore_power_limit`` (cause ``power``): set the power limit to the board's
  default. The state before is the enforced limit and the default; the rollback
  sets the limit that was enforced.

A backend (NVML, AMD SMI, the simulator's GPU) implements the five methods of
``GpuControl``; everything else here is shared. A library error becomes a
``CorrectionError`` carrying the library's own text, which the agent reports as
``failed`` (never a crash).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

ACTIONS = ("reset_clocks", "restore_power_limit")


class CorrectionError(Exception):
    """A hardware library refused or failed a call; ``str()`` is the library's text."""


class GpuControl(ABC):
    """What a correction may read and set on one GPU of this host (``gpu``: its index
    in the library's device order, as telemetry's ``gpu_index``)."""

    vendor: str = ""
    needs_gpu = True  # False: the backend knows its GPU without an index (the simulator's)

    @abstractmethod
    def clock_state(self, gpu: int) -> dict[str, Any]:
        """The clock settings a rollback of ``reset_clocks`` restores (JSON-able)."""

    @abstractmethod
    def reset_clocks(self, gpu: int) -> None:
        """Unlock the clocks: the driver chooses them again."""

    @abstractmethod
    def restore_clocks(self, gpu: int, before: dict[str, Any]) -> None:
        """Set the clocks ``clock_state`` read before ``reset_clocks``."""

    @abstractmethod
    def power_state(self, gpu: int) -> dict[str, Any]:
        """``{"power_limit_w": enforced limit, "default_w": the board's default}``."""

    @abstractmethod
    def set_power_limit(self, gpu: int, watts: float) -> None:
        """Set the power limit, in watts (the backend converts to its unit)."""

    # ------------------------------------------------------------- shared
    def state(self, action: str, gpu: int) -> dict[str, Any]:
        """The state ``action`` changes, as read now, tagged with the vendor."""
        read = self.clock_state if action == "reset_clocks" else self.power_state
        values = read(gpu)  # first: a backend may learn its vendor from the read
        return {"vendor": self.vendor, **values}

    def apply(self, action: str, gpu: int, before: dict[str, Any]) -> dict[str, Any]:
        """Carry out ``action`` (``before`` read by ``state`` just earlier); the state after."""
        if action == "reset_clocks":
            self.reset_clocks(gpu)
        else:
            self.set_power_limit(gpu, _watts(before, "default_w"))
        return self.state(action, gpu)

    def rollback(self, action: str, gpu: int, before: dict[str, Any]) -> dict[str, Any]:
        """Put back what ``before`` recorded; the state after."""
        if action == "reset_clocks":
            self.restore_clocks(gpu, before)
        else:
            self.set_power_limit(gpu, _watts(before, "power_limit_w"))
        return self.state(action, gpu)


def _watts(state: dict[str, Any], key: str) -> float:
    v = state.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
        raise CorrectionError(f"no {key} in the GPU's state to set ({v!r})")
    return float(v)


def library_call(lib: Any, error: type[BaseException], who: str, name: str, *args: Any) -> Any:
    """``lib.name(*args)``; the library's ``error`` (and a missing function) become a
    ``CorrectionError`` with its text, prefixed by ``who`` (NVML, AMD SMI)."""
    fn = getattr(lib, name, None)
    if fn is None:
        raise CorrectionError(f"{who}: this library has no {name}")
    try:
        return fn(*args)
    except error as e:
        text = str(e).replace("\n", " ") or type(e).__name__
        raise CorrectionError(f"{who}: {text}") from None


def check_action(action: object) -> str:
    """``action`` when it is a known correction, else ValueError naming it."""
    if action not in ACTIONS:
        raise ValueError(f"unknown correction action {action!r}; known: {', '.join(ACTIONS)}")
    return str(action)
