"""Protocol codec throughput: typed encode + validated decode vs raw msgpack of the same maps.

``python -m bench codec``. For each message kind the table shows messages/s
for a full round trip (``encode`` to a framed message, ``FrameDecoder.feed``
back to a validated typed object) next to the baseline measured in the same
run: ``msgpack.packb`` + ``msgpack.unpackb`` of the identical wire map, with no
framing, no typing and no validation. The ratio is what validation costs.
Each figure is the median of several runs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import msgpack
from artemis.protocol.codec import FrameDecoder, encode
from artemis.protocol.messages import Heartbeat, Message, Windows, message_to_map
from artemis.protocol.records import RankProgress, RankWindow, Telemetry

RUNS = 7
TARGET_S = 0.25  # each run lasts about this long


def _window(rank: int) -> RankWindow:
    return RankWindow(
        job="job-1", comm="0123456789abcdef", rank=rank, nranks=8, host="node-a", window=37,
        step_lo=1850, step_hi=1900, coll_lo=7400, coll_hi=7600, gap_ms=81.5 + rank,
        coll_ms=18.25, step_ms=100.0, collectives=200, bytes=1 << 33, lost=0, clock="device",
        island="nvidia", hw_class="H100", samples=32,
        telemetry=Telemetry(
            vendor="nvidia", gpu_model="NVIDIA H100 80GB HBM3", gpu_index=rank, sm_mhz=1410.0,
            sm_mhz_max=1980.0, mem_mhz=2619.0, temp_c=61.0, power_w=400.0, power_limit_w=700.0,
            throttle={"hw_thermal": False, "sw_power_cap": False}, pcie_gen=5, pcie_gen_max=5,
            pcie_width=16, pcie_width_max=16, cpu_pct=35.0, steal_pct=0.0, iowait_pct=0.1,
            psi_cpu_some=0.5, load1=12.0, ncpu=96, proc_cpu_pct=101.0,
        ),
    )  # fmt: skip


def _messages() -> list[tuple[str, Message]]:
    hb = Heartbeat(
        seq=1,
        progress=tuple(
            RankProgress("job-1", "0123456789abcdef", r, "node-a", 7599, None, 0.0, 0.01)
            for r in range(8)
        ),
        buffered=0,
        dropped=0,
    )
    win = Windows(seq=2, host="node-a", windows=tuple(_window(r) for r in range(8)))
    return [("heartbeat (8 ranks)", hb), ("windows (8 RankWindows)", win)]


def _rate(fn: Callable[[int], None]) -> float:
    """Messages/s of ``fn(n)`` (which handles n messages), median of RUNS timed runs."""
    n = 64
    while True:  # calibrate n so one run takes about TARGET_S
        t0 = time.perf_counter()
        fn(n)
        dt = time.perf_counter() - t0
        if dt >= TARGET_S / 4:
            break
        n *= 2
    n = max(1, int(n * TARGET_S / dt))
    rates = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        fn(n)
        rates.append(n / (time.perf_counter() - t0))
    return statistics.median(rates)


def main() -> int:
    rows = []
    for name, msg in _messages():
        wire_map = message_to_map(msg)
        frame = encode(msg)

        def ours(n: int, msg: Message = msg) -> None:
            dec = FrameDecoder()
            for _ in range(n):
                out = dec.feed(encode(msg))
                assert type(out[0]) is type(msg)

        def raw(n: int, m: dict[str, object] = wire_map) -> None:
            for _ in range(n):
                msgpack.unpackb(msgpack.packb(m, use_bin_type=True), raw=False)

        def decode_only(n: int, frame: bytes = frame) -> None:
            dec = FrameDecoder()
            for _ in range(n):
                dec.feed(frame)

        base = _rate(raw)
        full = _rate(ours)
        dec = _rate(decode_only)
        rows.append((name, len(frame), base, full, full / base, dec))

    head = (
        f"{'message':<26}{'bytes':>7}{'raw msgpack/s':>15}{'artemis/s':>12}"
        f"{'ratio':>8}{'decode only/s':>15}"
    )
    print(f"codec round trip (encode + validated decode), median of {RUNS} runs")
    print(head)
    print("-" * len(head))
    for name, size, base, full, ratio, dec in rows:
        print(f"{name:<26}{size:>7}{base:>15,.0f}{full:>12,.0f}{ratio:>8.2f}{dec:>15,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
