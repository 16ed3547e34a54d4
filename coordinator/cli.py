"""`artemis-coordinator`: serve agents, score windows, write findings; change settings live."""

from __future__ import annotations

import contextlib
import json
import os
import socket
from pathlib import Path
from typing import Annotated, Any

import typer
from artemis.common.daemon_cli import LogJson

app = typer.Typer(
    help=(
        "The Artemis coordinator: one per job or cluster. Agents connect to it; it scores "
        "every rank against its island's other ranks and its own history, and writes findings "
        "(JSONL, the `straggler` logger, Prometheus straggler_* metrics).\n\n"
        "  artemis-coordinator serve --config /etc/artemis/coordinator.toml\n"
        "  artemis-coordinator set suspect_ratio 1.15      (while it runs)\n"
        "  artemis-coordinator settings                    (show the live settings)\n"
        "  artemis-coordinator pending | approve ID | deny ID | correct INCIDENT ACTION"
    ),
    no_args_is_help=True,
    add_completion=False,
)


@app.command()
def serve(
    config: Annotated[
        Path | None, typer.Option(help="TOML config (see deploy/coordinator.toml).")
    ] = None,
    listen: Annotated[str | None, typer.Option(help="HOST:PORT agents connect to.")] = None,
    metrics_port: Annotated[
        int | None, typer.Option(help="Prometheus /metrics port (0 = off).")
    ] = None,
    jsonl: Annotated[Path | None, typer.Option(help="Findings, one JSON object per line.")] = None,
    plans_jsonl: Annotated[Path | None, typer.Option(help="Rebalance plan events (JSONL).")] = None,
    journal: Annotated[
        Path | None,
        typer.Option(help="Assembly journal (default: next to the findings, <findings>.assembly)."),
    ] = None,
    dumps_dir: Annotated[
        Path | None,
        typer.Option(help="Hang dumps folder (default: <findings stem>.dumps next to them)."),
    ] = None,
    secret_file: Annotated[
        Path | None, typer.Option(help="Shared secret (mode 0600) agents authenticate with.")
    ] = None,
    control_socket: Annotated[
        Path | None, typer.Option(help="Unix socket for `artemis-coordinator set`.")
    ] = None,
    store: Annotated[
        str | None,
        typer.Option(
            help="Incident store: auto (artemis.db next to the findings), off, sqlite:///PATH"
            " or postgresql://USER:PASSWORD@HOST/DB."
        ),
    ] = None,
    report_dir: Annotated[
        Path | None, typer.Option(help="Write each job's HTML report here when it ends.")
    ] = None,
    fleet: Annotated[
        bool,
        typer.Option(
            "--fleet",
            help="One of a fleet of coordinators sharing the PostgreSQL --store ([fleet] enabled).",
        ),
    ] = False,
    fleet_id: Annotated[
        str | None, typer.Option(help="This coordinator's fleet id (default: hostname:port).")
    ] = None,
    advertise: Annotated[
        str | None,
        typer.Option(
            help="HOST:PORT agents are redirected to (required when --listen is a wildcard)."
        ),
    ] = None,
    log_json: LogJson = False,
) -> None:
    """Run the coordinator until SIGTERM/SIGINT (then flush every output and exit)."""
    import functools

    from artemis.common.daemon_cli import run_daemon
    from artemis.coordinator.config import CoordinatorConfig
    from artemis.coordinator.server_main import main

    flags = {
        "listen": listen,
        "metrics_port": metrics_port,
        "jsonl": jsonl,
        "plans_jsonl": plans_jsonl,
        "journal": journal,
        "dumps_dir": dumps_dir,
        "secret_file": secret_file,
        "control_socket": control_socket,
        "store": store,
        "report_dir": report_dir,
        "log_json": log_json or None,
    }
    # [fleet] keys given as flags: merged into the table the file gave (server_main.main).
    fleet_flags = {"enabled": fleet or None, "id": fleet_id, "advertise": advertise}
    run_daemon(CoordinatorConfig, config, flags, functools.partial(main, fleet=fleet_flags))


def _ask(sock_path: Path, req: dict[str, Any]) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        try:
            s.connect(str(sock_path))
        except PermissionError:
            typer.echo(
                f"error: permission denied on the coordinator's control socket {sock_path}: "
                "only its owner and group may change or read the settings",
                err=True,
            )
            raise typer.Exit(2) from None
        except OSError as e:
            typer.echo(
                f"error: cannot reach the coordinator at {sock_path}: {e.strerror or e} "
                "(is it running? see control_socket in its config)",
                err=True,
            )
            raise typer.Exit(2) from None
        s.sendall(json.dumps(req).encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    reply: dict[str, Any] = json.loads(buf or b"{}")
    return reply


def _ask_ok(sock_path: Path, req: dict[str, Any]) -> dict[str, Any]:
    """``_ask``, ending the command with the coordinator's error when it refuses."""
    reply = _ask(sock_path, req)
    if not reply.get("ok"):
        typer.echo(f"error: {reply.get('error', 'refused')}", err=True)
        raise typer.Exit(1)
    return reply


ControlSocket = Annotated[Path, typer.Option("--socket", help="The coordinator's control socket.")]
DEFAULT_SOCKET = Path("/run/artemis/coordinator.sock")


@app.command("set")
def set_(
    key: Annotated[str, typer.Argument(help="Setting name, e.g. suspect_ratio, rebalance.")],
    value: Annotated[str, typer.Argument(help="New value, e.g. 1.15 or apply.")],
    socket_path: ControlSocket = DEFAULT_SOCKET,
) -> None:
    """Change a detector setting of the running coordinator, without a restart."""
    reply = _ask_ok(socket_path, {"cmd": "set", "key": key, "value": value})
    v = reply["settings"][key]
    typer.echo(f"{key} = {','.join(v) if isinstance(v, list) else v}")  # a list as it is set


@app.command()
def settings(
    socket_path: ControlSocket = DEFAULT_SOCKET,
) -> None:
    """Print the running coordinator's settings (TOML-like)."""
    reply = _ask_ok(socket_path, {"cmd": "get"})
    for k, v in reply.get("settings", {}).items():
        typer.echo(f"{k} = {json.dumps(v)}")


@app.command()
def pending(socket_path: ControlSocket = DEFAULT_SOCKET) -> None:
    """List the corrections waiting for a person (corrections_approve), one JSON per line."""
    reply = _ask_ok(socket_path, {"cmd": "pending"})
    for p in reply.get("pending", []):
        typer.echo(json.dumps(p))
    if not reply.get("pending"):
        typer.echo("nothing waits for approval", err=True)


CorrectionId = Annotated[
    str, typer.Argument(metavar="ID", help="The correction's id (see pending).")
]


@app.command()
def approve(id_: CorrectionId, socket_path: ControlSocket = DEFAULT_SOCKET) -> None:
    """Approve a correction that waits: it is sent to its rank's agent now."""
    typer.echo(json.dumps(_ask_ok(socket_path, {"cmd": "approve", "id": id_})["correction"]))


@app.command()
def deny(id_: CorrectionId, socket_path: ControlSocket = DEFAULT_SOCKET) -> None:
    """Deny a correction that waits: nothing runs, the incident says so."""
    typer.echo(json.dumps(_ask_ok(socket_path, {"cmd": "deny", "id": id_})["correction"]))


IncidentId = Annotated[str, typer.Argument(help="An open incident's id.")]
ActionName = Annotated[str, typer.Argument(help="reset_clocks or restore_power_limit.")]


@app.command()
def correct(
    incident: IncidentId, action: ActionName, socket_path: ControlSocket = DEFAULT_SOCKET
) -> None:
    """Force a correction on an open incident (verified, and rolled back if it does not help)."""
    req = {"cmd": "correct", "incident": incident, "action": action}
    typer.echo(json.dumps(_ask_ok(socket_path, req)["correction"]))


def prepare_socket_path(path: str) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(p)
