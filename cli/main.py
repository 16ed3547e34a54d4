"""`artemis`: watch a job (`artemis run`), run the simulated cluster (`artemis sim`, `artemis demo`),
read what was found (`artemis report`, `artemis incidents`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from artemis import sim as sim_package
from artemis.cli.incidents import app as incidents_app
from artemis.cli.regress import regress as regress_command
from artemis.common.exits import exit_error
from artemis.sim.scenario import ScenarioError

app = typer.Typer(
    help=(
        "Artemis finds the rank that slows a synchronous training job and says why.\n\n"
        "  artemis run -- torchrun ... train.py   watch a job: agent + coordinator around it\n"
        "  artemis demo                      the flagship job live (a straggler appears at "
        "window 16)\n"
        "  artemis sim --scenario F --jsonl OUT   run a scenario file, findings to OUT\n"
        "  artemis sim ... --store sqlite:///S.db  runs sharing a store: baselines across jobs\n"
        "  artemis report --findings F --out DIR   an HTML incident report per job\n"
        "  artemis incidents list --findings OUT  the incidents of a run (show ID: one)\n"
        "  artemis regress --store URL            this node's micro-benchmark against its "
        "baseline"
    ),
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(incidents_app, name="incidents")
app.command("regress")(regress_command)

# The scenario files ship with the simulator (package data of artemis.sim).
SCENARIOS = Path(sim_package.__file__).resolve().parent / "scenarios"
# The port of the coordinator a command starts itself (`artemis sim`, `artemis run`).
MetricsPort = Annotated[
    int | None, typer.Option(help="Coordinator's Prometheus port (default: a free one).")
]


def _setup_logs(json_logs: bool = False) -> None:
    from artemis.common.logs import setup_logging

    setup_logging(json_logs=json_logs)


@app.command()
def sim(
    scenario: Annotated[Path, typer.Option(help="Scenario TOML file (see docs/DESIGN.md).")],
    jsonl: Annotated[Path, typer.Option(help="Where the findings JSONL goes.")],
    plans_jsonl: Annotated[
        Path | None, typer.Option(help="Where rebalance plan events go (JSONL).")
    ] = None,
    metrics_port: MetricsPort = None,
    speed: Annotated[
        str, typer.Option(help="virtual: as fast as the pipeline allows; realtime: true step time.")
    ] = "virtual",
    rebalance: Annotated[
        str | None, typer.Option(help="Override [detector].rebalance: off|recommend|apply.")
    ] = None,
    corrections: Annotated[
        str | None, typer.Option(help="Override [detector].corrections: off|recommend|apply.")
    ] = None,
    workdir: Annotated[
        Path | None,
        typer.Option(help="Keep shm dirs, configs and logs here (default: a temp dir)."),
    ] = None,
    timeout_s: Annotated[float, typer.Option(help="Give up after this many seconds.")] = 300.0,
    report_dir: Annotated[
        Path | None,
        typer.Option(help="Write the job's incident report (HTML) here when it ends."),
    ] = None,
    store: Annotated[
        str | None,
        typer.Option(
            help="The coordinator's store URL (sqlite:///PATH, postgresql://...; default: a "
            "file next to the findings). Runs that share one compare each job with the "
            "stored baseline of its workload: change and regression findings."
        ),
    ] = None,
) -> None:
    """Run a whole simulated cluster for one scenario; exit 0 when the run completed."""
    from artemis.sim.cluster import SimCluster, SimOptions

    _setup_logs()
    if speed not in ("virtual", "realtime"):
        raise typer.BadParameter("expected virtual or realtime", param_hint="--speed")
    for hint, mode in (("--rebalance", rebalance), ("--corrections", corrections)):
        if mode not in (None, "off", "recommend", "apply"):
            raise typer.BadParameter("expected off, recommend or apply", param_hint=hint)
    if store is not None:
        from artemis.store.sink import check_setting

        bad = check_setting(store)
        if bad is not None:
            raise typer.BadParameter(bad, param_hint="--store")
    try:
        cluster = SimCluster(
            scenario,
            SimOptions(
                jsonl=jsonl,
                plans_jsonl=plans_jsonl,
                metrics_port=metrics_port,
                speed=speed,
                rebalance=rebalance,
                corrections=corrections,
                workdir=workdir,
                keep_workdir=workdir is not None,
                timeout_s=timeout_s,
                report_dir=report_dir,
                store=store,
            ),
        )
    except ScenarioError as e:
        exit_error(e)
    res = cluster.run()
    typer.echo(
        f"{'completed' if res.ok else 'FAILED'}: {res.windows_scored} windows scored in "
        f"{res.elapsed_s:.1f} s; findings in {res.findings}"
        + (f" ({res.reason})" if res.reason else "")
    )
    raise typer.Exit(0 if res.ok else 1)


@app.command()
def demo(
    scenario: Annotated[Path, typer.Option(help="Scenario to show.")] = SCENARIOS / "flagship.toml",
    rebalance: Annotated[
        str, typer.Option(help="off | recommend | apply: let Artemis move work off the straggler.")
    ] = "off",
    metrics_port: Annotated[int, typer.Option(help="Prometheus endpoint for Grafana.")] = 9464,
    window_s: Annotated[float, typer.Option(help="Wall seconds per window of 50 steps.")] = 1.0,
    out: Annotated[
        Path, typer.Option(help="Folder for findings, plans, incidents, the store and reports/.")
    ] = Path("out"),
) -> None:
    """The flagship job live: 4 NVIDIA + 4 AMD ranks, rank 2's clocks drop at window 16."""
    from artemis.sim.cluster import SimCluster, SimContext, SimOptions
    from artemis.sim.live import LiveState, summary_lines
    from rich.console import Console
    from rich.live import Live

    _setup_logs()
    console = Console()
    out.mkdir(parents=True, exist_ok=True)
    findings, plans = out / "findings.jsonl", out / "plans.jsonl"
    state = LiveState(
        metrics_url=f"http://127.0.0.1:{metrics_port}/metrics",
        findings_path=findings,
        plans_path=plans,
        title=f"Artemis demo: {scenario.name} (rebalance {rebalance})",
    )
    live = Live(state.render(), console=console, refresh_per_second=4)
    last = [0.0]

    def tick(ctx: SimContext) -> None:
        now = time.monotonic()
        if now - last[0] >= 0.25:
            last[0] = now
            state.refresh(now - ctx.started)
            live.update(state.render())

    try:
        cluster = SimCluster(
            scenario,
            SimOptions(
                jsonl=findings,
                plans_jsonl=plans,
                metrics_port=metrics_port,
                speed="realtime",
                window_s=window_s,
                rebalance=rebalance,
                on_tick=tick,
                timeout_s=600,
                report_dir=out / "reports",
            ),
        )
    except ScenarioError as e:
        exit_error(e)
    console.print(
        f"Prometheus metrics on http://127.0.0.1:{metrics_port}/metrics; findings -> {findings}"
    )
    with live:
        res = cluster.run()
        state.refresh(res.elapsed_s)
        live.update(state.render())
    console.rule("summary")
    for line in summary_lines(state.findings, state.plans):
        console.print(line)
    console.print(
        f"{res.windows_scored} windows scored in {res.elapsed_s:.0f} s"
        + ("" if res.ok else f"; run failed: {res.reason}")
    )
    reports = sorted((out / "reports").glob("*.html"))
    if reports:
        console.print(f"incident report: {reports[-1]} (open it in a browser)")
    raise typer.Exit(0 if res.ok else 1)


@app.command()
def loadtest(
    coordinator: Annotated[
        str,
        typer.Option(
            help=(
                "The coordinator's HOST:PORT, or a fleet's: H1:P1,H2:P2 or a name resolving"
                " to several addresses (each simulated agent follows redirects)."
            )
        ),
    ],
    secret_file: Annotated[Path, typer.Option(help="The shared secret (a 0600 file).")],
    ranks: Annotated[int, typer.Option(min=1, help="Ranks in the synthetic job.")],
    ranks_per_agent: Annotated[int, typer.Option(min=1, help="Ranks each simulated agent owns.")],
    windows: Annotated[int, typer.Option(min=1, help="Windows to send.")],
    window_s: Annotated[float, typer.Option(min=0.0, help="Seconds between windows.")] = 1.0,
    straggler: Annotated[
        list[str] | None,
        typer.Option(
            help=(
                "RANK:SLOWDOWN, SLOWDOWN a step-time factor > 1: 17:1.3 makes rank 17 30%"
                " slower (scenario files give a fraction instead: slowdown = 0.3). Repeat"
                " for more than one."
            )
        ),
    ] = None,
    job: Annotated[str, typer.Option(help="Job id the summaries carry.")] = "loadtest",
    ack_timeout_s: Annotated[
        float, typer.Option(help="Give up waiting for the last acks after this long.")
    ] = 120.0,
    connect_timeout_s: Annotated[
        float, typer.Option(help="Give up when the agents are not all connected by then.")
    ] = 60.0,
) -> None:
    """Play many agents over the real protocol (HMAC auth, columnar windows), one window per
    --window-s; exit 0 when every summary was acknowledged. Check the coordinator's own
    outputs (findings JSONL, /metrics) for what it made of them."""
    import asyncio

    from artemis.common.aio import run
    from artemis.protocol.auth import SecretFileError, load_secret
    from artemis.sim.loadtest import LoadSpec, parse_straggler, run_load

    _setup_logs()
    try:
        secret = load_secret(secret_file)
    except SecretFileError as e:
        raise typer.BadParameter(str(e), param_hint="--secret-file") from None
    try:
        slow = dict(parse_straggler(s) for s in (straggler or []))
        spec = LoadSpec(
            coordinator=coordinator,
            secret=secret,
            ranks=ranks,
            ranks_per_agent=ranks_per_agent,
            windows=windows,
            window_s=window_s,
            stragglers=slow,
            job=job,
            ack_timeout_s=ack_timeout_s,
            connect_timeout_s=connect_timeout_s,
        )
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    try:
        res = run(run_load(spec))
    except (TimeoutError, asyncio.TimeoutError):  # distinct types before Python 3.11
        typer.echo(
            f"loadtest {job}: not every agent could connect to {coordinator} within"
            f" {spec.connect_timeout_s:g} s (is it listening, and is the secret the same?)",
            err=True,
        )
        raise typer.Exit(1) from None
    typer.echo(
        f"loadtest {job}: {spec.agents} agents, {ranks} ranks, {windows} windows:"
        f" {res.acked}/{res.sent} summaries acknowledged in {res.messages} messages;"
        f" connect {res.connect_s:.2f} s, send+ack {res.send_s:.2f} s"
        + (f", {res.late_windows} windows started late" if res.late_windows else "")
    )
    raise typer.Exit(0 if res.ok else 1)


@app.command(
    context_settings={"allow_interspersed_args": False},
    help=(
        "Run COMMAND under a one-node Artemis (real coordinator and agent on loopback).\n\n"
        "  artemis run --jsonl findings.jsonl -- torchrun --nproc-per-node 4 train.py\n\n"
        "NCCL jobs need no change; gloo jobs use dist.init_process_group('artemis').\n\n"
        "Kept in ./artemis-out/JOB/: findings, incidents, plans, the HTML report when there"
        " was an incident, and state/ (journal, dumps, store)."
    ),
)
def run(
    command: Annotated[list[str] | None, typer.Argument(help="The job: COMMAND ARGS...")] = None,
    jsonl: Annotated[
        Path | None,
        typer.Option(help="Findings JSONL (default: ./artemis-out/JOB/findings.jsonl)."),
    ] = None,
    plans_jsonl: Annotated[
        Path | None,
        typer.Option(help="Rebalance plan events JSONL (default: ./artemis-out/JOB/plans.jsonl)."),
    ] = None,
    metrics_port: MetricsPort = None,
    rebalance: Annotated[
        str | None, typer.Option(help="off | recommend | apply (default: the config's).")
    ] = None,
    corrections: Annotated[
        str | None,
        typer.Option(help="GPU corrections: off | recommend | apply (default: the config's)."),
    ] = None,
    window_steps: Annotated[int, typer.Option(help="Steps per window (the agent's).")] = 50,
    colls_per_step: Annotated[
        int, typer.Option(help="Collectives per step (0: inferred by the agent).")
    ] = 0,
    config: Annotated[Path | None, typer.Option(help="A coordinator TOML.")] = None,
    job: Annotated[str | None, typer.Option(help="Job id (ARTEMIS_JOB; default: fresh).")] = None,
    keep_workdir: Annotated[
        bool, typer.Option("--keep-workdir", help="Keep the private folder (logs, rings).")
    ] = False,
    summary_json: Annotated[
        Path | None,
        typer.Option(help="Write the end summary as one JSON object (docs/DESIGN.md)."),
    ] = None,
) -> None:
    from artemis.cli.run import RunError, RunOptions
    from artemis.cli.run import run as run_job

    try:
        code = run_job(
            RunOptions(
                command=command or [],
                jsonl=jsonl,
                plans_jsonl=plans_jsonl,
                metrics_port=metrics_port,
                rebalance=rebalance,
                corrections=corrections,
                window_steps=window_steps,
                colls_per_step=colls_per_step,
                config=config,
                job=job,
                keep_workdir=keep_workdir,
                summary_json=summary_json,
            )
        )
    except RunError as e:
        exit_error(e)
    raise typer.Exit(code)


# `artemis report` lives in its own room (cli/report.py); registered here so that
# every operator command is under `artemis`.
from artemis.cli.report import report as _report  # noqa: E402

app.command("report")(_report)
