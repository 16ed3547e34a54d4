"""``artemis-agent``: the node agent's command line.

Each command is a small function over the ring reader; the long-running
``run`` command (the agent daemon) lives here too.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from artemis.agent.plugin_path import PluginNotFoundError, plugin_path
from artemis.common.daemon_cli import LogJson
from artemis.ring.reader import ReadBatch, RingError, RingReader, records_to_dicts

DEFAULT_SHM_DIR = "/dev/shm/artemis"
EXIT_BAD_INPUT = 2

app = typer.Typer(
    help="Artemis node agent: reads the profiler plugin's rings and reports to the coordinator.",
    no_args_is_help=True,
    add_completion=False,
)


def _fail(message: str) -> typer.Exit:
    typer.echo(f"artemis-agent: {message}", err=True)
    return typer.Exit(EXIT_BAD_INPUT)


@app.command("plugin-path")
def plugin_path_cmd() -> None:
    """Print the absolute path of the profiler plugin (for NCCL_PROFILER_PLUGIN)."""
    try:
        typer.echo(str(plugin_path()))
    except PluginNotFoundError as e:
        raise _fail(str(e)) from None


@app.command("dump-ring")
def dump_ring(
    path: Annotated[
        Path, typer.Argument(help="A ring file, e.g. /dev/shm/artemis/<job>.<comm>.r0.ring")
    ],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing records as they complete.")
    ] = False,
    interval: Annotated[
        float, typer.Option(help="Seconds between polls with --follow.", min=0.001)
    ] = 0.2,
) -> None:
    """Print a ring's records as JSON lines (in-flight ones too, marked "in_flight").

    With --follow, keep printing records as they complete until the writer marks
    the ring finished. Records lost to overwrite are reported on stderr.
    """
    try:
        reader = RingReader(path)
    except RingError as e:
        raise _fail(str(e)) from None
    shown_in_flight: set[int] = set()
    lost = 0
    with reader:
        while True:
            # Read `finished` before the poll: a ring marked finished gets no
            # writes after the mark, so this poll then drains it completely.
            finished = reader.header().finished
            batch = reader.poll()
            lost += batch.lost
            header = reader.header()
            recs = _to_print(batch, shown_in_flight, header.capacity)
            for d in records_to_dicts(recs, header):
                sys.stdout.write(json.dumps(d) + "\n")
            sys.stdout.flush()
            if not follow or finished:
                break
            time.sleep(interval)
    if lost:
        typer.echo(f"artemis-agent: {lost} record(s) lost to overwrite in {path}", err=True)


def _to_print(batch: ReadBatch, shown_in_flight: set[int], capacity: int) -> np.ndarray:
    """Done records plus in-flight ones not printed before, in seq order.

    ``shown_in_flight`` remembers in-flight records already printed so --follow
    prints each once as in_flight and once more when it completes; it forgets
    them when they complete or leave the ring, so it stays bounded.
    """
    shown_in_flight.difference_update(batch.done["seq"].tolist())
    floor = batch.write_index - capacity
    shown_in_flight.difference_update([s for s in shown_in_flight if s < floor])
    fly = batch.in_flight
    if not len(fly):
        return batch.done
    fresh = fly[~np.isin(fly["seq"], np.fromiter(shown_in_flight, np.uint64))]
    shown_in_flight.update(fresh["seq"].tolist())
    both = np.concatenate((batch.done, fresh))
    return both[np.argsort(both["seq"], kind="stable")]


def _shm_default() -> str:
    return os.environ.get("ARTEMIS_SHM_DIR", DEFAULT_SHM_DIR)


@app.command("rings")
def rings(
    shm_dir: Annotated[
        Path | None,
        typer.Option(
            "--shm-dir", help="Ring folder (default: $ARTEMIS_SHM_DIR or /dev/shm/artemis)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per ring.")] = False,
) -> None:
    """List the rings in the shared-memory folder: job, comm, rank, pid, records, lost."""
    folder = shm_dir if shm_dir is not None else Path(_shm_default())
    if not folder.is_dir():
        raise _fail(f"{folder}: no such ring folder")
    rows: list[dict[str, object]] = []
    bad = 0
    for p in sorted(folder.glob("*.ring")):
        try:
            with RingReader(p) as r:
                batch = r.poll()
                h = r.header()
        except RingError as e:
            typer.echo(f"artemis-agent: {e}", err=True)
            bad += 1
            continue
        rows.append(
            {
                "path": str(p),
                "job": h.job,
                "comm": h.comm,
                "rank": h.rank,
                "nranks": h.nranks,
                "pid": h.pid,
                "records": batch.write_index,
                "in_flight": len(batch.in_flight),
                "lost": batch.lost,
                "dropped": h.dropped,
                "finished": h.finished,
                "clock": h.clock_kind,
                "plugin_version": h.plugin_version,
                "minor": h.minor,  # ring format minor: 0 = a plugin older than the field
                "slot_minor": h.slot_minor,
                "tick_source": h.tick_source,
                "writer_flags": h.writer_flags,
                "nccl_version": h.nccl_version,
            }
        )
    if as_json:
        for row in rows:
            sys.stdout.write(json.dumps(row) + "\n")
    else:
        _print_table(folder, rows)
    if bad:
        raise typer.Exit(EXIT_BAD_INPUT)


def _print_table(folder: Path, rows: list[dict[str, object]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"rings in {folder}")
    cols = ("job", "comm", "rank", "pid", "records", "in_flight", "lost", "dropped", "finished")
    for c in cols:
        table.add_column(c, justify="right" if c not in ("job", "comm") else "left")
    for row in rows:
        table.add_row(*(str(row[c]) for c in cols))
    Console(width=140).print(table)


@app.command("run")
def run_cmd(
    config: Annotated[
        Path | None, typer.Option(help="TOML config (see deploy/agent.toml).")
    ] = None,
    coordinator: Annotated[
        str | None,
        typer.Option(
            help=(
                "HOST:PORT of the coordinator, or of a fleet's: a comma-separated list"
                " H1:P1,H2:P2 or a name resolving to several addresses. The agent starts on"
                " the first that answers and follows its redirects to each job's owner."
            )
        ),
    ] = None,
    shm_dir: Annotated[
        Path | None, typer.Option(help="Where the plugin writes rings (default /dev/shm/artemis).")
    ] = None,
    secret_file: Annotated[
        Path | None, typer.Option(help="Shared secret file (mode 0600), same as the coordinator's.")
    ] = None,
    host: Annotated[
        str | None, typer.Option(help="Name this node reports (default hostname).")
    ] = None,
    log_json: LogJson = False,
) -> None:
    """Run the node agent: read rings, summarise windows, ship them to the coordinator."""
    from artemis.agent.config import AgentConfig
    from artemis.agent.run_main import main
    from artemis.common.daemon_cli import run_daemon

    flags = {
        "coordinator": coordinator,
        "shm_dir": shm_dir,
        "secret_file": secret_file,
        "host": host,
        "log_json": log_json or None,
    }
    run_daemon(AgentConfig, config, flags, main)
