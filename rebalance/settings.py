"""The policy's knobs and their bounds, each bound stated once on its field's type.

The bounds are ``msgspec.Meta`` annotations (artemis.common.bounds), as the wire's
records state theirs. ``BOUNDS`` is read from them: the coordinator's ``Settings``
(artemis.detect.settings) checks its copies of max_shift_frac, min_samples and
min_plan_interval_windows with these same types, so both refuse the same values
with the same words.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from artemis.common.bounds import FLOAT_MAX, Bound, bounds_of
from msgspec import Meta

Mode = Literal["off", "recommend", "apply"]
MODES: tuple[str, ...] = get_args(Mode)
# The corrections the node agent knows how to apply and undo (docs/DESIGN.md "Corrections").
CorrectionAction = Literal["reset_clocks", "restore_power_limit"]
CORRECTION_ACTIONS: tuple[CorrectionAction, ...] = get_args(CorrectionAction)

# max_shift_frac < 1: at 1 a rank's share could fall to zero.
ShiftFrac = Annotated[float, Meta(ge=0, lt=1)]
AtLeast1 = Annotated[int, Meta(ge=1)]
AtLeast0 = Annotated[int, Meta(ge=0)]
Share = Annotated[float, Meta(ge=0, le=FLOAT_MAX)]
Tolerance = Annotated[float, Meta(ge=0, lt=1)]


@dataclass(frozen=True, slots=True)
class PolicySettings:
    """Knobs of the policy; the coordinator builds this from its ``Settings``."""

    mode: str = "off"  # off | recommend | apply
    max_shift_frac: ShiftFrac = 0.25  # a rank may lose or gain at most this fraction of uniform
    min_samples: AtLeast1 = 1  # no rank gets fewer samples per step than this
    min_plan_interval_windows: AtLeast0 = 4  # windows between two changes of plan
    window_steps: AtLeast1 = 50  # steps per window, to place apply_at_step when not told
    trigger_windows: AtLeast1 = 3  # a finding on the same rank this many windows in a row
    speed_windows: AtLeast1 = 4  # windows over which per-sample speed is measured
    lead_windows: AtLeast0 = 2  # apply_at_step lies this many windows past the current one
    ack_timeout_windows: AtLeast0 = 3  # windows after apply_at_step to wait for every ack
    verify_windows: AtLeast1 = 3  # whole windows after the switch that verification measures
    min_expected_gain: Share = 0.02  # a plan must promise this much faster steps to be made
    verify_min_gain: Share = 0.02  # relative throughput gain that counts as recovered
    verify_recover_frac: Share = 0.5  # ... or this fraction of the throughput lost to the fault
    verify_noise_frac: Share = 0.005  # ... provided the gain is above this noise floor
    # ... and it saved at least this share of the step time the plan predicted (README
    # "Verified / rolled back": a plan made for time per sample that meets a fixed stall)
    verify_predicted_frac: Share = 0.25
    recovered_tolerance: Tolerance = 0.05  # slow rank within this of its peers' speed = recovered
    baseline_windows: AtLeast1 = 8  # healthy windows whose median throughput is the baseline
    rollback_backoff_windows: AtLeast0 = 16  # no new plan for a rank this long after a failed one
    id_prefix: str = ""  # lets a restarted coordinator mint ids the job has not seen

    @classmethod
    def from_settings(cls, settings: Any, **overrides: Any) -> PolicySettings:
        """Build from the coordinator's ``Settings`` (fields rebalance, max_shift_frac,
        min_samples, min_plan_interval_windows); ``overrides`` set any other knob."""
        base: dict[str, Any] = {
            "mode": settings.rebalance,
            "max_shift_frac": settings.max_shift_frac,
            "min_samples": settings.min_samples,
            "min_plan_interval_windows": settings.min_plan_interval_windows,
        }
        base.update(overrides)
        return cls(**base)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError naming the first knob outside its bound (or an unknown mode)."""
        if self.mode not in MODES:
            raise ValueError(f"rebalance mode must be one of {MODES}, got {self.mode!r}")
        for name, bound in BOUNDS.items():
            value = getattr(self, name)
            problem = bound.problem(value)
            if problem:
                raise ValueError(f"{name}={value!r} is not allowed: expected {problem}")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# Read from the annotations above: the one statement of the policy's bounds.
BOUNDS: dict[str, Bound] = bounds_of(PolicySettings)


def bound_problem(name: str, value: Any) -> str:
    """ "" when ``value`` is allowed for knob ``name``, else what is allowed."""
    return BOUNDS[name].problem(value)
