"""Slicing the global batch under a plan: every sample used exactly once per step, on every rank."""

from __future__ import annotations

from pathlib import Path

import pytest
from artemis.agent.plans import publish_plan
from artemis.job import RebalanceClient, RebalancedBatchSampler, UnevenBatchSplitter

WORLD, GB = 3, 12


def _clients(shm: Path) -> list[RebalanceClient]:
    return [RebalanceClient(r, WORLD, GB, job="j", shm_dir=shm) for r in range(WORLD)]


def test_sampler_tiles_each_global_batch_and_switches_together(tmp_path: Path) -> None:
    clients = _clients(tmp_path)
    samplers = [RebalancedBatchSampler(50, c, seed=3) for c in clients]
    publish_plan(tmp_path, "j", {"id": "p", "apply_at_step": 2, "samples": [2, 6, 4]})
    for epoch in range(2):
        for s in samplers:
            s.set_epoch(epoch)
        per_rank = [list(s) for s in samplers]
        gbatches = list(samplers[0].global_batches())
        assert len(gbatches) == 50 // GB == len(per_rank[0])
        for k, gb in enumerate(gbatches):
            parts = [per_rank[r][k] for r in range(WORLD)]
            assert [
                i for p in parts for i in p
            ] == gb  # the slices tile the batch, in order: used once each
            step = epoch * len(gbatches) + k
            want = [4, 4, 4] if step < 2 else [2, 6, 4]
            assert [len(p) for p in parts] == want
        # a different epoch shuffles differently, the same on every rank
    assert samplers[0].step == samplers[2].step == 8
    e0 = RebalancedBatchSampler(50, clients[0], seed=3)
    e1 = RebalancedBatchSampler(50, clients[0], seed=3)
    e1.set_epoch(1)
    assert list(e0.global_batches()) != list(e1.global_batches())


def test_splitter_cuts_tensors_and_lists(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    clients = _clients(tmp_path)
    publish_plan(tmp_path, "j", {"id": "p", "apply_at_step": 0, "samples": [5, 3, 4]})
    x = torch.arange(GB)
    labels = [f"s{i}" for i in range(GB)]
    parts = [UnevenBatchSplitter(c).split(0, x, labels) for c in clients]
    assert torch.equal(torch.cat([p[0] for p in parts]), x)
    assert [s for p in parts for s in p[1]] == labels
    assert [len(p[0]) for p in parts] == [5, 3, 4]
    with pytest.raises(ValueError):
        UnevenBatchSplitter(clients[0]).split(1, x[:-1])


def test_client_refuses_a_batch_that_would_starve_a_rank(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        RebalanceClient(0, 4, 3, job="j", shm_dir=tmp_path)
    with pytest.raises(ValueError):
        RebalanceClient(4, 4, 16, job="j", shm_dir=tmp_path)


def test_env_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("ARTEMIS_JOB", "envjob")
    monkeypatch.setenv("ARTEMIS_SHM_DIR", str(tmp_path))
    c = RebalanceClient(None, None, GB)
    assert (c.rank, c.world_size, c.job, c.shm_dir) == (2, 3, "envjob", tmp_path)
    publish_plan(tmp_path, "envjob", {"id": "p", "apply_at_step": 0, "samples": [5, 3, 4]})
    assert c.samples_for_step(0) == 4 and c.grad_weight(0) == pytest.approx(1.0)
    assert c.slice_for_step(0) == (8, 12)
