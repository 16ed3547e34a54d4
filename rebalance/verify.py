"""The verification rule: did a plan's windows run faster than the ones before it?

Pure arithmetic on measured throughputs (rebalance/README.md "Life of a plan"):
a plan is verified when the job's throughput gained ``verify_min_gain`` of what
it was, or won back ``verify_recover_frac`` of what the fault cost against the
healthy baseline (above the ``verify_noise_frac`` noise floor), and, where the
plan's prediction is known, saved at least ``verify_predicted_frac`` of the step time
it predicted: a plan is made on the premise that the slow rank's time goes with its
samples, and a fixed stall (an input wait, a stopped process) falsifies it, saving
a few per cent of a step the plan promised to cut by a third. In milliseconds a step,
not in shares: the step's communication is in the measured time and not in the
prediction, and cancels in the difference. A restore of the uniform split is verified
when it lost no more than ``verify_min_gain``.
"""

from __future__ import annotations

from .settings import PolicySettings


def verdict(
    s: PolicySettings,
    thr_before: float | None,
    thr_after: float | None,
    baseline: float | None,
    *,
    restore: bool,
    predicted_ms: float | None = None,
    batch: int | None = None,
) -> tuple[bool, str]:
    """(verified, why in words) for a plan measured at ``thr_after`` samples/s;
    ``predicted_ms``: the step time the plan predicted to save, with the job's global
    ``batch`` (samples a step) to turn the throughputs into step times."""
    if thr_after is None or thr_before is None or thr_before <= 0:
        return False, "throughput could not be measured"
    moved = (
        f"throughput {_pct(thr_before, thr_after)} ({thr_before:.1f} -> {thr_after:.1f} samples/s"
    )
    if restore:
        return thr_after >= thr_before * (1.0 - s.verify_min_gain), moved + ")"
    gain = thr_after - thr_before
    lost = None if baseline is None else baseline - thr_before
    ok = gain >= s.verify_min_gain * thr_before or (
        lost is not None
        and lost > 0
        and gain >= s.verify_recover_frac * lost
        and gain >= s.verify_noise_frac * thr_before
    )
    if lost is not None and lost > 0:
        moved += f", {100.0 * gain / lost:.0f}% of the {lost:.1f} samples/s lost"
    if predicted_ms is not None and predicted_ms > 0 and batch and thr_after > 0:
        saved_ms = 1000.0 * batch / thr_before - 1000.0 * batch / thr_after
        moved += f"; {saved_ms:.1f} ms a step saved of the {predicted_ms:.1f} ms predicted"
        if saved_ms < s.verify_predicted_frac * predicted_ms:
            ok = False
            moved += " (its time does not go with its samples: a fixed stall?)"
    return ok, moved + ")"


def _pct(a: float, b: float) -> str:
    return f"{100.0 * (b - a) / a:+.1f}%"
