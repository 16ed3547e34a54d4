"""`artemis incidents list|show`: the incidents of a store, as rich tables in the terminal;
`label` keeps a person's confirmed cause, `export --labelled` writes them out.

Reads a store (``--store URL``) or what sits next to a findings file
(``--findings F``: its store, else its ``incidents.jsonl``), read-only, so it is
safe to run while a coordinator writes (store/README.md).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from artemis.common.exits import exit_error
from artemis.detect.findings import BASELINE_KINDS
from artemis.detect.node_kind import unit_hours
from artemis.store.base import Store, StoreError, open_for_findings, open_store

app = typer.Typer(
    help=(
        "Incidents, one per episode of a straggler from its flag to its recovery.\n\n"
        "  artemis incidents list --findings /var/lib/artemis/findings.jsonl\n"
        "  artemis incidents show ID --store sqlite:////var/lib/artemis/artemis.db"
    ),
    no_args_is_help=True,
    add_completion=False,
)

StoreOpt = Annotated[
    str | None,
    typer.Option(
        "--store",
        help="The store URL, e.g. sqlite:////var/lib/artemis/artemis.db or"
        " postgresql://artemis@db/artemis.",
    ),
]
FindingsOpt = Annotated[
    Path | None,
    typer.Option(
        "--findings",
        help="A findings JSONL: read the store next to it (else its incidents.jsonl).",
    ),
]

VERDICT_STYLE = {
    "recovered": "green",
    "mitigated": "cyan",
    "dismissed": "dim",
    "escalated": "bold red",
    "unresolved": "red",
    None: "yellow",
}


def _open(store: str | None, findings: Path | None) -> Store:
    if (store is None) == (findings is None):
        typer.echo("error: give one of --store URL or --findings FILE", err=True)
        raise typer.Exit(2)
    try:
        return open_store(store, readonly=True) if store else open_for_findings(findings or "")
    except StoreError as e:
        exit_error(e)


def _num(v: Any, fmt: str = ".1f", unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, (int, float)):
        return f"{v:{fmt}}{unit}"
    return str(v)


def _when(v: Any) -> str:
    if not isinstance(v, (int, float)):
        return ""
    return dt.datetime.fromtimestamp(v, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _window(rec: dict[str, Any], key: str) -> str:
    w = (rec.get(key) or {}).get("window")
    return "-" if w is None else str(w)


def _verdict(rec: dict[str, Any]) -> tuple[str, str]:
    v = rec.get("verdict")
    return (v or "open"), VERDICT_STYLE.get(v, "")


def _console() -> Any:
    import os

    from rich.console import Console

    con = Console(highlight=False)
    if not con.is_terminal and "COLUMNS" not in os.environ:
        # Piped (grep, a file): whole lines rather than ids wrapped at 80 columns.
        con = Console(highlight=False, width=200)
    return con


@app.command("list")
def list_(
    store: StoreOpt = None,
    findings: FindingsOpt = None,
    job: Annotated[str | None, typer.Option(help="Only this job's incidents.")] = None,
) -> None:
    """One line per incident: id, job, kind, subject, cause, verdict, its windows (opened-closed,
    `-` while open), GPU-hours lost."""
    from rich import box
    from rich.table import Table

    with _open(store, findings) as s:
        try:
            recs = s.incidents(job)
        except StoreError as e:
            exit_error(e)
        where = s.url
    con = _console()
    if not recs:
        con.print(f"no incidents{f' of job {job}' if job else ''} in {where}")
        return
    if job is not None:
        where = f"{where}, job {job}"
    # hours lost per unit (`cost.unit`: GPU-hours, or CPU-hours of a CPU job), never summed across
    lost: dict[str, float] = {}
    units = {unit_hours((r.get("cost") or {}).get("unit")) for r in recs}
    rows = []
    for r in recs:
        verdict, style = _verdict(r)
        gh = (r.get("cost") or {}).get("gpu_hours")
        unit = unit_hours((r.get("cost") or {}).get("unit"))
        lost[unit] = lost.get(unit, 0.0) + (gh if isinstance(gh, (int, float)) else 0.0)
        rows.append(
            (
                str(r.get("id")),
                str(r.get("job")),
                str(r.get("kind")),
                str(r.get("subject")),
                str((r.get("cause") or {}).get("kind") or "-"),
                (verdict, style),
                f"{_window(r, 'opened')}-{_window(r, 'closed')}",
                _num(gh, ".3g") + ("" if len(units) == 1 or gh is None else f" {unit[:3]}"),
            )
        )
    # No vertical rules, the windows in one column, and only the job (the longest,
    # and in the title of a one-job listing) folds: 80 columns are enough.
    # The source is its own line, folded, never cut: a table title longer than the
    # table is ellipsised, and the operator needs the whole path.
    con.print(f"incidents in {where}", overflow="fold")
    t = Table(
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    # "GPU-h": GPU-hours lost (the total under the table says so in words); a listing of
    # GPU and CPU jobs names each cell's unit.
    hours = f"{next(iter(units))[:3]}-h" if len(units) == 1 else "hours"
    heads = ("id", "job", "kind", "subject", "cause", "verdict", "windows", hours)
    widths = [
        max(max(map(len, h.split())), *(len(v[0] if isinstance(v, tuple) else v) for v in col))
        for h, col in zip(heads, zip(*rows, strict=True), strict=True)
    ]
    # rich measures a cell by its longest word: the job (the longest, and folding at
    # any letter) is given what the others leave.
    spare = con.width - sum(w + 2 for i, w in enumerate(widths) if i != 1) - 2
    for i, col in enumerate(heads):
        t.add_column(
            col,
            justify="right" if i >= 6 else "left",
            min_width=widths[i] if i != 1 else None,
            max_width=max(4, spare) if i == 1 else None,
            overflow="fold",
        )
    for row in rows:
        verdict, style = row[5]
        t.add_row(*row[:5], f"[{style}]{verdict}[/]" if style else verdict, *row[6:])
    con.print(t)
    n = len(recs)
    total = ", ".join(f"{v:.3g} {u}" for u, v in sorted(lost.items()))
    con.print(f"{n} incident{'s' if n != 1 else ''}, {total} lost")


def _story(r: dict[str, Any]) -> str:
    """One sentence: who, how slow, since when, why, and how it ended."""
    ev, cost = r.get("evidence") or {}, r.get("cost") or {}
    who = {
        "rank": f"rank {r.get('subject')}",
        "degraded": f"rank {r.get('subject')} (against its own history)",
        "island": f"island {r.get('subject')}",
        "link": f"link {r.get('subject')}",
        "collective": f"the collectives of {r.get('subject')}",
        "change": f"class {r.get('subject')} (after a software change)",
        "regression": f"class {r.get('subject')}",
    }.get(str(r.get("kind")), f"{r.get('kind')} {r.get('subject')}")
    hosts = r.get("hosts") or []
    on = f" on {', '.join(hosts)}" if hosts else ""
    ratio = ev.get("ratio")
    # change/regression: against the stored baseline of its workload (earlier jobs)
    against = "its workload's baseline" if r.get("kind") in BASELINE_KINDS else "its peers"
    slow = f" ran {100 * (ratio - 1):.1f}% slow against {against}" if ratio else " was slow"
    cause = (r.get("cause") or {}).get("kind") or "unknown"
    verdict = r.get("verdict") or "still open"
    return (
        f"{who}{on}{slow} from window {_window(r, 'opened')} (cause: {cause}),"
        f" costing {_num(cost.get('loss_pct'), '.1f', '%')} of throughput and"
        f" {_num(cost.get('gpu_hours'), '.3g')} {unit_hours(cost.get('unit'))}: {verdict}."
    )


def _software(fp: dict[str, Any]) -> str:
    """The job fingerprint in one cell: each component (a list where ranks differ), the
    number of kept env variables, the workload hash's head."""
    sw = fp.get("software") or {}
    parts = []
    for c in ("gpu_model", "driver", "cuda", "nccl", "torch", "kernel"):
        v = sw.get(c)
        if v:
            parts.append(f"{c} {' | '.join(v) if isinstance(v, list) else v}")
    parts.append(f"{len(sw.get('env') or {})} env")
    if fp.get("workload"):
        parts.append(f"workload {str(fp['workload'])[:12]}")
    return ", ".join(parts)


@app.command()
def show(
    id: Annotated[str, typer.Argument(help="The incident id (see `artemis incidents list`).")],
    store: StoreOpt = None,
    findings: FindingsOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the record as JSON.")] = False,
) -> None:
    """The whole story of one incident: cause, evidence against peers, cost, actions with
    their measured throughput, the recommended check, and its markers."""
    from rich.panel import Panel
    from rich.table import Table

    with _open(store, findings) as s:
        try:
            r = s.incident(id)
            # the job's fingerprint (docs/DESIGN.md "Fingerprints"), once its job ended
            fp = next(
                (j.get("fingerprint") for j in s.jobs() if r and j.get("job") == r.get("job")),
                None,
            )
        except StoreError as e:
            exit_error(e)
        where = s.url
    if r is None:
        typer.echo(f"error: no incident {id!r} in {where} (see `artemis incidents list`)", err=True)
        raise typer.Exit(1)
    if as_json:
        typer.echo(json.dumps(r, indent=2))
        return
    con = _console()
    verdict, style = _verdict(r)
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("job", f"{r.get('job')}" + (f"  (run {r['run']})" if r.get("run") else ""))
    head.add_row("subject", f"{r.get('kind')} {r.get('subject')}  island {r.get('island') or '-'}")
    head.add_row("hosts", ", ".join(r.get("hosts") or []) or "-")
    head.add_row("verdict", f"[{style}]{verdict}[/]" if style else verdict)
    if isinstance(fp, dict):
        head.add_row("software", _software(fp))
    if r.get("reason"):
        head.add_row("why", str(r["reason"]))
    for key in ("opened", "confirmed", "closed"):
        ph = r.get(key)
        if not ph:
            head.add_row(key, "-")
            continue
        extra = ""
        if key == "confirmed" and ph.get("rule"):
            extra = f"  rule {ph['rule']}"
            if "q1_ms" in ph:  # the quartile test (rank, degraded)
                extra += (
                    f": q1 {_num(ph.get('q1_ms'))} ms vs peers' median"
                    f" {_num(ph.get('peers_median_ms'))} ms"
                )
        if key == "closed" and ph.get("why"):
            extra = f"  ({ph['why']})"
        head.add_row(key, f"window {ph.get('window')}  {_when(ph.get('time'))}{extra}")
    con.print(Panel(head, title=f"incident {r.get('id')}", expand=False))
    con.print(_story(r))

    cause = r.get("cause") or {}
    con.print(
        f"[bold]cause[/] {cause.get('kind') or 'unknown'}"
        + (
            f" (explains {100 * cause['explained']:.0f}%)"
            if isinstance(cause.get("explained"), (int, float))
            else ""
        )
        + f": {cause.get('text') or '-'}"
    )
    for alt in cause.get("alternatives") or []:
        ex = alt.get("explained")
        exs = f" ({100 * ex:.0f}%)" if isinstance(ex, (int, float)) else ""
        con.print(f"  or {alt.get('kind')}{exs}: {alt.get('text')}")

    ev = r.get("evidence") or {}
    base = r.get("kind") in BASELINE_KINDS
    vs = ("class", "baseline") if base else ("rank", "peers")
    et = Table(title=f"evidence over {ev.get('windows', '?')} windows: {vs[0]} vs {vs[1]}")
    for col in ("", *vs, f"{vs[0]}/{vs[1]}"):
        et.add_column(col, justify="left" if not col else "right")
    rows: list[tuple[str, Any, Any]] = [("gap ms", ev.get("gap_ms"), ev.get("peers_gap_ms"))]
    for name, v in (ev.get("telemetry") or {}).items():
        if isinstance(v, dict):
            rows.append((name, v.get("rank"), v.get("peers")))
    for name, a, b in rows:
        rel = a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None
        et.add_row(name, _num(a, ".4g"), _num(b, ".4g"), _num(rel, ".3f"))
    con.print(et)

    cost = r.get("cost") or {}
    con.print(
        f"[bold]cost[/] {_num(cost.get('excess_ms'))} ms per step excess,"
        f" {_num(cost.get('loss_pct'), '.1f', '%')} of throughput,"
        f" {_num(cost.get('gpu_hours'), '.3g')} {unit_hours(cost.get('unit'))} lost"
        f" ({_num(cost.get('gpu_hours_per_day'), '.1f')} a day if unresolved)"
    )

    acts = r.get("actions") or []
    if acts:
        at = Table(title="actions")
        for col in ("plan", "status", "history", "before /s", "after /s", "gain"):
            at.add_column(
                col, justify="right" if col in ("before /s", "after /s", "gain") else "left"
            )
        for a in acts:
            hist = " > ".join(  # a correction's history has times, not windows
                f"{h.get('status')}" + (f"@w{h['window']}" if "window" in h else "")
                for h in a.get("history") or []
            )
            at.add_row(
                str(a.get("plan") or a.get("action")),  # a correction names its action
                str(a.get("status")),
                hist or "-",
                _num(a.get("throughput_before")),
                _num(a.get("throughput_after")),
                _num(a.get("gain_pct"), "+.1f", "%"),
            )
        con.print(at)
    else:
        con.print("[bold]actions[/] none")

    esc = r.get("escalation")
    if esc:
        con.print(f"[bold]check[/] ({esc.get('cause')}): {esc.get('check')}")
    else:
        con.print("[bold]check[/] none needed")
    marks = r.get("markers") or []
    con.print(
        "[bold]markers[/] "
        + (" > ".join(f"{m.get('marker')}@w{m.get('window')}" for m in marks) or "-")
    )


# ---------------------------------------------------------------- labels (issue 29)


def _open_rw(store: str | None, findings: Path | None) -> Store:
    """The store to write a label into: ``--store``, or the artemis.db next to the
    findings. Only an incidents.jsonl there: a clear error (labels need a store)."""
    from artemis.store.base import default_store_path, incidents_jsonl_path, store_url

    if (store is None) == (findings is None):
        typer.echo("error: give one of --store URL or --findings FILE", err=True)
        raise typer.Exit(2)
    url = store
    if findings is not None:
        db = default_store_path(findings)
        if not db.exists():
            jl = incidents_jsonl_path(findings)
            exit_error(
                StoreError(
                    f"labels need an incident store: next to {findings} there is no {db.name}"
                    + (f", only {jl.name}" if jl.exists() else "")
                    + " (run the coordinator with a store, or give --store URL)"
                )
            )
        url = store_url(db)
    try:
        return open_store(url or "")
    except StoreError as e:
        exit_error(e)


@app.command()
def label(
    incident: Annotated[str, typer.Argument(metavar="ID", help="The incident's id.")],
    cause: Annotated[str, typer.Option("--cause", help="The cause a person confirmed.")],
    note: Annotated[str | None, typer.Option(help="What was found, in words.")] = None,
    store: StoreOpt = None,
    findings: FindingsOpt = None,
) -> None:
    """Keep a person's confirmed cause of an incident, in its own table: the coordinator's
    later writes of the incident never overwrite it. A label again replaces it."""
    import time

    from artemis.detect.findings import CAUSE_KINDS

    if cause not in CAUSE_KINDS:
        typer.echo(f"error: unknown cause {cause!r}: one of {', '.join(CAUSE_KINDS)}", err=True)
        raise typer.Exit(2)
    with _open_rw(store, findings) as s:
        try:
            s.write_label(incident, cause, note, time.time())
        except KeyError:
            typer.echo(f"error: no incident {incident!r} in {s.url}", err=True)
            raise typer.Exit(1) from None
        except StoreError as e:
            exit_error(e)
    typer.echo(f"{incident}: cause {cause}" + (f" ({note})" if note else ""))


@app.command()
def export(
    labelled: Annotated[
        bool, typer.Option("--labelled", help="Each labelled incident with its label.")
    ] = False,
    store: StoreOpt = None,
    findings: FindingsOpt = None,
) -> None:
    """Write incidents as JSONL to stdout: with --labelled, each labelled incident's
    evidence, the coordinator's cause and the person's label (what a learned diagnosis
    would need; nothing learns from it yet)."""
    if not labelled:
        typer.echo("error: only --labelled is exported so far", err=True)
        raise typer.Exit(2)
    with _open(store, findings) as s:
        try:
            labels = s.labels()
            for lab in labels:
                rec = s.incident(str(lab["incident"]))
                if rec is None:
                    continue
                keep = ("id", "job", "run", "kind", "rank", "hosts", "cause", "evidence", "cost")
                line = {k: rec.get(k) for k in keep}
                line["actions"] = rec.get("actions") or []
                line["verdict"] = rec.get("verdict")
                line["label"] = {k: lab[k] for k in ("cause", "note", "time")}
                typer.echo(json.dumps(line, separators=(",", ":")))
        except StoreError as e:
            exit_error(e)
