"""What scoring a window returns: `WindowResult`, and `LateResult` for late summaries."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from artemis.detect.arrays import F64, I64, OBJ
from artemis.detect.findings import Finding


@dataclass
class WindowResult:
    job: str
    window: int
    findings: list[Finding]  # every report of this window, all kinds and states
    ranks: I64  # the ranks that reported a usable summary, sorted
    pace_values: F64  # per rank of `ranks`: pace ratio (peers, else own history); NaN unknown
    island_labels: OBJ  # per rank of `ranks`: its island (str)
    step_ms: float  # median step time of the window (NaN when nobody reported)
    missing: list[int]  # ranks without a usable record in this window
    gpu_hours_lost: float  # job total so far, over every confirmed finding
    steps: list[int] = field(default_factory=list)  # [first step, one past the last]

    @property
    def pace(self) -> dict[int, float]:
        """rank -> pace ratio, for the ranks where it is known (tests, tools)."""
        ok = np.isfinite(self.pace_values)
        return {int(r): float(v) for r, v in zip(self.ranks[ok], self.pace_values[ok], strict=True)}

    @property
    def islands(self) -> dict[int, str]:
        labels = self.island_labels.tolist()
        return {int(r): str(lab) for r, lab in zip(self.ranks.tolist(), labels, strict=True)}


@dataclass
class LateResult:
    """`Detector.score_late`: what became of one window's late summaries."""

    result: WindowResult | None  # the late ranks' findings (None: nothing scored)
    scored: int = 0  # ranks scored now, against the window's own peers
    duplicate: int = 0  # ranks the window had already (scored then, or late before)
    expired: int = 0  # the window is older than LATE_WINDOWS, or kept nothing for them
    # `result` with the arrays over the late ranks and the kept peers (the incidents'
    # view of the window)
    union: WindowResult | None = None
