"""NCCL stand-in cost: collectives/s driven through the real plugin by sim/nccl.py.

Baseline: the same number of bare ctypes calls into the plugin (stopEvent(NULL),
which returns at once), i.e. the floor of calling C from Python. Median of 5
runs of 5000 collectives each.
"""

from __future__ import annotations

import os
import tempfile
from functools import partial

from artemis.agent.plugin_path import plugin_path
from artemis.sim.nccl import NcclStandIn, StandInComm

from bench._timing import median_s

N = 5000
CALLS_PER_COLL = 16  # v5+: 10 host events/states + 3 per channel x 2 channels


def _colls(comm: StandInComm) -> None:
    kt = [(1000, 2000), (1100, 2100)]
    for _ in range(N):
        comm.collective("AllReduce", 1 << 20, "ncclBfloat16", kernel_times=kt)


def _bare(nccl: NcclStandIn) -> None:
    stop = nccl.stop_event
    for _ in range(N * CALLS_PER_COLL):
        stop(None)


def main() -> int:
    with tempfile.TemporaryDirectory() as td:
        os.environ["ARTEMIS_SHM_DIR"] = td
        os.environ.setdefault("ARTEMIS_JOB", "bench")
        rows = []
        for version in (7, 4):
            nccl = NcclStandIn(plugin_path(), version)
            comm = nccl.comm_init(0xB0 + version, 0, 2)
            rows.append(
                (version, median_s(partial(_colls, comm), 5), median_s(partial(_bare, nccl), 5))
            )
            nccl.finalize()
    print(f"{'ABI':>4} {'collectives/s':>14} {'us/coll':>8} {'bare calls us':>14} {'ratio':>6}")
    for v, t, b in rows:
        print(
            f"{'v' + str(v):>4} {N / t:>14,.0f} {t / N * 1e6:>8.1f} {b / N * 1e6:>14.1f} {t / b:>6.1f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
