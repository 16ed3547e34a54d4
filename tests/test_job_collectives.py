"""The Python path's collectives made from ``_COLLECTIVES``: each keeps c10d's argument
order, fills in default options, forwards to the inner group and writes one record
with its func and the bytes of the tensors its row names (torch's fake process group
completes every Work at once)."""

from __future__ import annotations

import inspect
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from artemis.job import python_path  # noqa: E402
from artemis.ring import format as rf  # noqa: E402
from artemis.ring.reader import RingReader  # noqa: E402


def _ones(n: int) -> Any:
    return torch.ones(n)  # float32: 4 bytes an element


# method -> (its arguments before opts, the bytes its record must carry)
CALLS: dict[str, tuple[tuple[Any, ...], int]] = {
    "broadcast": (([_ones(4)],), 16),
    "reduce": (([_ones(4), _ones(2)],), 24),
    "allgather": (([[_ones(4), _ones(4)]], [_ones(4)]), 16),
    "_allgather_base": ((_ones(8), _ones(4)), 16),
    "allgather_coalesced": (([[_ones(4)], [_ones(4)]], [_ones(4)]), 16),
    "allgather_into_tensor_coalesced": (([_ones(8)], [_ones(4)]), 16),
    "all_gather_single": ((_ones(8), _ones(4)), 16),
    "all_gather_single_coalesced": (([_ones(8)], [_ones(4)]), 16),
    "gather": (([[_ones(4), _ones(4)]], [_ones(4)]), 16),
    "scatter": (([_ones(3)], [[_ones(3), _ones(3)]]), 12),  # the output's tensors
    "reduce_scatter": (([_ones(4)], [[_ones(4), _ones(4)]]), 32),
    "_reduce_scatter_base": ((_ones(4), _ones(8)), 32),
    "reduce_scatter_tensor_coalesced": (([_ones(4)], [_ones(8)]), 32),
    "reduce_scatter_single": ((_ones(4), _ones(8)), 32),
    "reduce_scatter_single_coalesced": (([_ones(4)], [_ones(8)]), 32),
    "alltoall": (([_ones(4), _ones(4)], [_ones(4), _ones(4)]), 32),
    "alltoall_base": ((_ones(4), _ones(4), [2, 2], [2, 2]), 16),
    "all_to_all_single": ((_ones(4), _ones(4), [2, 2], [2, 2]), 16),
}


def test_every_row_is_a_method_with_c10ds_arguments() -> None:
    names = [row[0] for row in python_path._COLLECTIVES]
    assert sorted(names) == sorted(CALLS) and len(set(names)) == len(names)
    for name, _func, _opts, records in python_path._COLLECTIVES:
        params = list(inspect.signature(getattr(python_path.ArtemisProcessGroup, name)).parameters)
        want = {
            "tensors": ["self", "tensors", "opts"],
            "one+splits": ["self", "output", "input", "out_split", "in_split", "opts"],
        }.get(records, ["self", "output", "input", "opts"])
        assert params == want, name


def test_every_row_forwards_and_records_its_func_and_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    monkeypatch.setenv("ARTEMIS_SHM_DIR", str(tmp_path))
    monkeypatch.setenv("ARTEMIS_JOB", "table")
    monkeypatch.delenv("ARTEMIS_ISLANDS", raising=False)
    store = FakeStore()
    dist.init_process_group("fake", store=store, rank=0, world_size=2)
    try:
        fake: Any = dist.group.WORLD
        pg = python_path.ArtemisProcessGroup(store, 0, 2, timedelta(seconds=30), inner=fake)
        for name, _func, _opts, _records in python_path._COLLECTIVES:
            args, _ = CALLS[name]
            getattr(pg, name)(*args).wait()  # default options, as c10d passes none
        assert pg.next_coll_seq() == len(python_path._COLLECTIVES)
        path = pg.ring_path()
        pg.close_rings()
    finally:
        dist.destroy_process_group()
    with RingReader(path) as rd:
        done = rd.poll().done
    assert done["func"].tolist() == [rf.FUNC_CODES[row[1]] for row in python_path._COLLECTIVES]
    assert done["bytes"].tolist() == [CALLS[row[0]][1] for row in python_path._COLLECTIVES]
    assert done["coll_seq"].tolist() == list(range(len(python_path._COLLECTIVES)))
    assert (done["kind"] == rf.KIND_COLL).all()
