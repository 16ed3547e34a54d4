"""Plan and ack files on a node (artemis.rebalance.files): the agent's publish side, the
job's client side, the one ack reader, and the outputs (plans JSONL, plan metrics)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from artemis.agent.plans import clear_plan, publish_plan, read_ack_records
from artemis.coordinator.metrics import register_plan_metrics
from artemis.job import PlanFormatError, RebalanceClient
from artemis.rebalance.files import ack_path, plan_path, read_acks, read_plan
from artemis.rebalance.outputs import PlansWriter
from artemis.rebalance.policy import PlanEvent
from e2e_expect import PLAN_KEYS

JOB = "job-7"


def acks(shm: Path, job: str = JOB) -> dict[int, tuple[str, int]]:
    """rank -> (plan id, step) of every rank's latest ack, through the one ack reader."""
    return {r: (rec["id"], rec["step"]) for r, rec in read_acks(shm, job).items()}


def _client(shm: Path, rank: int, ws: int = 4, gb: int = 32) -> RebalanceClient:
    return RebalanceClient(rank, ws, gb, job=JOB, shm_dir=shm)


def test_publish_read_round_trip(tmp_path: Path) -> None:
    path = publish_plan(tmp_path, JOB, {"id": "p1", "apply_at_step": 150, "samples": [9, 9, 6, 8]})
    assert path == tmp_path / f"{JOB}.plan.json"
    rec = read_plan(tmp_path, JOB)
    assert rec is not None
    assert rec["id"] == "p1" and rec["apply_at_step"] == 150
    assert rec["samples"] == [9, 9, 6, 8] and rec["global_batch"] == 32
    assert rec["weights"] == pytest.approx([9 * 4 / 32, 9 * 4 / 32, 6 * 4 / 32, 8 * 4 / 32])
    # no temporary file left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{JOB}.plan.json"]


@pytest.mark.parametrize(
    "plan",
    [
        {"id": "x", "apply_at_step": 10, "samples": [10, 0, 22]},  # starves rank 1
        {"id": "x", "apply_at_step": 10, "samples": [10, 10, 10], "global_batch": 32},
        {"id": "x", "apply_at_step": -1, "samples": [16, 16]},
        {"id": "", "apply_at_step": 1, "samples": [16, 16]},
    ],
)
def test_publish_refuses_bad_plans(tmp_path: Path, plan: dict) -> None:
    with pytest.raises(PlanFormatError):
        publish_plan(tmp_path, JOB, plan)
    assert not plan_path(tmp_path, JOB).exists()


def test_job_id_cannot_escape_the_folder(tmp_path: Path) -> None:
    for bad in ("../x", "a/b", "", ".."):
        with pytest.raises(ValueError):
            publish_plan(tmp_path, bad, {"id": "p", "apply_at_step": 1, "samples": [1, 1]})


def test_replace_is_atomic_for_a_concurrent_reader(tmp_path: Path) -> None:
    """A reader polling while the plan is replaced sees whole plans only, old or new."""
    publish_plan(tmp_path, JOB, {"id": "p0", "apply_at_step": 0, "samples": [64] * 64})
    path = plan_path(tmp_path, JOB)
    writes = 300
    stop = threading.Event()
    seen: list[str] = []
    bad: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            data = path.read_bytes()
            try:
                rec = json.loads(data)
            except json.JSONDecodeError:
                bad.append(data[:80].decode(errors="replace"))
                continue
            if sum(rec["samples"]) != rec["global_batch"]:
                bad.append(rec["id"])
            seen.append(rec["id"])

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(1, writes + 1):
            # large plans (64 ranks) so a non-atomic write would be caught mid-way
            samples = [64 + (i % 7) - 3 if r == 0 else 64 for r in range(64)]
            samples[1] -= samples[0] - 64
            publish_plan(tmp_path, JOB, {"id": f"p{i}", "apply_at_step": i, "samples": samples})
    finally:
        stop.set()
        t.join(timeout=10)
    assert not t.is_alive()
    assert bad == []
    assert len(seen) > 0
    assert read_plan(tmp_path, JOB)["id"] == f"p{writes}"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_client_uniform_without_plan_or_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k in ("ARTEMIS_JOB", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(k, raising=False)
    c = RebalanceClient(1, 3, 10, shm_dir=tmp_path)  # no job id: never looks for a plan
    assert c.job is None
    assert [c.split_for_step(s) for s in (0, 1000)] == [[4, 3, 3], [4, 3, 3]]
    c2 = _client(tmp_path, 2)  # a job id, but nothing published
    assert c2.samples_for_step(0) == 8 and c2.grad_weight(5) == 1.0
    # No plan: the only ack is the job's declaration of its starting (uniform) split.
    assert acks(tmp_path) == {2: ("uniform", 0)}
    assert read_ack_records(tmp_path, JOB)[2]["samples"] == 8


def test_client_switches_at_apply_step_and_acks_once(tmp_path: Path) -> None:
    clients = [_client(tmp_path, r) for r in range(4)]
    for s in range(0, 5):
        assert [c.samples_for_step(s) for c in clients] == [8, 8, 8, 8]
    publish_plan(tmp_path, JOB, {"id": "p1", "apply_at_step": 10, "samples": [9, 9, 6, 8]})
    for s in range(5, 10):
        assert [c.samples_for_step(s) for c in clients] == [8, 8, 8, 8]
    # not applied yet: only the starting split is acknowledged
    assert acks(tmp_path) == {r: ("uniform", 0) for r in range(4)}
    for s in range(10, 20):
        assert [c.samples_for_step(s) for c in clients] == [9, 9, 6, 8]
        assert sum(c.grad_weight(s) for c in clients) == pytest.approx(4.0)
    assert clients[2].grad_weight(12) == pytest.approx(6 * 4 / 32)
    assert clients[1].slice_for_step(12) == (9, 18)
    assert acks(tmp_path) == {r: ("p1", 10) for r in range(4)}
    # acked once: the file is not rewritten on later steps
    mt = ack_path(tmp_path, JOB, 0).stat().st_mtime_ns
    ino = ack_path(tmp_path, JOB, 0).stat().st_ino
    for s in range(20, 40):
        clients[0].samples_for_step(s)
    assert (
        ack_path(tmp_path, JOB, 0).stat().st_mtime_ns,
        ack_path(tmp_path, JOB, 0).stat().st_ino,
    ) == (mt, ino)
    # earlier steps keep their answer (a sampler running ahead relies on this)
    assert clients[0].samples_for_step(3) == 8
    # the agent undoes it: uniform again from step 60, acked under the new id
    clear_plan(tmp_path, JOB, plan_id="p1-rollback", apply_at_step=60, nranks=4, global_batch=32)
    assert [c.samples_for_step(59) for c in clients] == [9, 9, 6, 8]
    assert [c.samples_for_step(60) for c in clients] == [8, 8, 8, 8]
    assert acks(tmp_path) == {r: ("p1-rollback", 60) for r in range(4)}


def test_late_plan_switches_at_the_step_being_asked(tmp_path: Path) -> None:
    c = _client(tmp_path, 0)
    for s in range(30):
        c.samples_for_step(s)
    publish_plan(tmp_path, JOB, {"id": "late", "apply_at_step": 20, "samples": [5, 9, 9, 9]})
    assert c.samples_for_step(25) == 8  # already answered: never changes
    assert c.samples_for_step(30) == 5
    assert acks(tmp_path) == {0: ("late", 30)}


def test_client_ignores_plans_for_another_shape_and_bad_files(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    c = _client(tmp_path, 0)
    publish_plan(tmp_path, JOB, {"id": "other", "apply_at_step": 0, "samples": [10, 10, 12]})
    assert c.split_for_step(1) == [8, 8, 8, 8]
    plan_path(tmp_path, JOB).write_text("{not json")
    assert c.split_for_step(2) == [8, 8, 8, 8]
    assert "ignoring plan" in caplog.text
    assert acks(tmp_path) == {0: ("uniform", 0)}  # the ignored plans: no ack


def test_ack_reader_skips_what_is_not_an_ack(tmp_path: Path) -> None:
    assert read_acks(tmp_path, JOB) == {}
    publish_plan(tmp_path, JOB, {"id": "p1", "apply_at_step": 2, "samples": [7, 9]})
    a, b = _client(tmp_path, 0, 2, 16), _client(tmp_path, 1, 2, 16)
    assert acks(tmp_path) == {0: ("uniform", 0), 1: ("uniform", 0)}  # starting splits
    a.samples_for_step(2)
    b.samples_for_step(3)  # b reads the plan only at step 3: late, switches at 3
    assert acks(tmp_path) == {0: ("p1", 2), 1: ("p1", 3)}
    rec = read_acks(tmp_path, JOB)[0]
    assert rec == {
        "version": 1,
        "id": "p1",
        "rank": 0,
        "step": 2,
        "samples": 7,
        "global_batch": 16,
    }
    assert read_ack_records is read_acks  # the agent reads through the same function
    (tmp_path / f"{JOB}.plan-ack.r9.json").write_text("garbage")
    (tmp_path / f"{JOB}.plan-ack.r5.json").write_text(json.dumps({"id": "x", "rank": 4}))
    (tmp_path / f"{JOB}.plan-ack.r6.json").write_text(json.dumps({"rank": 6, "step": 1}))
    (tmp_path / f"{JOB}.plan-ack.rx.json").write_text(json.dumps({"id": "x", "rank": 0}))
    assert acks(tmp_path) == {0: ("p1", 2), 1: ("p1", 3)}  # skipped, no crash
    assert acks(tmp_path, "other-job") == {}
    clear_plan(tmp_path, JOB)  # job gone: files removed
    assert list(tmp_path.iterdir()) == []


def test_plans_writer_and_metrics(tmp_path: Path) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    ev = PlanEvent(
        id="p1",
        window=12,
        rank=2,
        finding={"kind": "rank", "state": "flagged", "rank": 2},
        speeds=[1000.0, 1000.0, 800.0, 1000.0],
        before=[8, 8, 8, 8],
        after=[9, 9, 6, 8],
        apply_at_step=750,
        status="verified",
        throughput_before=2700.0,
        throughput_after=3100.0,
        reason="recovered",
        job="job-a",
        control={"action": "plan"},
    )
    out = tmp_path / "sub" / "plans.jsonl"
    with PlansWriter(out) as w:
        w.write(ev)
        # flushed per line: visible before close
        assert len(out.read_text().splitlines()) == 1
        w.write_all([ev, ev])
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(recs) == 3
    assert set(recs[0]) >= PLAN_KEYS
    assert recs[0]["job"] == "job-a"  # added key
    assert "control" not in recs[0]
    assert sum(recs[0]["before"]) == sum(recs[0]["after"])
    reg = CollectorRegistry()
    m = register_plan_metrics(reg)
    m.add_job("job-b")
    m.observe(ev)
    text = generate_latest(reg).decode()
    assert 'straggler_plans_total{job="job-a",status="verified"} 1.0' in text
    assert 'straggler_plans_total{job="job-a",status="rolled_back"} 0.0' in text
    assert 'straggler_throughput_samples_per_second{job="job-a",phase="after"} 3100.0' in text
    assert 'straggler_plan_active{job="job-a"} 1.0' in text
    assert 'straggler_plan_active{job="job-b"} 0.0' in text
    # one job ending removes its series only
    m.forget("job-a")
    text = generate_latest(reg).decode()
    assert 'job="job-a"' not in text
    assert 'straggler_plans_total{job="job-b",status="verified"} 0.0' in text
