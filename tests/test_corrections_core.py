"""The pure corrections core (rebalance/corrections.py): what fits, who decides, the limits."""

from __future__ import annotations

from typing import Any

import pytest
from artemis.rebalance.corrections import (
    CorrectionBook,
    CorrectionError,
    CorrectionPolicy,
    RankFacts,
    fit,
)

APPLY = CorrectionPolicy(mode="apply", min_interval_s=600.0, approval_expiry_s=60.0)
V12 = (1, 2)


def rec(
    iid: str = "job-r2-w5",
    rank: int = 2,
    cause: str = "clocks",
    confirmed: bool = True,
    status: str = "open",
    why: str | None = None,
    throttle: dict[str, bool] | None = None,
) -> dict[str, Any]:
    return {
        "id": iid,
        "kind": "rank",
        "rank": rank,
        "status": status,
        "confirmed": {"window": 5} if confirmed else None,
        "closed": None if why is None else {"why": why},
        "cause": {"kind": cause, "evidence": {"throttle": throttle or {}}},
    }


def rows(iid: str, thr: float, pace: float) -> list[dict[str, Any]]:
    return [
        {"row": "job", "samples_per_s": thr},
        {"row": "subject", "incident": iid, "ratio": pace},
    ]


def facts(host: str = "h0", gpu: int = 2, version: tuple[int, int] | None = V12) -> RankFacts:
    return RankFacts(host=host, gpu=gpu, version=version)


def feed(b: CorrectionBook, w: int, r: dict[str, Any], thr: float, pace: float, **kw: Any) -> Any:
    pol = kw.pop("policy", APPLY)
    f = kw.pop("facts", {r["rank"]: facts()})
    return b.on_window(w, [r], rows(r["id"], thr, pace), f, pol, kw.pop("wall", 1000.0 + w))


def test_fit_clocks_power_thermal() -> None:
    assert fit(rec(cause="clocks"))[0] == "reset_clocks"
    assert fit(rec(cause="clocks", throttle={"hw_slowdown": True}))[0] is None
    assert fit(rec(cause="thermal"))[0] is None
    lowered = RankFacts(power_limit_w=200.0, power_limit_default_w=300.0)
    at_default = RankFacts(power_limit_w=300.0, power_limit_default_w=300.0)
    assert fit(rec(cause="power"), lowered)[0] == "restore_power_limit"
    action, why = fit(rec(cause="power"), at_default)
    assert action is None and "default" in why
    assert fit(rec(cause="power"), RankFacts(power_limit_w=200.0))[0] is None
    assert fit(rec(confirmed=False))[0] is None


def test_only_confirmed_and_never_thermal() -> None:
    b = CorrectionBook("job")
    assert not feed(b, 5, rec(confirmed=False), 100, 1.3).controls
    assert not feed(b, 6, rec(cause="thermal"), 100, 1.3).controls
    assert b.corrections == []
    out = feed(b, 7, rec(), 100, 1.3)
    assert [body["op"] for _, body in out.controls] == ["apply"]
    assert out.controls[0][1]["action"] == "reset_clocks"


def test_recommend_mode_records_and_runs_nothing() -> None:
    b = CorrectionBook("job")
    out = feed(b, 5, rec(), 100, 1.3, policy=CorrectionPolicy())
    assert not out.controls
    ((_iid, entry),) = out.entries
    assert entry["status"] == "recommended" and entry["type"] == "correction"
    assert "recommend" in entry["reason"]
    # one entry per incident: the next window adds nothing
    assert not feed(b, 6, rec(), 100, 1.3, policy=CorrectionPolicy()).entries


def test_old_agent_gets_no_correction_and_the_entry_says_why() -> None:
    b = CorrectionBook("job")
    out = feed(b, 5, rec(), 100, 1.3, facts={2: facts(version=(1, 1))})
    assert not out.controls
    assert "agent speaks protocol 1.1; corrections need 1.2" in out.entries[0][1]["reason"]


def test_verified_after_the_pace_recovers() -> None:
    b = CorrectionBook("job")
    for w in range(3):
        feed(b, w, rec(confirmed=False), 100, 1.3)
    out = feed(b, 3, rec(), 100, 1.3)
    cid = out.controls[0][1]["id"]
    # one correction at a time: while it is in flight nothing else is decided
    assert not feed(b, 4, rec(), 100, 1.3).controls
    res = b.on_ack({"id": cid, "status": "applied", "before": {"sm_mhz": 900}}, 1010.0)
    assert res.entries[-1][1]["status"] == "applied"
    for w in range(5, 9):  # window 5 was in flight at the ack: not measured
        out = feed(b, w, rec(), 110, 1.0)
    st = b.get(cid)
    assert st.status == "verified", st.reason
    assert st.gain_pct == pytest.approx(10.0)
    assert [h["status"] for h in st.history] == ["approved", "applied", "verified"]


def test_rolled_back_when_it_did_not_help_then_nothing_more() -> None:
    b = CorrectionBook("job")
    out = feed(b, 3, rec(), 100, 1.3)
    cid = out.controls[0][1]["id"]
    b.on_ack({"id": cid, "status": "applied", "before": {"sm_mhz": 900}}, 1010.0)
    for w in range(4, 8):  # window 4 was in flight at the ack: not measured
        out = feed(b, w, rec(), 100, 1.3)
    assert len(out.controls) == 1 and out.controls[0][0] == 2
    body = out.controls[0][1]
    assert body["op"] == "rollback" and body["before"] == {"sm_mhz": 900}
    b.on_ack({"id": cid, "status": "rolled_back", "after": {"sm_mhz": 900}}, 1020.0)
    assert b.get(cid).status == "rolled_back"
    assert "did not help" in b.get(cid).reason
    # left to rebalancing and escalation: no second automatic correction
    assert not feed(b, 8, rec(), 100, 1.3).controls


def test_failed_is_final_with_the_library_error() -> None:
    b = CorrectionBook("job")
    cid = feed(b, 3, rec(), 100, 1.3).controls[0][1]["id"]
    err = "NVML_ERROR_NO_PERMISSION: Insufficient Permissions"
    b.on_ack({"id": cid, "status": "failed", "error": err}, 1010.0)
    assert b.get(cid).status == "failed" and err in b.get(cid).reason
    # a resent ack changes nothing
    assert not b.on_ack({"id": cid, "status": "applied"}, 1011.0).entries
    assert not feed(b, 4, rec(), 100, 1.3).controls


def test_rate_limits_per_gpu_and_per_job() -> None:
    # (the corrections stay unanswered here: no ack timeout within the test's 300 s)
    pol = CorrectionPolicy(mode="apply", min_interval_s=600.0, max_gpus_per_job=2, ack_timeout_s=0)
    b = CorrectionBook("job")
    first = b.on_window(1, [rec("a", rank=0)], [], {0: facts(gpu=0)}, pol, 1000.0)
    assert first.controls
    # the same GPU again within the interval (a new incident of it): only recommended
    again = b.on_window(2, [rec("b", rank=0)], [], {0: facts(gpu=0)}, pol, 1100.0)
    assert not again.controls and "rate limit" in again.entries[0][1]["reason"]
    assert b.on_window(3, [rec("c", rank=1)], [], {1: facts(gpu=1)}, pol, 1200.0).controls
    third = b.on_window(4, [rec("d", rank=3)], [], {3: facts(gpu=3)}, pol, 1300.0)
    assert not third.controls and "corrections_max_gpus_per_job 2" in third.entries[0][1]["reason"]
    # past the interval the first GPU may be corrected again
    later = b.on_window(5, [rec("e", rank=0)], [], {0: facts(gpu=0)}, pol, 1700.0)
    assert later.controls


def test_approval_approve_deny_expire() -> None:
    pol = CorrectionPolicy(mode="apply", approve=("reset_clocks",), approval_expiry_s=60.0)
    b = CorrectionBook("job")
    out = b.on_window(1, [rec("a", rank=0)], [], {0: facts(gpu=0)}, pol, 1000.0)
    assert not out.controls and out.entries[0][1]["status"] == "awaiting_approval"
    a = out.entries[0][1]["id"]
    assert [p["id"] for p in b.pending()] == [a]
    assert b.approve(a, 1030.0).controls[0][1]["op"] == "apply"
    with pytest.raises(CorrectionError, match="not awaiting approval"):
        b.deny(a, 1031.0)
    c = b.on_window(2, [rec("c", rank=1)], [], {1: facts(gpu=1)}, pol, 1040.0).entries[0][1]["id"]
    assert not b.deny(c, 1041.0).controls and b.get(c).status == "denied"
    d = b.on_window(3, [rec("d", rank=3)], [], {3: facts(gpu=3)}, pol, 1050.0).entries[0][1]["id"]
    assert b.expire(1200.0).entries[0][1]["status"] == "expired"
    with pytest.raises(CorrectionError, match="expired"):
        b.approve(d, 1201.0)
    with pytest.raises(CorrectionError, match="unknown correction id"):
        b.approve("c-nope-1", 1201.0)


def test_forced_bypasses_the_fit_and_checks_its_input() -> None:
    b = CorrectionBook("job")
    feed(b, 1, rec(cause="thermal"), 100, 1.3)
    with pytest.raises(CorrectionError, match="unknown correction action"):
        b.force("job-r2-w5", "reboot", facts(), 1000.0)
    with pytest.raises(CorrectionError, match="no open incident"):
        b.force("nope", "reset_clocks", facts(), 1000.0)
    with pytest.raises(CorrectionError, match=r"protocol 1\.1"):
        b.force("job-r2-w5", "reset_clocks", facts(version=(1, 1)), 1000.0)
    c, out = b.force("job-r2-w5", "reset_clocks", facts(), 1000.0)
    assert c.forced and out.controls[0][1]["op"] == "apply"
    with pytest.raises(CorrectionError, match="one at a time"):
        b.force("job-r2-w5", "restore_power_limit", facts(), 1001.0)


def test_snapshot_round_trip_mid_correction() -> None:
    b = CorrectionBook("job")
    cid = feed(b, 3, rec(), 100, 1.3).controls[0][1]["id"]
    # saved with the apply unacknowledged: restored, it is resent, not forgotten
    r = CorrectionBook.restore(b.snapshot())
    assert r.unacked() == b.unacked() and r.unacked()[0][1]["id"] == cid
    r.on_ack({"id": cid, "status": "applied", "before": {"sm_mhz": 900}}, 1010.0)
    r2 = CorrectionBook.restore(r.snapshot())
    assert r2.unacked() == [] and r2.get(cid).status == "applied"
    for w in range(4, 8):
        feed(r2, w, rec(), 110, 1.0)
    assert r2.get(cid).status == "verified"
    # the rate limit survives too
    again = feed(r2, 8, rec("job-r2-w8"), 110, 1.3)
    assert not again.controls and "rate limit" in again.entries[0][1]["reason"]


def test_closed_incident_verifies_an_applied_correction_once() -> None:
    b = CorrectionBook("job")
    cid = feed(b, 3, rec(), 100, 1.3).controls[0][1]["id"]
    b.on_ack({"id": cid, "status": "applied"}, 1010.0)
    out = feed(b, 4, rec(status="closed", why="cleared"), 110, 1.0)
    assert [e["status"] for _, e in out.entries] == ["verified"]
    assert not feed(b, 5, rec(status="closed", why="cleared"), 110, 1.0).entries


def test_off_decides_nothing_but_follows_what_is_in_flight() -> None:
    b = CorrectionBook("job")
    off = CorrectionPolicy(mode="off")
    assert not feed(b, 1, rec(), 100, 1.3, policy=off).entries
    cid = feed(b, 2, rec(), 100, 1.3).controls[0][1]["id"]  # sent while it was apply
    b.on_ack({"id": cid, "status": "applied"}, 1005.0)
    assert b.busy
    for w in range(3, 7):
        feed(b, w, rec(), 110, 1.0, policy=off)
    assert b.get(cid).status == "verified" and not b.busy


def test_node_consent_off_is_a_failure_that_says_why() -> None:
    b = CorrectionBook("job")
    cid = feed(b, 3, rec(), 100, 1.3).controls[0][1]["id"]
    why = "corrections are off on this node ([policy] allow_corrections = false)"
    b.on_ack({"id": cid, "status": "refused", "error": why}, 1010.0)
    c = b.get(cid)
    assert c.status == "failed" and why in c.reason and "refused" in c.reason


def test_a_state_of_another_version_is_refused_by_name() -> None:
    b = CorrectionBook("job")
    feed(b, 3, rec(), 100, 1.3)
    st = b.snapshot()
    with pytest.raises(ValueError, match="corrections state version 9"):
        CorrectionBook.restore({**st, "version": 9})
    with pytest.raises(ValueError, match="seq"):
        CorrectionBook.restore({**st, "seq": "three"})


# ------------------------------------------------------------------ corrections and plans


def slow(pol: Any, lo: int, hi: int) -> list[Any]:
    """Windows lo..hi-1 of a 4-rank job whose rank 1 computes 30% slower, flagged."""
    from artemis.rebalance.policy import PlanEvent

    evs: list[PlanEvent] = []
    for w in range(lo, hi):
        flag = [("rank", "ongoing", 1)]
        evs += pol.on_window(w, flag, [100.0, 130.0, 100.0, 100.0], 140.0, [8, 8, 8, 8])
    return evs


def test_rebalancing_waits_while_a_correction_is_on_its_way() -> None:
    """A plan while a correction is being verified would change the throughput that
    verification measures: held back, also across a restart of the policy."""
    from artemis.rebalance.policy import PolicySettings, RebalancePolicy

    pol = RebalancePolicy(PolicySettings(mode="apply"), 4, 32, job="job")
    b = CorrectionBook("job")
    feed(b, 0, rec(rank=1), 100, 1.3, facts={1: facts()})  # the correction goes out
    assert b.in_flight() is not None
    pol.hold(b.in_flight())
    assert slow(pol, 0, 8) == []
    again = RebalancePolicy.restore(pol.snapshot())  # a coordinator restart keeps the hold
    assert slow(again, 8, 12) == []
    (cid,) = [c.id for c in b.corrections]
    b.on_ack({"id": cid, "status": "failed", "error": "NVML_ERROR_NO_PERMISSION"}, 1100.0)
    assert b.in_flight() is None  # failed: the incident is left to rebalancing
    again.hold(b.in_flight())
    evs = slow(again, 12, 16)
    assert evs and evs[0].rank == 1 and evs[0].control is not None


def test_a_correction_waits_while_a_plan_is_being_verified() -> None:
    b = CorrectionBook("job")
    out = b.on_window(5, [rec()], rows("job-r2-w5", 100, 1.3), {2: facts()}, APPLY, 1005.0,
                      "plan p1-w4-r2 applied")  # fmt: skip
    assert out.controls == [] and out.entries == [] and b.corrections == []
    out = feed(b, 6, rec(), 100, 1.3)  # the plan verified (or rolled back): now it goes
    assert [body["op"] for _, body in out.controls] == ["apply"]


def test_the_pace_before_is_taken_before_the_correction_went_out() -> None:
    """The GPU changes when the agent applies it, not when its ack comes in: an ack that
    comes late (the agent restarting) must not measure "before" on corrected windows."""
    b = CorrectionBook("job")
    for w in range(3, 6):
        feed(b, w, rec(), 100, 1.3)  # slow: the correction goes out at window 3
    (c,) = b.corrections
    for w in range(6, 10):
        feed(b, w, rec(), 130, 1.0)  # fixed already, its ack still on its way
    b.on_ack({"id": c.id, "status": "applied", "before": {"sm_mhz": 1200}}, 1010.0)
    for w in range(10, 15):
        feed(b, w, rec(), 130, 1.0)
    assert c.status == "verified", (c.status, c.reason)
    assert c.gain_pct == 30.0


def test_an_ack_after_the_incident_cleared_verifies_and_rewrites_its_record() -> None:
    """The finding cleared while the correction was on its way (its agent restarting):
    the late apply ack verifies it, the incident's last record is written again with
    the entry, and nothing stays in flight (rebalancing is not held for ever)."""
    b = CorrectionBook("job")
    feed(b, 5, rec(), 100, 1.3)
    (c,) = b.corrections
    closed = {**rec(status="closed", why="cleared"), "actions": [], "verdict": "recovered",
              "reason": "cleared at window 7"}  # fmt: skip
    assert feed(b, 7, closed, 130, 1.0).records == []
    assert c.status == "approved" and b.in_flight() is not None
    out = b.on_ack({"id": c.id, "status": "applied", "before": {"sm_mhz": 1200}}, 1010.0)
    assert c.status == "verified" and b.in_flight() is None, c.reason
    (again,) = out.records
    assert again["id"] == "job-r2-w5" and again["change"] == "action"
    assert [a["status"] for a in again["actions"]] == ["verified"]
    assert again["reason"] == f"cleared at window 7, after correction reset_clocks ({c.id})"
    restored = CorrectionBook.restore(b.snapshot())  # nothing left to rewrite
    assert all(x.closed is None for x in restored.corrections)


def test_an_incident_gone_without_a_record_hands_its_correction_on() -> None:
    """A coordinator stopped gracefully closed the incident (job_end) without the book
    seeing it, and reopened the episode under a new id: the applied correction goes on
    with the new incident of its rank; with none, it holds nothing back any more."""
    b = CorrectionBook("job")
    feed(b, 5, rec(), 100, 1.3)
    (c,) = b.corrections
    b.on_ack({"id": c.id, "status": "applied", "before": {"sm_mhz": 1200}}, 1006.0)
    saved = b.snapshot()
    heir = CorrectionBook.restore(saved)  # the restart; rank 2's episode goes on
    out = feed(heir, 9, rec(iid="job-r2-w9"), 100, 1.3)
    (moved,) = heir.corrections
    assert moved.incident == "job-r2-w9" and [i for i, _ in out.entries] == ["job-r2-w9"]
    assert heir.in_flight() is not None and not heir.knows_incident("job-r2-w5")
    for w in range(10, 15):  # still slow: rolled back, once, on the new incident
        out = feed(heir, w, rec(iid="job-r2-w9"), 100, 1.3)
        assert [body["op"] for _, body in out.controls] in ([], ["rollback"])
    assert [body["op"] for _, body in heir.unacked()] == ["rollback"]
    alone = CorrectionBook.restore(saved)  # the restart; only another rank is slow now
    feed(alone, 9, rec(iid="job-r3-w9", rank=3), 100, 1.3, facts={3: facts(gpu=3)})
    assert c.id not in (alone.in_flight() or "") and not alone.knows_incident("job-r2-w5")


def test_an_apply_never_answered_fails_and_releases_the_hold() -> None:
    """The agent never answers: after ack_timeout_s the correction fails naming the
    host and the wait, rebalancing may go on, and a rollback goes out in case the
    apply ran and only its ack was lost."""
    pol = CorrectionPolicy(mode="apply", ack_timeout_s=120.0)
    b = CorrectionBook("job")
    cid = feed(b, 3, rec(), 100, 1.3, policy=pol, wall=1000.0).controls[0][1]["id"]
    out = feed(b, 4, rec(), 100, 1.3, policy=pol, wall=1119.0)
    assert b.get(cid).status == "approved" and b.in_flight() is not None  # not yet
    out = b.expire(1120.0, policy=pol)  # the shell's tick, between windows
    c = b.get(cid)
    assert c.status == "failed" and c.timed_out
    assert "no answer from the agent on h0 within 120 s" in c.reason
    assert b.in_flight() is None and not b.busy
    assert [(r, body["op"], body["id"]) for r, body in out.controls] == [(2, "rollback", cid)]
    assert b.unacked() == [(2, c.control("rollback"))]  # resent until its agent answers
    assert out.entries[-1][1]["status"] == "failed"
    # left to rebalancing, then escalation: no second automatic correction
    assert not feed(b, 5, rec(), 100, 1.3, policy=pol, wall=1130.0).controls
    # the agent answers the rollback (it never applied: nothing to restore)
    b.on_ack({"id": cid, "status": "failed", "error": "no state before"}, 1140.0, "rollback")
    assert b.unacked() == [] and b.get(cid).status == "failed"


def test_a_late_applied_ack_is_recorded_and_rolled_back_never_revived() -> None:
    pol = CorrectionPolicy(mode="apply", ack_timeout_s=60.0)
    b = CorrectionBook("job")
    cid = feed(b, 3, rec(), 100, 1.3, policy=pol, wall=1000.0).controls[0][1]["id"]
    feed(b, 4, rec(), 100, 1.3, policy=pol, wall=1070.0)
    assert b.get(cid).status == "failed"
    res = b.on_ack({"id": cid, "status": "applied", "before": {"sm_mhz": 900}}, 1080.0, "apply")
    c = b.get(cid)
    assert c.status == "failed" and b.in_flight() is None  # not revived
    assert (
        c.history[-1]["late"] == "apply"
        and "applied after the timeout" in (c.history[-1]["detail"])
    )
    assert c.history[-1]["status"] == "failed"
    # the GPU must not stay changed unverified: the rollback with the state before
    assert [(r, body["op"], body["before"]) for r, body in res.controls] == [
        (2, "rollback", {"sm_mhz": 900})
    ]
    # a second copy of the late ack (a resent apply's echo) changes nothing
    assert not b.on_ack({"id": cid, "status": "applied"}, 1081.0, "apply").entries
    # windows go on: it is never verified, whatever the pace does
    for w in range(5, 10):
        feed(b, w, rec(), 110, 1.0, policy=pol, wall=1090.0 + w)
    assert b.get(cid).status == "failed"
    done = b.on_ack({"id": cid, "status": "rolled_back", "after": {"sm_mhz": 900}}, 1200.0)
    assert done.entries and b.unacked() == [] and b.get(cid).status == "failed"
    assert b.get(cid).history[-1]["detail"] == "late answer to rollback: rolled_back"
    # the timed-out state survives a restart of the coordinator
    r = CorrectionBook.restore(b.snapshot())
    assert r.get(cid).timed_out and r.get(cid).status == "failed"


def test_a_rollback_never_answered_releases_the_hold_and_is_still_resent() -> None:
    pol = CorrectionPolicy(mode="apply", ack_timeout_s=60.0)
    b = CorrectionBook("job")
    cid = feed(b, 3, rec(), 100, 1.3, policy=pol, wall=1000.0).controls[0][1]["id"]
    b.on_ack({"id": cid, "status": "applied", "before": {"sm_mhz": 900}}, 1001.0)
    for w in range(4, 8):  # no gain: the rollback goes out at window 7
        feed(b, w, rec(), 100, 1.3, policy=pol, wall=1000.0 + w)
    assert b.get(cid).pending == "rollback" and b.in_flight() is not None
    b.expire(1068.0, policy=pol)
    c = b.get(cid)
    assert c.status == "failed" and c.reason.startswith("rollback: no answer from the agent on h0")
    assert b.in_flight() is None and b.unacked()[0][1]["op"] == "rollback"


def test_an_ack_timeout_of_0_waits_forever() -> None:
    pol = CorrectionPolicy(mode="apply", ack_timeout_s=0.0)
    b = CorrectionBook("job")
    cid = feed(b, 3, rec(), 100, 1.3, policy=pol, wall=1000.0).controls[0][1]["id"]
    b.expire(1e9, policy=pol)
    assert b.get(cid).status == "approved" and b.in_flight() is not None


def test_the_ack_timeout_is_a_live_detector_key() -> None:
    from artemis.detect.settings import Settings, SettingsError

    s = Settings().set("correction_ack_timeout_s", "45")  # as `artemis-coordinator set` does
    assert CorrectionPolicy.from_settings(s).ack_timeout_s == 45.0
    assert CorrectionPolicy.from_settings(Settings()).ack_timeout_s == 300.0
    with pytest.raises(SettingsError, match="correction_ack_timeout_s"):
        Settings().set("correction_ack_timeout_s", "-1")
