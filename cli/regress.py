"""`artemis regress`: run the node's micro-benchmark once, keep it, judge it, report it.

The imperative shell around regress/bench.py (measure) and regress/core.py (judge):
open the store, measure, fingerprint, read the node's earlier runs and its peers'
runs, judge, write the run, the findings (JSONL), the textfile, and print a table.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import structlog
import typer
from artemis.common.exits import exit_error

log = structlog.get_logger("artemis.regress")

HISTORY_READ: int | None = None  # all the node's runs: `window` numbers them (weekly: 52 a year)
PEERS_READ = 500  # the hardware class's latest runs read back (one per peer node is used)


def parse_cpus(text: str | None) -> tuple[int, ...]:
    """``"1"``, ``"0,2"``, ``"4-7"`` -> CPU numbers, in the order given."""
    if not text:
        return ()
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        try:
            if sep:
                out.extend(range(int(lo), int(hi) + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise typer.BadParameter(f"{part!r}: expected N or N-M", param_hint="--cpus") from None
    return tuple(dict.fromkeys(out))


def regress(
    node: Annotated[
        str | None, typer.Option(help="This node's name in the store (default: the hostname).")
    ] = None,
    store: Annotated[
        str,
        typer.Option(
            help="Store URL: sqlite:///PATH (default: artemis.db in the working directory) or "
            "postgresql://... (one store for the fleet: what makes peers comparable)."
        ),
    ] = "sqlite:///artemis.db",
    jsonl: Annotated[
        Path | None, typer.Option(help="Append the run's findings (change, regression) here.")
    ] = None,
    textfile: Annotated[
        Path | None,
        typer.Option(help="node_exporter textfile folder: writes artemis_regress.prom there."),
    ] = None,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda.")] = "auto",
    ranks: Annotated[
        int | None,
        typer.Option(help="Local ranks of the all_reduce sweep (default: every GPU; 2 on CPU)."),
    ] = None,
    cpus: Annotated[
        str | None,
        typer.Option(help="Pin the benchmark's processes to these CPUs, e.g. 3 or 0,2 or 4-7."),
    ] = None,
    repeats: Annotated[int, typer.Option(help="Samples per item (median and quartiles).")] = 11,
    margin: Annotated[
        float | None,
        typer.Option(
            help="Smallest slowdown reported, relative (default: 0.05 on GPU, 0.6 on CPU; "
            "regress/README.md)."
        ),
    ] = None,
    timeout_s: Annotated[float, typer.Option(help="Give the benchmark up after this.")] = 300.0,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the run and its findings as JSON, no table.")
    ] = False,
    fail_on_finding: Annotated[
        bool, typer.Option(help="Exit 1 when the run gives a finding (default: exit 0).")
    ] = False,
    log_json: Annotated[bool, typer.Option(help="Logs as JSON lines.")] = False,
) -> None:
    """Run the fixed micro-benchmark (GEMM, all_reduce sweep, host-to-device copy) on this
    node, store it keyed by node and software fingerprint, and compare it with the node's
    baseline and its same-hardware peers: a slowdown beyond the noise is a `change`
    finding (the fingerprint changed) or a `regression` (it did not). Exit 2 when the
    benchmark or the store cannot run."""
    from artemis.common.logs import setup_logging
    from artemis.coordinator.sinks import FindingsWriter
    from artemis.regress import core
    from artemis.regress import textfile as tf
    from artemis.regress.bench import BenchError, BenchOptions, measure
    from artemis.regress.node import hardware_class, node_name, software
    from artemis.store import StoreError, open_store

    setup_logging(json_logs=log_json)
    name = node_name(node)
    opts = BenchOptions(
        device=device, ranks=ranks, repeats=repeats, cpus=parse_cpus(cpus), timeout_s=timeout_s
    )
    try:
        st = open_store(store)
    except StoreError as e:
        exit_error(e)
    with st:
        try:
            m = measure(opts)
        except BenchError as e:
            typer.echo(f"error: benchmark: {e}", err=True)
            raise typer.Exit(2) from None
        soft = software(m.device)
        run = core.build_run(
            node=name,
            time=time.time(),
            device=m.device,
            ranks=m.ranks,
            backend=m.backend,
            hardware=hardware_class(m.device, soft),
            software=soft,
            samples=m.samples,
            benchmarks={it.name: it.benchmark for it in m.items},
            absent=m.absent,
            duration_s=m.elapsed_s,
            meta=m.meta,
        )
        try:
            earlier = st.regress_runs(node=name, limit=HISTORY_READ)
            peers = st.regress_runs(hardware=run["hardware"], limit=PEERS_READ)
            j = core.judge(run, earlier, peers, margin=margin)
            run["verdict"], run["healthy"] = j.verdict, j.healthy
            findings = core.findings_of(run, j, window=len(earlier))
            st.write_regress_run(run)
        except StoreError as e:
            exit_error(e)
    if jsonl is not None:
        with FindingsWriter(jsonl) as w:
            w.write(findings)
    if textfile is not None:
        tf.write(textfile, run, j)
    log.info(
        "regress run",
        node=name,
        verdict=j.verdict,
        findings=len(findings),
        fingerprint=run["fingerprint"],
        seconds=round(m.elapsed_s, 2),
    )
    if json_out:
        out = {"run": run, "findings": [f.to_json() for f in findings], "notes": j.notes}
        sys.stdout.write(json.dumps(out, default=str) + "\n")
    else:
        _print(run, j, findings)
    raise typer.Exit(1 if fail_on_finding and findings else 0)


def _fmt_s(v: float | None) -> str:
    if v is None:
        return "-"
    for unit, mul in (("s", 1.0), ("ms", 1e3), ("us", 1e6)):
        if v * mul >= 1.0:
            return f"{v * mul:.3g} {unit}"
    return f"{v * 1e9:.3g} ns"


def _print(run: dict[str, Any], j: Any, findings: list[Any]) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    con = Console()
    title = (
        f"artemis regress: {run['node']} ({run['hardware']}, {run['device']}, {run['ranks']} ranks, "
        f"fingerprint {run['fingerprint']})"
    )
    t = Table(title=title, box=box.SIMPLE_HEAVY)
    for col in ("item", "median", "spread"):
        t.add_column(col)
    by_basis = {c.baseline.basis: {v.item: v for v in c.items} for c in j.comparisons}
    for basis in by_basis:
        t.add_column(f"{basis} median")
        t.add_column(f"{basis} ratio (limit)")
    for name, it in run["items"].items():
        spread = (it["p75"] - it["p25"]) / it["median"] if it["median"] else 0.0
        cells = [name, _fmt_s(it["median"]), f"{spread:.0%}"]
        for items in by_basis.values():
            v = items.get(name)
            if v is None:
                cells += ["-", "-"]
                continue
            style = "bold red" if v.slower else "green" if v.faster else ""
            txt = f"{v.ratio:.2f} ({v.threshold:.2f})" + (" slower" if v.slower else "")
            cells += [_fmt_s(v.base_median), f"[{style}]{txt}[/]" if style else txt]
        t.add_row(*cells)
    for bench, why in (run.get("absent") or {}).items():
        t.add_row(bench, "absent", why, *(["-", "-"] * len(by_basis)))
    con.print(t)
    for c in j.comparisons:
        con.print(
            f"{c.baseline.basis}: {len(c.baseline.runs)} runs of "
            f"{', '.join(c.baseline.nodes)} (fingerprint {c.baseline.fingerprint})"
        )
    for note in j.notes:
        con.print(f"[dim]{note}[/]")
    if not findings:
        con.print(f"verdict: [green]{j.verdict}[/]")
    for f in findings:
        ev = f.evidence or {}
        ratios = ev.get("ratios") or {}
        slower = ", ".join(f"{b} x{ratios.get(b, 0):.2f}" for b in ev.get("slower_benchmarks", []))
        what = f"{f.kind} against {ev.get('basis')}: slower {slower}"
        if f.kind == "change":
            what += "; changed: " + ", ".join(
                f"{k} {old} -> {new}" for k, (old, new) in (ev.get("changed") or {}).items()
            )
        else:
            what += "; same fingerprint, cause unknown"
        con.print(f"[bold red]{what}[/]")
