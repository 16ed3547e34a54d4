"""Mixed islands in one real job: ``ARTEMIS_ISLANDS`` on real gloo (4 CPU processes, spawned).

With ``ARTEMIS_ISLANDS=nvidia,nvidia,amd,amd`` the ``artemis`` backend composes an
all_reduce by island (reduce inside each island, exchange between the island
leaders over a bridge group, broadcast back) and passes the other collectives
through to the job-wide gloo group. One spawn checks, on every rank:

* every collective gives the plain gloo group's result (exactly, on values whose
  sums are exact in any order), including MAX and an async all_reduce's future;
* 20 steps of DDP through the islands agree with the same DDP on plain gloo within
  float tolerance (the summation order changes, so not bit for bit), and the
  control (a different learning rate) does not; 20 steps of FSDP (its all_gather
  and reduce_scatter passed through) equal gloo's bit for bit;

then the parent reads the rings with the agent's reader: one island ring per rank
(its island's communicator: rank and size inside the island, the global rank in the
header), a bridge ring (``comm_name`` "bridge") on each island leader only, each
bridge record inside the island Broadcast whose coll_seq it carries, and each
rank's island published as its vendor in the per-rank telemetry file the agent's
``simulated`` source reads (docs/DESIGN.md, "Islands").
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch_rank as tr  # noqa: E402
from artemis.agent.telemetry.base import RankTarget  # noqa: E402
from artemis.agent.telemetry.simulated import SimulatedSource  # noqa: E402
from artemis.ring import format as rf  # noqa: E402
from artemis.ring.reader import RingReader  # noqa: E402
from torch_exit import exit_when_done  # noqa: E402
from torch_workers import spawn_and_join, train_on_group  # noqa: E402

WORLD = 4
ISLANDS = ["nvidia", "nvidia", "amd", "amd"]
STEPS = 20
JOIN_TIMEOUT_S = 200.0
JOB = "isl"


def _collectives(dist: Any, rank: int, g: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    t = torch.arange(4.0, dtype=torch.float64) * (rank + 1) + 0.5  # sums exact in any order
    out["all_reduce"] = tr.all_reduced(dist, t, g)
    out["all_reduce_max"] = tr.all_reduced(dist, t, g, op=dist.ReduceOp.MAX)
    a = torch.tensor([rank + 2], dtype=torch.int64)
    out["all_reduce_prod_int"] = tr.all_reduced(dist, a, g, op=dist.ReduceOp.PRODUCT)
    out["all_gather"] = tr.all_gathered(dist, t, g, WORLD)
    r = torch.zeros(1, dtype=torch.float64)
    dist.reduce_scatter_tensor(r, t, group=g)
    out["reduce_scatter_tensor"] = r.tolist()
    b = t.clone()
    dist.broadcast(b, src=3, group=g)
    out["broadcast"] = b.tolist()
    dist.barrier(group=g)
    out["future"] = tr.all_reduce_future(dist, t, g)
    return out


def _model() -> Any:
    torch.manual_seed(0)
    return tr.tanh_mlp(16, 32, 1).double()


def _train(rank: int, g: Any, lr: float = 0.05, kind: str = "ddp") -> dict[str, Any]:
    return train_on_group(_model(), kind, g, rank, STEPS, lr, dtype=torch.float64)


@exit_when_done
def _worker(rank: int, init_file: str, shm: str, out: str) -> None:
    os.environ["ARTEMIS_SHM_DIR"] = shm
    os.environ["ARTEMIS_JOB"] = JOB
    os.environ["ARTEMIS_ISLANDS"] = ",".join(ISLANDS)
    dist = tr.join_artemis_group(init_file, rank, WORLD)
    try:
        pg = dist.group.WORLD
        res: dict[str, Any] = {"island": pg.island}
        gloo = dist.new_group(backend="gloo")
        res["ours"] = _collectives(dist, rank, None)
        res["ref"] = _collectives(dist, rank, gloo)
        res["ddp_ours"] = _train(rank, pg)
        res["ddp_ref"] = _train(rank, gloo)
        res["ddp_control"] = _train(rank, gloo, lr=0.06)
        # FSDP's all_gather and reduce_scatter are passed through: gloo's results
        res["fsdp_ours"] = _train(rank, pg, kind="fsdp")
        res["fsdp_ref"] = _train(rank, gloo, kind="fsdp")
        dist.barrier()
    finally:
        dist.destroy_process_group()
    Path(out, f"rank{rank}.json").write_text(json.dumps(res))


def _close(a: Any, b: Any) -> bool:
    return bool(torch.allclose(torch.tensor(a), torch.tensor(b), rtol=1e-9, atol=1e-12))


@pytest.mark.slow
@pytest.mark.torch_e2e  # not timing-sensitive, but 4 torch processes take ~50 s here
def test_islands_compose_like_gloo_and_write_bridge_records(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    spawn_and_join(
        _worker, (str(tmp_path / "store"), str(shm), str(tmp_path)), WORLD, JOIN_TIMEOUT_S
    )
    res = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]
    for r in range(WORLD):
        assert res[r]["island"] == ISLANDS[r]
        assert res[r]["ours"] == res[r]["ref"]  # every collective: gloo's result
        ours, ref, ctl = res[r]["ddp_ours"], res[r]["ddp_ref"], res[r]["ddp_control"]
        for key in ("params", "grads"):
            assert all(_close(a, b) for a, b in zip(ours[key], ref[key], strict=True)), key
            assert not all(_close(a, b) for a, b in zip(ours[key], ctl[key], strict=True)), key
        assert res[r]["fsdp_ours"] == res[r]["fsdp_ref"]  # bit for bit
    # the values are real: all four ranks took part
    assert res[0]["ours"]["all_reduce"] == [2.0, 12.0, 22.0, 32.0]
    assert res[0]["ours"]["all_reduce_prod_int"] == [2 * 3 * 4 * 5]

    rings: dict[str, list[Any]] = {}
    for path in sorted(shm.glob(f"{JOB}.*.ring")):
        with RingReader(path) as rd:
            h = rd.header()
            assert h.finished  # destroy_process_group finishes every ring
            rings.setdefault(h.comm_name, []).append((h, rd.poll().done))
    bridge = rings.pop("bridge")
    assert sorted(h.global_rank for h, _ in bridge) == [0, 2]  # the island leaders only
    assert len(rings) == 2, sorted(rings)  # one island communicator per island
    main: dict[int, Any] = {}
    for name, parts in rings.items():
        island = "nvidia" if ":island:nvidia:" in name else "amd"
        assert f":island:{island}:" in name, name
        members = [r for r in range(WORLD) if ISLANDS[r] == island]
        assert sorted(h.global_rank for h, _ in parts) == members
        for h, d in parts:
            assert h.nranks == 2 and h.rank == members.index(h.global_rank)
            assert h.backend and h.cpu_times and h.clock_kind == "host"
            coll = d[d["kind"] == rf.KIND_COLL]
            assert coll["coll_seq"].tolist() == list(range(len(coll)))  # no gap, no repeat
            assert (coll["end"] >= coll["start"]).all() and (coll["start"] > 0).all()
            main[h.global_rank] = coll
    # the two islands' rings carry the same step pattern (every rank made the same calls)
    funcs = {r: main[r]["func"].tolist() for r in main}
    assert len({tuple(f) for f in funcs.values()}) == 1
    assert funcs[0].count(rf.FUNC_CODES["Reduce"]) >= STEPS  # DDP's all-reduces, composed
    for h, d in bridge:
        assert h.nranks == WORLD and (d["kind"] == rf.KIND_BRIDGE).all()
        peer = 1 if h.global_rank == 0 else 0  # the other island, by order of first rank
        assert (d["peer"] == peer).all()
        coll = main[h.global_rank]
        by_seq = {int(c["coll_seq"]): c for c in coll}
        assert len(d) >= STEPS
        for b in d:
            c = by_seq[int(b["coll_seq"])]
            # the exchange sits inside the island Broadcast the island waits in
            assert c["func"] == rf.FUNC_CODES["Broadcast"]
            assert c["start"] <= b["start"] <= b["end"] <= c["end"]
    src = SimulatedSource(shm, JOB)
    assert [src.sample(RankTarget(rank=r, pid=0)).get("vendor") for r in range(WORLD)] == ISLANDS


def test_islands_variable_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from artemis.job.backend import island_names

    monkeypatch.delenv("ARTEMIS_ISLANDS", raising=False)
    assert island_names(4) is None  # unset: no islands
    monkeypatch.setenv("ARTEMIS_ISLANDS", " nvidia, nvidia ,amd,amd ")
    assert island_names(4) == ISLANDS
    with pytest.raises(ValueError, match="names 4 islands for a world of 2 ranks"):
        island_names(2)
    monkeypatch.setenv("ARTEMIS_ISLANDS", "nvidia,,amd")
    with pytest.raises(ValueError, match="an empty island name"):
        island_names()


def test_a_wrong_islands_variable_fails_init_clearly(tmp_path: Path) -> None:
    """One real process: init_process_group refuses a list of the wrong length."""
    import subprocess
    import sys

    code = (
        "import artemis.job, torch.distributed as dist\n"
        f"dist.init_process_group('artemis', init_method='file://{tmp_path}/s', rank=0,"
        " world_size=1)\n"
    )
    env = {**os.environ, "ARTEMIS_ISLANDS": "nvidia,amd", "ARTEMIS_SHM_DIR": str(tmp_path)}
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert p.returncode != 0
    assert "ARTEMIS_ISLANDS names 2 islands for a world of 1 ranks" in p.stderr, p.stderr
