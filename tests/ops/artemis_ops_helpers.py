"""Shared helpers of the ops tests (deploy/, grafana/): paths, tools, PromQL
expressions of the dashboard and the rules, metric names in the coordinator's
code, and process handling that never leaves anything running."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
GRAFANA = REPO / "grafana"
DASHBOARD = GRAFANA / "artemis-dashboard.json"
PROM_DIR = DEPLOY / "prometheus"
RULES = PROM_DIR / "artemis-rules.yml"
RULES_TEST = PROM_DIR / "artemis-rules.test.yml"
SCRAPE_CONFIG = PROM_DIR / "prometheus.yml"
SYSTEMD = DEPLOY / "systemd"
K8S = DEPLOY / "k8s"
VENV_BIN = Path(sys.executable).parent
INSTALL_HINT = "run tests/setup/install-prometheus.sh (make test does)"

# What the dashboard's template variables stand for when its expressions are
# run outside Grafana.
GRAFANA_SUBST = {
    "$__rate_interval": "5s",
    "$__interval": "5s",
    "$__range": "5m",
    "${datasource}": "",
}

METRIC_RE = re.compile(r"\bstraggler_[a-zA-Z0-9_]+")
# Suffixes prometheus_client (and the exposition format) add to a family name.
EXPOSED_SUFFIXES = ("", "_total", "_created", "_bucket", "_sum", "_count", "_info")


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found on PATH: {INSTALL_HINT}")
    return path


def console_script(name: str) -> Path:
    """The venv's console script (tests run with the venv's python)."""
    path = VENV_BIN / name
    if not path.exists():
        found = shutil.which(name)
        if found is None:
            pytest.fail(f"console script {name} is not installed (pip install -e .)")
        path = Path(found)
    return path


def load_yaml(path: Path) -> Any:
    yaml = pytest.importorskip("yaml", reason="PyYAML is in the dev extra: pip install -e '.[dev]'")
    with path.open() as f:
        return yaml.safe_load(f)


def load_yaml_all(path: Path) -> list[Any]:
    yaml = pytest.importorskip("yaml", reason="PyYAML is in the dev extra: pip install -e '.[dev]'")
    with path.open() as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def load_dashboard() -> dict[str, Any]:
    with DASHBOARD.open() as f:
        return json.load(f)


def iter_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from iter_panels(p.get("panels", []))


def dashboard_exprs(dash: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, raw PromQL) for every panel target and annotation."""
    out: list[tuple[str, str]] = []
    for p in iter_panels(dash["panels"]):
        for t in p.get("targets", []):
            if t.get("expr"):
                out.append((f"panel {p['title']!r} target {t.get('refId')}", t["expr"]))
    for a in dash.get("annotations", {}).get("list", []):
        if a.get("expr"):
            out.append((f"annotation {a['name']!r}", a["expr"]))
    return out


LABEL_VALUES_RE = re.compile(
    r"^label_values\((?:(?P<sel>.+),\s*)?(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)\)$"
)


def variable_queries(dash: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(name, selector, label) of every label_values() template variable."""
    out = []
    for v in dash["templating"]["list"]:
        if v.get("type") != "query":
            continue
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        m = LABEL_VALUES_RE.match(q.strip())
        assert m, f"variable {v['name']}: unsupported query {q!r}"
        out.append((v["name"], m.group("sel") or "", m.group("label")))
    return out


def substitute(expr: str, job: str, extra: dict[str, str] | None = None) -> str:
    subst = {"$job": job, "$instance": ".*", "$island": ".*", **GRAFANA_SUBST, **(extra or {})}
    # Longest names first so $__rate_interval is not eaten by a shorter name.
    for k in sorted(subst, key=len, reverse=True):
        expr = expr.replace(k, subst[k])
    assert "$" not in expr, f"unsubstituted variable in {expr!r}"
    return expr


def rule_list() -> list[dict[str, Any]]:
    doc = load_yaml(RULES)
    return [r for g in doc["groups"] for r in g["rules"]]


def referenced_metrics(exprs: list[str]) -> set[str]:
    names: set[str] = set()
    for e in exprs:
        names.update(METRIC_RE.findall(e))
    return names


def coordinator_metric_names() -> set[str]:
    """straggler_* names written in the coordinator's code (any .py under coordinator/, and
    under rebalance/, whose outputs module defines the plan metrics the coordinator serves)."""
    names: set[str] = set()
    for room in ("coordinator", "rebalance"):
        for py in sorted((REPO / room).rglob("*.py")):
            names.update(METRIC_RE.findall(py.read_text(errors="replace")))
    return names


def exposed_names(code_names: set[str]) -> set[str]:
    out: set[str] = set()
    for n in code_names:
        base = n[: -len("_total")] if n.endswith("_total") else n
        for s in EXPOSED_SUFFIXES:
            out.add(n + s)
            out.add(base + s)
    return out


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM the process group we started, then SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout)


def tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "<no output>"
