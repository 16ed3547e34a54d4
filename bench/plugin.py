"""The C plugin's hot path per collective: this tree against a baseline git ref.

Builds ``profiler_plugin/build/bench_plugin`` from this tree and from a baseline
ref (default ``main``; ``ARTEMIS_BENCH_BASE=<ref>``) into a temporary folder,
then for each ABI version and 2 / 8 KernelCh channels:

- under ``valgrind --tool=callgrind --collect-bus=yes``, collecting only inside
  ``run_artemis`` and then only inside ``run_nop`` (``--toggle-collect``), the
  instructions over the do-nothing plugin, the locked read-modify-writes
  (callgrind's global bus events: every ``lock``-prefixed instruction and
  ``xchg`` with memory) and the calls of ``clock_gettime`` per collective.
  These are exact counts, stable on a loaded machine; the same for the
  two-thread rows' context in shared mode (``BENCH_SHARED=1``: switched by one
  collective of a second thread, then driven from one thread). They run with
  ``ARTEMIS_HOST_TSC=0``: under valgrind ``clock_gettime`` is a system call, so
  the plugin's TSC anchors are never tight and it would read the clock at
  every start (profiler_plugin/README.md "Host clock");
- natively, ``clock_gettime(CLOCK_MONOTONIC)`` calls per collective over
  ``2000 + NATIVE_N`` collectives, counted by an ``LD_PRELOAD`` shim (the TSC
  on where the machine allows it, as in production);
- the bench's own timing table (``bench_plugin``: medians of 9 interleaved
  runs inside one process), run ``RUNS`` times alternating the two builds; the
  table gives the median and range of those runs for the margin in ns and in
  units of one ``clock_gettime(CLOCK_MONOTONIC)`` read timed in the same run,
  and the range of the 1-minute load average around the runs;
- from the same runs of this tree, the two-thread rows against their floors:
  "2 turns" against "1" (the goal) and against "1 hop" (the same thread
  moved between the two CPUs each phase: what moving the work between
  cores costs with no second thread), and "2" (at once) over "1" in units
  of one cache line's move between the two CPUs, timed in the same run.

Needs ``cc``, ``make``, ``git`` and ``valgrind``; prints why and returns 1 if
one is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = int(os.environ.get("ARTEMIS_BENCH_RUNS", "3"))
# bench_plugin callgrind V NCH drives 2000 + 20000 collectives through each side
CG_COLLS = 22000
NATIVE_N = 1_000_000
VERSIONS = (4, 5, 6, 7)

# Counts clock_gettime(CLOCK_MONOTONIC) calls; prints the count at exit.
_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <time.h>
static unsigned long n;
static int (*real)(clockid_t, struct timespec *);
int clock_gettime(clockid_t c, struct timespec *t) {
    if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    if (c == CLOCK_MONOTONIC) n++;
    return real(c, t);
}
__attribute__((destructor)) static void done(void) { fprintf(stderr, "clock_gettime %lu\n", n); }
"""
CHANNELS = (2, 8)


def _build(src: Path) -> Path:
    subprocess.run(
        ["make", "-s", "-C", str(src / "profiler_plugin"), "build/bench_plugin"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return src / "profiler_plugin" / "build" / "bench_plugin"


def _callgrind(
    binary: Path,
    fn: str,
    version: int,
    nch: int,
    tmp: Path,
    nop_null: bool = False,
    shared: bool = False,
) -> dict[str, float]:
    tag = f"{int(nop_null)}{int(shared)}"
    out = tmp / f"cg.{binary.parent.parent.parent.name}.{fn}.{version}.{nch}.{tag}"
    subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            "--collect-bus=yes",
            "--collect-atstart=no",
            f"--toggle-collect={fn}",
            f"--callgrind-out-file={out}",
            str(binary),
            "callgrind",
            str(version),
            str(nch),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={
            **os.environ,
            "ARTEMIS_HOST_TSC": "0",
            "BENCH_NOP_NULL": "1" if nop_null else "0",
            "BENCH_SHARED": "1" if shared else "0",
        },
    )
    text = out.read_text()
    events = re.search(r"^events: (.*)$", text, re.M)
    totals = re.search(r"^totals: (.*)$", text, re.M) or re.search(r"^summary: (.*)$", text, re.M)
    if not events or not totals:
        raise RuntimeError(f"no totals in {out}")
    vals = dict(
        zip(events.group(1).split(), (int(x) for x in totals.group(1).split()), strict=False)
    )
    # calls=N lines that follow a cfn= naming clock_gettime
    clock_calls = 0
    cfn_names: dict[str, str] = {}
    current = ""
    for line in text.splitlines():
        m = re.match(r"c?fn=\((\d+)\)(?: (.*))?", line)
        if m:
            # names are compressed: the first mention of an id (fn= or cfn=) names it
            if m.group(2):
                cfn_names[m.group(1)] = m.group(2)
            current = cfn_names.get(m.group(1), "") if line.startswith("cfn=") else ""
        elif line.startswith("calls=") and current.startswith("clock_gettime"):
            clock_calls += int(line.split("=")[1].split()[0])
    return {
        "ir": vals.get("Ir", 0) / CG_COLLS,
        "locked": vals.get("Ge", 0) / CG_COLLS,
        "clock": clock_calls / CG_COLLS,
    }


def _native_clock_calls(binary: Path, shim: Path, version: int, nch: int) -> float:
    """clock_gettime(CLOCK_MONOTONIC) per collective, natively; run_nop reads none."""
    p = subprocess.run(
        [str(binary), "callgrind", str(version), str(nch), str(NATIVE_N)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "LD_PRELOAD": str(shim)},
    )
    m = re.search(r"clock_gettime (\d+)", p.stderr)
    if not m:
        raise RuntimeError(f"no count from the shim: {p.stderr!r}")
    return int(m.group(1)) / (2000 + NATIVE_N)


def _counts(binary: Path, tmp: Path) -> dict[tuple[int, int], dict[str, float]]:
    res = {}
    for v in VERSIONS:
        for nch in CHANNELS:
            a = _callgrind(binary, "run_artemis", v, nch, tmp)
            n = _callgrind(binary, "run_nop", v, nch, tmp)
            n0 = _callgrind(binary, "run_nop", v, nch, tmp, nop_null=True)
            sh = _callgrind(binary, "run_artemis", v, nch, tmp, shared=True)
            res[(v, nch)] = {
                "ir": a["ir"] - n["ir"],
                "ir_floor": a["ir"] - n0["ir"],
                "locked": a["locked"] - n["locked"],
                "ir_shared": sh["ir"] - n["ir"],
                "locked_shared": sh["locked"] - n["locked"],
                "clock": a["clock"] - n["clock"],
                "native_clock": _native_clock_calls(binary, tmp / "shim.so", v, nch),
            }
    return res


_ROW = re.compile(
    r"^v(\d)\s+(\d+)\s+(1\+proxy|1 hop|\d+(?: turns)?)\s+([\d.]+)\s+([\d.]+)\s+(-?[\d.]+)"
    r"\s+([\d.]+)\s+(-?[\d.]+)(?:\s+([\d.]+))?"
)

# (margin ns, margin in clock reads, one line move in ns: 0 where the driver has no such column)
Row = tuple[float, float, float]


def _timing(binary: Path) -> dict[tuple[int, int, str], Row]:
    out = subprocess.run([str(binary)], check=True, capture_output=True, text=True).stdout
    rows = {}
    for line in out.splitlines():
        m = _ROW.match(line)
        if m:
            # threads: "1", "1+proxy", "2" (at once), "2 turns" or "1 hop" (bench_plugin.c's header)
            v, nch, th = int(m.group(1)), int(m.group(2)), m.group(3)
            rows[(v, nch, th)] = (float(m.group(6)), float(m.group(8)), float(m.group(9) or 0.0))
    return rows


def _floors(runs: list[dict[tuple[int, int, str], Row]]) -> None:
    """The two-thread rows of this tree's runs against their floors (medians over the runs)."""
    print(
        "\nTwo threads against their floors, this tree: medians over the runs of the margin in ns; "
        "turns / 1 is the goal's ratio (at most 2), turns / hop what a second thread adds to "
        "moving the work between the two CPUs, (2 - 1) / line the at-once margin over one "
        "thread's in cache-line moves between those CPUs (timed in the same runs)"
    )
    print(
        f"{'ABI':<4} {'ch':>3} {'1':>7} {'1 hop':>7} {'2 turns':>8} {'2':>7} {'line':>6} "
        f"{'turns/1':>8} {'turns/hop':>10} {'2/1':>6} {'(2-1)/line':>11}"
    )
    for v in VERSIONS:
        for nch in CHANNELS:
            med = {
                th: statistics.median(r[(v, nch, th)][0] for r in runs)
                for th in ("1", "1 hop", "2 turns", "2")
            }
            line = statistics.median(r[(v, nch, "1")][2] for r in runs)
            one = med["1"] or float("nan")
            print(
                f"v{v:<3} {nch:>3} {med['1']:>7.1f} {med['1 hop']:>7.1f} {med['2 turns']:>8.1f} "
                f"{med['2']:>7.1f} {line:>6.1f} {med['2 turns'] / one:>8.2f} "
                f"{med['2 turns'] / (med['1 hop'] or float('nan')):>10.2f} {med['2'] / one:>6.2f} "
                f"{(med['2'] - med['1']) / (line or float('nan')):>11.2f}"
            )


def _span(xs: list[float], fmt: str) -> str:
    med = statistics.median(xs)
    return f"{med:{fmt}} ({min(xs):{fmt}}-{max(xs):{fmt}})"


# The callgrind tables' columns: (count key, header, width before, width after, decimals).
_COUNT_COLUMNS = [
    ("locked", "locked before", 14, 6, 2),
    ("clock", "clock calls before", 19, 6, 2),
    ("ir", "instr over no-op before", 24, 6, 0),
    ("ir_floor", "over NULL no-op before", 23, 6, 0),
    ("native_clock", "native clock calls before", 26, 8, 4),
]
_SHARED_COUNT_COLUMNS = [
    ("locked_shared", "locked before", 14, 6, 2),
    ("ir_shared", "instr over no-op before", 24, 6, 0),
]


def _print_counts(
    counts: dict[str, dict[tuple[int, int], dict[str, float]]],
    columns: list[tuple[str, str, int, int, int]],
) -> None:
    """One callgrind table, before against after: a row per ABI version and channel count."""
    head = " ".join(f"{label:>{wb}} {'after':>{wa}}" for _, label, wb, wa, _ in columns)
    print(f"{'ABI':<4} {'ch':>3} {head}")
    for v in VERSIONS:
        for nch in CHANNELS:
            cb, ca = counts["before"][(v, nch)], counts["after"][(v, nch)]
            cells = " ".join(
                f"{cb[key]:>{wb}.{d}f} {ca[key]:>{wa}.{d}f}" for key, _, wb, wa, d in columns
            )
            print(f"v{v:<3} {nch:>3} {cells}")


def main() -> int:
    for tool in ("cc", "make", "git", "valgrind"):
        if shutil.which(tool) is None:
            print(f"bench.plugin: {tool} not found; skipped")
            return 1
    base_ref = os.environ.get("ARTEMIS_BENCH_BASE", "main")
    with tempfile.TemporaryDirectory(prefix="artemis-bench-plugin-") as d:
        tmp = Path(d)
        base_src = tmp / "base"
        base_src.mkdir()
        arc = subprocess.run(
            ["git", "-C", str(ROOT), "archive", base_ref, "profiler_plugin"],
            check=True,
            capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(base_src)], input=arc, check=True)
        # both builds are driven by this tree's bench driver
        shutil.copy(ROOT / "profiler_plugin" / "bench_plugin.c", base_src / "profiler_plugin")
        shutil.rmtree(base_src / "profiler_plugin" / "build", ignore_errors=True)
        builds = {"before": _build(base_src), "after": _build(ROOT)}
        (tmp / "shim.c").write_text(_SHIM)
        subprocess.run(
            [
                "cc",
                "-shared",
                "-fPIC",
                "-O2",
                "-o",
                str(tmp / "shim.so"),
                str(tmp / "shim.c"),
                "-ldl",
            ],
            check=True,
        )

        counts = {k: _counts(b, tmp) for k, b in builds.items()}
        print(f"Per collective, callgrind (exact counts): before = {base_ref}, after = this tree")
        print(
            "(instr over NULL no-op: over a do-nothing plugin that returns NULL for every "
            "event, so NCCL calls no stop or state on it)"
        )
        _print_counts(counts, _COUNT_COLUMNS)
        print(
            "\nShared mode (the two-thread rows' context, switched by a second thread's "
            "collective; callgrind runs the threads one at a time, so these are the shared "
            "path's instructions and locked RMWs, not its cache-line moves)"
        )
        _print_counts(counts, _SHARED_COUNT_COLUMNS)

        if RUNS < 1:
            return 0
        timing: dict[str, list[dict[tuple[int, int, str], Row]]] = {
            "before": [],
            "after": [],
        }
        # the machine is shared: the 1-minute load average around each run
        loads = [os.getloadavg()[0]]
        for _ in range(RUNS):
            for k, binary in builds.items():
                timing[k].append(_timing(binary))
                loads.append(os.getloadavg()[0])
        print(
            f"\nMargin over the no-op plugin, median (range) of {RUNS} alternated runs of "
            f"bench_plugin (each a median of 9); load average {min(loads):.2f}-{max(loads):.2f}"
        )
        print(
            f"{'ABI':<4} {'ch':>3} {'threads':>7} {'clock reads before':>22} {'after':>18} "
            f"{'ns before':>22} {'ns after':>22}"
        )
        for key in sorted(timing["after"][0]):
            v, nch, th = key
            rb = [r[key][1] for r in timing["before"]]
            ra = [r[key][1] for r in timing["after"]]
            nb = [r[key][0] for r in timing["before"]]
            na = [r[key][0] for r in timing["after"]]
            print(
                f"v{v:<3} {nch:>3} {th:>7} {_span(rb, '.2f'):>22} {_span(ra, '.2f'):>18} "
                f"{_span(nb, '.1f'):>22} {_span(na, '.1f'):>22}"
            )
        _floors(timing["after"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
