"""`artemis report`: one self-contained HTML incident report per job (report/README.md)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from artemis.common.exits import exit_error


def report(
    out: Annotated[Path, typer.Option(help="Directory for the reports: one HTML file per job.")],
    store: Annotated[
        str | None,
        typer.Option(help="Incident store URL, e.g. sqlite:///runs/artemis.db."),
    ] = None,
    findings: Annotated[
        Path | None,
        typer.Option(
            help="A findings JSONL: reads the store next to it (artemis.db), else the "
            "incidents.jsonl next to it with the findings' own lines."
        ),
    ] = None,
    plans: Annotated[
        Path | None,
        typer.Option(help="The plans JSONL, with --findings when no store is there."),
    ] = None,
    job: Annotated[str | None, typer.Option(help="Only this job (default: every job).")] = None,
    incident: Annotated[
        str | None, typer.Option(help="Only this incident (in its job's report).")
    ] = None,
) -> None:
    """Write the incident report of each job: the job's summary, and per incident its
    story, pace plot (peers as p10/p50/p90 bands), step time and useful throughput,
    telemetry against peers, cost, action and measured result, and the recommended
    check. The HTML has no script and no external reference: it opens from a file share."""
    from artemis.report.load import (
        ReportError,
        bundles_from_findings,
        bundles_from_store,
        write_bundle,
    )

    if (store is None) == (findings is None):
        raise typer.BadParameter("give exactly one of --store URL or --findings FILE")
    if plans is not None and findings is None:
        raise typer.BadParameter("--plans goes with --findings", param_hint="--plans")
    now = time.time()
    try:
        if store is not None:
            bundles = bundles_from_store(store, job=job, incident=incident, generated=now)
        else:
            assert findings is not None
            bundles = bundles_from_findings(
                findings, plans, job=job, incident=incident, generated=now
            )
        for b in bundles:
            path = write_bundle(b, out, incident=incident)
            n = len(b["incidents"])
            typer.echo(f"{path}  ({n} incident{'s' if n != 1 else ''})")
    except ReportError as e:
        exit_error(e)
    except OSError as e:
        typer.echo(f"error: cannot write the report into {out}: {e}", err=True)
        raise typer.Exit(2) from None
