"""``python -m bench.realjobs``: run part of the real-job grid, or report recorded runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from bench.realjobs import (
    OUT,
    REPEATS,
    SIZES,
    WORKLOADS,
    WORLD,
    load,
    rejudge,
    report,
    run_grid,
)

app = typer.Typer(add_completion=False, no_args_is_help=True)


@app.command("run")
def run_cmd(
    workload: Annotated[
        list[str] | None, typer.Option(help="gpt, conv, mlp, lstm (default all)")
    ] = None,
    mechanism: Annotated[
        list[str] | None, typer.Option(help=f"{', '.join(SIZES)} (default all)")
    ] = None,
    size: Annotated[list[float] | None, typer.Option(help="default: each mechanism's four")] = None,
    repeats: Annotated[int, typer.Option()] = REPEATS,
    out: Annotated[Path, typer.Option()] = OUT,
    world: Annotated[
        int, typer.Option(help="ranks of the job (the fault on rank 2, or 1 of 2)")
    ] = WORLD,
) -> None:
    """Run cells (repeats outermost), append them to OUT/runs.jsonl, print their tables."""
    workload, mechanism = workload or list(WORKLOADS), mechanism or list(SIZES)
    if world < 2:
        raise typer.BadParameter(f"--world {world}: a job of at least 2 ranks")
    if world != WORLD and "bridge" in mechanism:
        raise typer.BadParameter(f"--world {world}: the bridge's islands are set for {WORLD} ranks")
    for w in workload:
        if w not in WORKLOADS:
            raise typer.BadParameter(f"workload {w!r}: one of {', '.join(WORKLOADS)}")
    for m in mechanism:
        if m not in SIZES:
            raise typer.BadParameter(f"mechanism {m!r}: one of {', '.join(SIZES)}")
    report(run_grid(workload, mechanism, size or None, repeats, out, world))


@app.command("report")
def report_cmd(
    out: Annotated[Path, typer.Option()] = OUT,
    again: Annotated[bool, typer.Option(help="judge each run again from its kept files")] = False,
) -> None:
    """The tables and goals of every run recorded in OUT/runs.jsonl."""
    records = load(out)
    if not records:
        raise typer.BadParameter(f"no runs recorded in {out / 'runs.jsonl'}")
    report([rejudge(r) for r in records] if again else records)


@app.command("rescore")
def rescore_cmd(
    out: Annotated[list[Path], typer.Option(help="folders of recorded runs (repeatable)")],
) -> None:
    """Score the runs recorded in OUT again offline, from their kept journals, with
    today's detector (bench/realjobs/rescore.py); print the tables."""
    from bench.realjobs.rescore import rescore_all

    records = [r for o in out for r in load(o)]
    again = rescore_all(records)
    if not again:
        raise typer.BadParameter(f"no run in {', '.join(map(str, out))} kept a journal")
    report(again)


if __name__ == "__main__":
    app()
