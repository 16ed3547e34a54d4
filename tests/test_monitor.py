"""JobMonitor, the pure per-job core: findings, plans, resizing, live settings, and a
state that survives a snapshot/restore (through msgpack bytes, as on disk) unchanged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest
from artemis.detect.monitor import JobMonitor, MonitorOutput
from artemis.detect.settings import Settings, SettingsError
from artemis.protocol.columns import WindowColumns
from artemis.protocol.records import RankProgress, RankWindow

W_STEPS = 10
GB = 640  # global batch


def window(
    w: int,
    gaps: list[float],
    *,
    samples: list[int] | None = None,
    job: str = "j",
    islands: list[str] | None = None,
) -> WindowColumns:
    recs = [
        RankWindow(
            job=job,
            comm="c0",
            rank=r,
            nranks=len(gaps),
            host=f"h{r // 4}",
            window=w,
            step_lo=w * W_STEPS,
            step_hi=(w + 1) * W_STEPS,
            coll_lo=w * W_STEPS * 2,
            coll_hi=(w + 1) * W_STEPS * 2,
            gap_ms=g,
            coll_ms=10.0 + max(gaps) - g,
            step_ms=max(gaps) + 10.0,
            collectives=2 * W_STEPS,
            bytes=0,
            lost=0,
            clock="device",
            island=None if islands is None else islands[r],
            samples=None if samples is None else samples[r],
        )
        for r, g in enumerate(gaps)
    ]
    return WindowColumns.from_records(recs)


def through_bytes(m: JobMonitor, settings: Settings) -> JobMonitor:
    """What a restarted coordinator gets: the snapshot as msgpack bytes, restored."""
    blob = msgpack.packb(m.snapshot(), use_bin_type=True)
    state = msgpack.unpackb(blob, raw=False, strict_map_key=False)
    return JobMonitor.restore(state, settings)


def lines(out: MonitorOutput) -> list[dict[str, Any]]:
    return [f.to_json() for f in out.findings]


def straggler(w: int, n: int = 8, slow: int = 2) -> WindowColumns:
    gaps = [100.0 + 0.3 * ((r * 7 + w * 3) % 5) for r in range(n)]
    if w >= 1:
        gaps[slow] *= 1.3
    return window(w, gaps)


def test_a_restored_monitor_carries_on_exactly_like_one_never_stopped() -> None:
    s = Settings()
    ref, cut = JobMonitor("j", s, nranks=8), JobMonitor("j", s, nranks=8)
    for w in range(5):
        assert lines(ref.on_window(w, straggler(w))) == lines(cut.on_window(w, straggler(w)))
    states = [f["state"] for f in lines(ref.on_window(5, straggler(5))) if f["kind"] == "rank"]
    cut.on_window(5, straggler(5))
    assert states == ["ongoing"]
    back = through_bytes(cut, s)
    for w in range(6, 12):
        a, b = lines(ref.on_window(w, straggler(w))), lines(back.on_window(w, straggler(w)))
        assert a == b
        (f,) = [f for f in b if f["kind"] == "rank"]
        # Still the finding that began at window 1: ongoing, not suspect again.
        assert (f["state"], f["since"], f["job"], f["rank"]) == ("ongoing", 1, "j", 2)
    assert back.snapshot() == ref.snapshot()
    # A window already scored (a replay) is refused, not scored twice.
    assert back.on_window(11, straggler(11)).result is None


def test_growing_rank_count_keeps_tracks_and_baselines() -> None:
    s = Settings()
    m = JobMonitor("j", s, nranks=4)
    for w in range(6):
        m.on_window(w, straggler(w, n=4, slow=1))
    assert m.detector.active() == [("rank", "1")]
    base = m.detector.snapshot()["rank_count"]
    m.expect(range(8))  # four more ranks announced
    assert m.nranks == 8 and m.detector.snapshot()["rank_count"][: len(base)] == base
    out = lines(m.on_window(6, straggler(6, n=8, slow=1)))
    (f,) = [f for f in out if f["kind"] == "rank"]
    assert (f["state"], f["since"]) == ("ongoing", 1)


def test_missing_ranks_and_hangs_carry_the_job_hosts_and_island() -> None:
    s = Settings(hang_floor_s=1.0)
    m = JobMonitor("j", s, nranks=8)
    islands = ["nvidia"] * 4 + ["amd"] * 4
    m.expect(range(4, 8), host="h1")
    m.on_window(0, window(0, [100.0] * 8, islands=islands))
    cols = window(1, [100.0] * 8, islands=islands).take(list(range(7)))
    out = lines(m.on_window(1, cols, missing=[7]))
    (f,) = [f for f in out if f["kind"] == "missing"]
    assert (f["state"], f["ranks"], f["hosts"], f["job"], f["since"]) == (
        "flagged",
        [7],
        ["h1"],
        "j",
        1,
    )
    back = lines(m.on_window(2, window(2, [100.0] * 8, islands=islands)))
    assert [(f["kind"], f["state"], f["since"]) for f in back] == [("missing", "cleared", 1)]
    # Rank 6 (island amd) stops arriving; the others have waited 5 s in collective 50.
    m.on_progress(
        [
            RankProgress("j", "c0", r, "h", 49, None, 0.0, 5.0)
            if r == 6
            else RankProgress("j", "c0", r, "h", 49, 50, 5.0, 0.0)
            for r in range(8)
        ]
    )
    first = m.tick(100.0)
    assert [c.action for c in first.controls] == ["dump"] and not first.findings
    m.on_dump(6, "/d/6.jsonl")
    done = m.tick(100.0 + s.hang_floor_s + 10)
    (h,) = [f.to_json() for f in done.findings]
    assert (h["kind"], h["ranks"], h["island"], h["job"]) == ("hang", [6], "amd", "j")
    assert h["evidence"]["dumps"] == ["/d/6.jsonl"] and h["steps"] == [25, 26]


# ---------------------------------------------------------------- rebalancing


class Job:
    """A job that follows the monitor's plans: rank `slow` computes 30% slower per sample,
    a rank's gap is its samples x its time per sample."""

    def __init__(self, n: int = 8, slow: int = 2) -> None:
        self.n, self.slow = n, slow
        self.split = [GB // n] * n
        self.pending: tuple[int, list[int]] | None = None  # (apply_at_step, samples)

    def window(self, w: int) -> WindowColumns:
        if self.pending is not None and w * W_STEPS >= self.pending[0]:
            self.split = self.pending[1]
            self.pending = None
        per = [1.25 * (1.3 if r == self.slow and w >= 1 else 1.0) for r in range(self.n)]
        gaps = [self.split[r] * per[r] for r in range(self.n)]
        return window(w, gaps, samples=self.split)

    def follow(self, m: JobMonitor, out: MonitorOutput) -> list[Any]:
        """Publish plans to the job and acknowledge them as every rank would."""
        events = list(out.plans)
        for c in out.controls:
            if c.action == "plan":
                plan = c.body["plan"]
                self.pending = (plan["apply_at_step"], plan["samples"])
                for r in range(self.n):
                    events += m.on_ack(plan["id"], r, plan["apply_at_step"]).plans
        return events


def run_plans(
    m: JobMonitor, job: Job, windows: range, on: Callable[[int, JobMonitor], JobMonitor]
) -> tuple[JobMonitor, list[Any]]:
    events: list[Any] = []
    for w in windows:
        m = on(w, m)
        events += job.follow(m, m.on_window(w, job.window(w)))
    return m, events


def test_an_applied_plan_survives_a_restore_and_is_still_verified() -> None:
    s = Settings(rebalance="apply")

    def plain(w: int, m: JobMonitor) -> JobMonitor:
        return m

    _, ref_events = run_plans(JobMonitor("j", s, nranks=8), Job(), range(30), plain)
    assert [e.status for e in ref_events][:3] == ["recommended", "applied", "verified"]
    applied_at = next(e.window for e in ref_events if e.status == "applied")
    verified_at = next(e.window for e in ref_events if e.status == "verified")
    assert verified_at > applied_at + 1

    def restart_once(w: int, m: JobMonitor) -> JobMonitor:
        # Restart after the plan was applied, before it was verified.
        return through_bytes(m, s) if w == applied_at + 1 else m

    back, events = run_plans(JobMonitor("j", s, nranks=8), Job(), range(30), restart_once)
    assert [e.to_dict() for e in events] == [e.to_dict() for e in ref_events]
    # ...and the verified plan is the one in force: the job runs on its split.
    verified = next(e for e in events if e.status == "verified")
    assert back.policy is not None and back.policy.active_plan is not None
    assert back.policy.active_plan.id == verified.id
    assert back.policy.split == verified.after != [GB // 8] * 8


def test_live_max_shift_frac_reaches_the_next_plan_and_bad_values_are_refused() -> None:
    s = Settings(rebalance="apply")
    m = JobMonitor("j", s, nranks=8)
    job = Job()
    m.on_window(0, job.window(0))
    tight = s.set("max_shift_frac", "0.1")
    m.update_settings(tight)
    assert m.policy is not None and m.policy.settings.max_shift_frac == 0.1
    events: list[Any] = []
    for w in range(1, 12):
        events += job.follow(m, m.on_window(w, job.window(w)))
    plan = next(e for e in events if e.status == "recommended")
    uniform = GB // 8
    # Without the change the slow rank would lose 25% of its samples; now at most 10%.
    assert min(plan.after) >= uniform * 0.9 and plan.after[2] < uniform
    with pytest.raises(SettingsError, match=r"max_shift_frac.*\[0, 1\)"):
        s.set("max_shift_frac", "1.0")
    with pytest.raises(SettingsError, match="max_shift_frac"):
        Settings(max_shift_frac=1.0)
    with pytest.raises(SettingsError, match="min_samples"):
        s.set("min_samples", "0")
    assert np.isclose(Settings.from_mapping({"max_shift_frac": 0.5}).max_shift_frac, 0.5)


@pytest.mark.parametrize("value", [-0.1, 0.0, 0.25, 0.99, 1.0, 1.5, float("nan")])
def test_settings_and_the_policy_accept_the_same_max_shift_frac(value: float) -> None:
    from artemis.detect.monitor import PolicySettings

    def refused(make: Callable[[], object]) -> bool:
        try:
            make()
        except ValueError:  # SettingsError is a ValueError
            return True
        return False

    assert refused(lambda: Settings(max_shift_frac=value)) == refused(
        lambda: PolicySettings(max_shift_frac=value)
    )
    assert refused(lambda: Settings().set("max_shift_frac", str(value))) == refused(
        lambda: PolicySettings(max_shift_frac=value)
    )
