"""Static checks of everything an operator installs: Prometheus config and
alerting rules (promtool), systemd units (systemd-analyze), sysusers/tmpfiles
snippets (run against a scratch root), Kubernetes and Grafana files, example
configs, the job-side scripts, and that every metric the dashboard and the
rules use is one the coordinator's code defines."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from artemis_ops_helpers import (
    DASHBOARD,
    DEPLOY,
    GRAFANA,
    K8S,
    PROM_DIR,
    RULES,
    RULES_TEST,
    SCRAPE_CONFIG,
    SYSTEMD,
    console_script,
    coordinator_metric_names,
    dashboard_exprs,
    exposed_names,
    iter_panels,
    load_dashboard,
    load_yaml,
    load_yaml_all,
    referenced_metrics,
    rule_list,
    tool,
    variable_queries,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

UNITS = ("artemis-agent.service", "artemis-coordinator.service")
# `artemis regress` on a timer (docs/OPERATING.md "Regressions across changes").
REGRESS_UNITS = ("artemis-regress.service", "artemis-regress.timer")
# Series of the coordinator process as a whole: they carry no job label.
PROCESS_WIDE = {
    "straggler_detector_active",
    "straggler_agents_connected",
    "straggler_protocol_frames_total",
    "straggler_protocol_bad_frames_total",
    "straggler_protocol_refused_peers_total",
    "straggler_protocol_duplicates_total",
    "straggler_store_writes_dropped_total",
    "straggler_store_queue_depth",
    "straggler_store_connected",
}


def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kw)  # type: ignore[call-overload]


# ---- Prometheus -----------------------------------------------------------


def test_promtool_check_config() -> None:
    r = run([tool("promtool"), "check", "config", str(SCRAPE_CONFIG)])
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_check_rules() -> None:
    r = run([tool("promtool"), "check", "rules", str(RULES)])
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_test_rules() -> None:
    r = run([tool("promtool"), "test", "rules", RULES_TEST.name], cwd=PROM_DIR)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_every_alert_is_tested_and_documented() -> None:
    rules = rule_list()
    tested = {
        a["alertname"] for t in load_yaml(RULES_TEST)["tests"] for a in t.get("alert_rule_test", [])
    }
    for r in rules:
        name = r["alert"]
        assert name in tested, f"{name} has no promtool unit test"
        assert r["labels"].get("severity") in {"warning", "critical"}, name
        for key in ("summary", "description", "runbook"):
            assert r["annotations"].get(key), f"{name}: annotation {key} missing"
    # Positive cases: every alert fires in at least one test (not only exp_alerts: []).
    firing = {
        a["alertname"]
        for t in load_yaml(RULES_TEST)["tests"]
        for a in t.get("alert_rule_test", [])
        if a.get("exp_alerts")
    }
    assert {r["alert"] for r in rules} <= firing


def test_scrape_config_job_names_match_rules() -> None:
    jobs = {s["job_name"] for s in load_yaml(SCRAPE_CONFIG)["scrape_configs"]}
    used = set(re.findall(r'job="([^"]+)"', RULES.read_text()))
    assert used <= jobs, f"rules use scrape jobs {used - jobs} that prometheus.yml does not define"
    coord = next(
        s
        for s in load_yaml(SCRAPE_CONFIG)["scrape_configs"]
        if s["job_name"] == "artemis-coordinator"
    )
    assert all(t.endswith(":9464") for sc in coord["static_configs"] for t in sc["targets"])
    # The coordinator's own `job` label (the training job) must survive the scrape.
    assert coord.get("honor_labels") is True


# ---- metric names against the coordinator ----------------------------------


def test_dashboard_and_rules_use_only_metrics_the_coordinator_defines() -> None:
    dash = load_dashboard()
    exprs = [e for _, e in dashboard_exprs(dash)]
    exprs += [sel for _, sel, _ in variable_queries(dash)]
    exprs += [r["expr"] for r in rule_list()]
    used = referenced_metrics(exprs)
    assert used, "no straggler_* metric found in the dashboard and rules"
    defined = coordinator_metric_names()
    missing = sorted(n for n in used if n not in exposed_names(defined))
    assert not missing, (
        "metrics used by grafana/artemis-dashboard.json or deploy/prometheus/artemis-rules.yml "
        f"that no file under coordinator/ or rebalance/ defines: {missing}\n"
        f"(defined in coordinator/: {sorted(defined) or 'none yet'})"
    )


# ---- Grafana -------------------------------------------------------------


def test_dashboard_structure() -> None:
    dash = load_dashboard()
    assert dash["uid"] == "artemis-stragglers"
    assert dash["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    # Job: the training jobs (the `job` label of job-scoped series), per coordinator.
    job_q = variables["job"]["query"]
    assert re.fullmatch(
        r"label_values\(straggler_\w+(\{[^}]*\})?,\s*job\)",
        job_q["query"] if isinstance(job_q, dict) else job_q,
    )
    assert variables["job"]["multi"] and variables["job"]["includeAll"]

    ids = set()
    for p in iter_panels(dash["panels"]):
        assert p["id"] not in ids, f"duplicate panel id {p['id']}"
        ids.add(p["id"])
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        assert p.get("title")
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]
            assert t["expr"].strip(), p["title"]
    for where, expr in dashboard_exprs(dash):
        for var in re.findall(r"\$(\w+)", expr):
            assert var.startswith("__") or var in variables, f"{where}: unknown variable ${var}"
        # Job-scoped series are filtered by job; process-wide ones (no job label of
        # their own) by coordinator only.
        process_wide = referenced_metrics([expr]) <= PROCESS_WIDE
        want = 'instance=~"$instance"' if process_wide else 'job=~"$job"'
        assert want in expr, f"{where}: not filtered by {want}"
        if process_wide:
            assert "$job" not in expr, f"{where}: a process-wide series has no job label"
    titles = {p["title"] for p in iter_panels(dash["panels"])}
    for needed in (
        "Detector active",
        "Last window",
        "Ranks missing",
        "Flagged now",
        "Median step time",
        "Findings by kind and state",
        "GPU-hours lost",
        "Rebalance plans by status",
        "Throughput before / after rebalancing",
    ):
        assert needed in titles, needed
    assert any(t.startswith("Rank pace over its island") for t in titles)


def test_flagged_table_shows_cause_and_cost() -> None:
    dash = load_dashboard()
    table = next(p for p in iter_panels(dash["panels"]) if p["type"] == "table")
    exprs = " ".join(t["expr"] for t in table["targets"])
    for label in ("kind", "subject", "since", "cause"):
        assert label in exprs
    assert "straggler_finding_loss_pct" in exprs and "straggler_finding_excess_seconds" in exprs
    renamed = next(t for t in table["transformations"] if t["id"] == "organize")["options"][
        "renameByName"
    ]
    assert {"Kind", "Subject", "Since (window)", "Cause", "Cost (% of step)"} <= set(
        renamed.values()
    )


def test_grafana_provisioning() -> None:
    dashboards = load_yaml(GRAFANA / "provisioning/dashboards/artemis.yaml")
    assert dashboards["apiVersion"] == 1
    (prov,) = dashboards["providers"]
    assert prov["type"] == "file" and prov["options"]["path"].startswith("/")
    ds = load_yaml(GRAFANA / "provisioning/datasources/prometheus.yaml")
    assert ds["apiVersion"] == 1
    assert [d["type"] for d in ds["datasources"]] == ["prometheus"]
    assert DASHBOARD.stat().st_size > 0


# ---- systemd ---------------------------------------------------------------


def _unit_copy(tmp_path: Path, unit: str) -> Path:
    """The unit with ExecStart pointing at the venv's console script, so
    systemd-analyze can check that the binary exists and is executable (a timer:
    with the service it starts beside it)."""
    if unit.endswith(".timer"):
        _unit_copy(tmp_path, unit.removesuffix(".timer") + ".service")
        dst = tmp_path / unit
        dst.write_text((SYSTEMD / unit).read_text())
        return dst
    text = (SYSTEMD / unit).read_text()
    assert "ExecStart=/opt/artemis/bin/" in text
    for name in ("artemis-agent", "artemis-coordinator", "artemis"):
        text = text.replace(f"/opt/artemis/bin/{name} ", f"{console_script(name)} ")
    dst = tmp_path / unit
    dst.write_text(text)
    return dst


@pytest.mark.parametrize("unit", UNITS + REGRESS_UNITS)
def test_systemd_analyze_verify(tmp_path: Path, unit: str) -> None:
    path = _unit_copy(tmp_path, unit)
    r = run([tool("systemd-analyze"), "verify", "--man=no", str(path)], cwd=tmp_path)
    out = (r.stdout + r.stderr).strip()
    # Any warning (unknown key, bad value, missing binary) is a failure.
    assert r.returncode == 0 and not out, out


# The hardening every Artemis unit carries, in the order the tests check it.
HARDENED = (
    "User=artemis",
    "ProtectSystem=strict",
    "ProtectHome=yes",
    "PrivateTmp=yes",
    "NoNewPrivileges=yes",
    "CapabilityBoundingSet=\n",
)


@pytest.mark.parametrize("unit", UNITS)
def test_systemd_unit_hardening(unit: str) -> None:
    _security(unit)
    text = (SYSTEMD / unit).read_text()
    for line in (
        *HARDENED,
        "MemoryDenyWriteExecute=yes",
        "Restart=on-failure",
    ):
        assert line in text, f"{unit}: {line.strip()} missing"
    assert not re.search(r"^PrivateDevices=yes", text, re.M)  # would hide the GPUs and /dev/shm
    name = unit.removesuffix(".service")
    assert re.search(
        rf"^ExecStart=\S*/{name} {'run' if 'agent' in name else 'serve'} "
        rf"--config /etc/artemis/{name.split('-')[1]}.toml ",
        text,
        re.M,
    )
    assert f"EnvironmentFile=-/etc/default/{name}" in text


def _security(unit: str) -> None:
    r = run(
        [
            tool("systemd-analyze"),
            "security",
            "--offline=yes",
            "--threshold=25",
            "--no-pager",
            str(SYSTEMD / unit),
        ]
    )
    assert r.returncode == 0, f"exposure above 2.5:\n{r.stdout[-3000:]}{r.stderr}"


def test_regress_units() -> None:
    """Hardened as the daemons' units are; a oneshot started by a timer in a
    maintenance window, with flags `artemis regress` takes."""
    _security("artemis-regress.service")
    text = (SYSTEMD / "artemis-regress.service").read_text()
    for line in (
        "Type=oneshot",
        *HARDENED,
        "DevicePolicy=closed",
        "DeviceAllow=char-nvidia-frontend rw",
        "SystemCallFilter=@system-service",
        "EnvironmentFile=-/etc/default/artemis-regress",
        "StateDirectory=artemis",
    ):
        assert line in text, f"artemis-regress.service: {line.strip()} missing"
    assert "[Install]" not in text  # started by its timer, never enabled itself
    (exec_start,) = re.findall(r"^ExecStart=(.*)$", text, re.M)
    argv = exec_start.split()
    assert argv[:2] == ["/opt/artemis/bin/artemis", "regress"]
    flags = [a for a in argv if a.startswith("--")]
    assert {"--store", "--jsonl", "--textfile"} <= set(flags)
    r = run(
        [str(console_script("artemis")), "regress", "--help"], env={**os.environ, "COLUMNS": "200"}
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert not [f for f in flags if f not in r.stdout]
    timer = (SYSTEMD / "artemis-regress.timer").read_text()
    for line in ("OnCalendar=", "Persistent=true", "RandomizedDelaySec=", "WantedBy=timers.target"):
        assert line in timer, f"artemis-regress.timer: {line} missing"


@pytest.mark.parametrize(
    "smi,skips",
    [(None, False), ("", False), ("4242\n", True)],
    ids=["no-nvidia-smi", "gpus-idle", "gpus-busy"],
)
def test_regress_unit_skips_a_busy_node(tmp_path: Path, smi: str | None, skips: bool) -> None:
    """The unit's ExecCondition, run by sh as systemd would (`$$` is a literal `$`),
    against a stand-in nvidia-smi that lists compute processes or none."""
    text = (SYSTEMD / "artemis-regress.service").read_text()
    (cond,) = re.findall(r"^ExecCondition=/bin/sh -c '(.*)'$", text, re.M)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if smi is not None:
        (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\nprintf '{smi}'\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    r = run(["/bin/sh", "-c", cond.replace("$$", "$")], env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert r.returncode == (1 if skips else 0), r.stdout + r.stderr


def test_agent_unit_can_write_rings() -> None:
    text = (SYSTEMD / "artemis-agent.service").read_text()
    assert "ReadWritePaths=/dev/shm/artemis" in text
    assert "DevicePolicy=closed" in text
    for dev in ("char-nvidia-frontend", "char-kfd", "char-drm"):
        assert f"DeviceAllow={dev} rw" in text


def test_sysusers_and_tmpfiles_create_user_and_ring_folder(tmp_path: Path) -> None:
    """Run the real systemd-sysusers and systemd-tmpfiles against a scratch root."""
    root = tmp_path / "root"
    (root / "etc/sysusers.d").mkdir(parents=True)
    (root / "etc/tmpfiles.d").mkdir(parents=True)
    (root / "dev/shm").mkdir(parents=True)
    (root / "etc/sysusers.d/artemis.conf").write_text(
        (SYSTEMD / "artemis.sysusers.conf").read_text()
    )
    (root / "etc/tmpfiles.d/artemis.conf").write_text(
        (SYSTEMD / "artemis.tmpfiles.conf").read_text()
    )
    r = run([tool("systemd-sysusers"), f"--root={root}", "artemis.conf"])
    assert r.returncode == 0, r.stderr
    passwd = {
        line.split(":")[0]: line.split(":")
        for line in (root / "etc/passwd").read_text().splitlines()
    }
    assert "artemis" in passwd
    uid = int(passwd["artemis"][2])
    assert uid < 1000, "a system user"
    assert passwd["artemis"][6].endswith("nologin")
    r = run([tool("systemd-tmpfiles"), f"--root={root}", "--create", "artemis.conf"])
    assert r.returncode == 0, r.stderr
    st = (root / "dev/shm/artemis").stat()
    assert stat.S_ISDIR(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o1777
    assert st.st_uid == uid


# ---- Kubernetes, example configs --------------------------------------------


def test_k8s_manifests_parse() -> None:
    kinds: dict[str, dict] = {}
    for f in sorted(K8S.glob("*.yaml")):
        for doc in load_yaml_all(f):
            assert {"apiVersion", "kind", "metadata"} <= set(doc), f
            kinds[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    ds = kinds["DaemonSet/artemis-agent"]
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] and pod["tolerations"]
    paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert "/dev/shm/artemis" in paths
    assert any("secret" in v for v in pod["volumes"])
    agent = pod["containers"][0]
    assert agent["args"][:2] == ["artemis-agent", "run"]
    assert (
        ds["spec"]["selector"]["matchLabels"].items()
        <= ds["spec"]["template"]["metadata"]["labels"].items()
    )
    dep = kinds["Deployment/artemis-coordinator"]
    assert dep["spec"]["template"]["spec"]["containers"][0]["args"][:2] == [
        "artemis-coordinator",
        "serve",
    ]
    svc = kinds["Service/artemis-coordinator"]
    assert {p["port"] for p in svc["spec"]["ports"]} == {7470, 9464}
    assert svc["spec"]["selector"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    listen = tomllib.loads(kinds["ConfigMap/artemis-coordinator"]["data"]["coordinator.toml"])[
        "listen"
    ]
    assert int(listen.rsplit(":", 1)[1]) in {p["port"] for p in svc["spec"]["ports"]}


def _load_agent(path: Path) -> object:
    from artemis.agent.config import AgentConfig
    from artemis.common.tomlfile import load_config

    return load_config(AgentConfig, path, {}).validated()


def _load_coordinator(path: Path) -> object:
    from artemis.common.tomlfile import load_config
    from artemis.coordinator.config import CoordinatorConfig
    from artemis.detect.settings import Settings

    cfg = load_config(CoordinatorConfig, path, {}).validated()
    Settings.from_mapping(cfg.detector)  # thresholds and rebalance keys are valid
    return cfg


def test_example_configs_load_with_the_daemons_loaders() -> None:
    """deploy/*.toml through the daemons' own loaders: unknown keys or wrong types fail."""
    agent = tomllib.loads((DEPLOY / "agent.toml").read_text())
    for key in (
        "coordinator",
        "shm_dir",
        "secret_file",
        "host",
        "transport",
        "log_json",
        "window_steps",
        "colls_per_step",
        "telemetry",
        "rdma",
        "tls",
    ):
        assert key in agent, f"agent.toml does not document {key}"
    assert {"device", "port", "gid_index"} <= set(agent["rdma"])
    _load_agent(DEPLOY / "agent.toml")
    coord = tomllib.loads((DEPLOY / "coordinator.toml").read_text())
    for key in ("listen", "metrics_port", "jsonl", "plans_jsonl", "secret_file", "detector", "tls"):
        assert key in coord, f"coordinator.toml does not document {key}"
    assert coord["metrics_port"] == 9464
    assert coord["detector"]["rebalance"] in {"off", "recommend", "apply"}
    _load_coordinator(DEPLOY / "coordinator.toml")


def test_k8s_regress_cronjob() -> None:
    (cron,) = [d for d in load_yaml_all(K8S / "regress-cronjob.yaml") if d["kind"] == "CronJob"]
    assert cron["metadata"]["name"] == "artemis-regress"
    spec = cron["spec"]
    assert spec["concurrencyPolicy"] == "Forbid" and len(spec["schedule"].split()) == 5
    job = spec["jobTemplate"]["spec"]
    assert job["parallelism"] == job["completions"]  # one pod per node of the sweep
    pod = job["template"]["spec"]
    (anti,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    assert (
        anti["labelSelector"]["matchLabels"].items()
        <= job["template"]["metadata"]["labels"].items()
    )
    (c,) = pod["containers"]
    assert c["args"][:2] == ["artemis", "regress"]
    assert c["resources"]["limits"]["nvidia.com/gpu"]  # the whole node: only when idle
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert c["args"][c["args"].index("--node") + 1] == "$(NODE_NAME)"
    assert "secretKeyRef" in env["ARTEMIS_REGRESS_STORE"]["valueFrom"]  # the URL has a password
    flags = [a for a in c["args"] if a.startswith("--")]
    r = run(
        [str(console_script("artemis")), "regress", "--help"], env={**os.environ, "COLUMNS": "200"}
    )
    assert not [f for f in flags if f not in r.stdout]
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert {"/dev/shm", "/textfile", "/var/lib/artemis"} <= mounts


def test_k8s_configmaps_load_with_the_daemons_loaders(tmp_path: Path) -> None:
    loaders = {"agent.toml": _load_agent, "coordinator.toml": _load_coordinator}
    seen = set()
    for f in sorted(K8S.glob("*.yaml")):
        for doc in load_yaml_all(f):
            if doc["kind"] != "ConfigMap":
                continue
            for key, text in doc["data"].items():
                path = tmp_path / key
                path.write_text(text)
                loaders[key](path)
                seen.add(key)
    assert seen == set(loaders)


@pytest.mark.parametrize(
    "cmd,flags",
    [
        (
            ("artemis-agent", "run"),
            ("--config", "--secret-file", "--coordinator", "--host", "--shm-dir"),
        ),
        (
            ("artemis-coordinator", "serve"),
            ("--config", "--secret-file", "--listen", "--metrics-port", "--jsonl"),
        ),
    ],
)
def test_cli_accepts_the_flags_the_units_and_manifests_pass(
    cmd: tuple[str, str], flags: tuple[str, ...]
) -> None:
    r = run([str(console_script(cmd[0])), cmd[1], "--help"], env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, f"{' '.join(cmd)} --help failed:\n{r.stderr[-2000:]}"
    missing = [f for f in flags if f not in r.stdout]
    assert not missing, f"{' '.join(cmd)} lacks {missing}"


# ---- job-side scripts --------------------------------------------------------


SCRIPTS = sorted(DEPLOY.rglob("*.sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_scripts_parse_and_are_executable(script: Path) -> None:
    r = run(["bash", "-n", str(script)])
    assert r.returncode == 0, r.stderr
    assert os.access(script, os.X_OK)


def _task_prolog(tmp_path: Path, **env: str) -> list[str]:
    base = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "4242", "ARTEMIS_PLUGIN_DIR": str(tmp_path)}
    r = run(["bash", str(DEPLOY / "slurm/task_prolog.sh")], env={**base, **env})
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_slurm_task_prolog(tmp_path: Path) -> None:
    lib = "libnccl-profiler-artemis.so"  # NVIDIA and AMD nodes alike
    (tmp_path / lib).write_bytes(b"")
    assert _task_prolog(tmp_path) == []  # site default off, job did not opt in
    assert _task_prolog(tmp_path, ARTEMIS="0") == []
    out = _task_prolog(tmp_path, ARTEMIS="1")
    assert out == [
        f"export NCCL_PROFILER_PLUGIN={tmp_path / lib}",
        "export ARTEMIS_JOB=4242",
        "export ARTEMIS_SHM_DIR=/dev/shm/artemis",
    ]
    # The job's own plugin wins; a missing plugin leaves the job unwatched.
    out = _task_prolog(tmp_path, ARTEMIS="1", NCCL_PROFILER_PLUGIN="/x.so")
    assert [line.split()[0] for line in out] == ["print"]
    out = _task_prolog(tmp_path / "nowhere", ARTEMIS="1")
    assert [line.split()[0] for line in out] == ["print"]


def test_slurm_regress_runs_one_task_per_node(tmp_path: Path) -> None:
    """deploy/slurm/regress.sh with a stand-in srun (runs its command once, as on one
    node) and a stand-in artemis that prints its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(
        '#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n'
    )
    (bin_dir / "artemis").write_text('#!/bin/sh\necho "$@"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    text = tmp_path / "textfile"
    text.mkdir()
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "ARTEMIS": str(bin_dir / "artemis"),
        "ARTEMIS_REGRESS_STORE": "postgresql://artemis@db/artemis",
        "ARTEMIS_REGRESS_TEXTFILE": str(text),
    }
    r = run([str(DEPLOY / "slurm/regress.sh")], env=env)
    assert r.returncode == 0, r.stderr
    node = run(["hostname", "-s"]).stdout.strip()
    assert r.stdout.split() == [
        "regress",
        "--node",
        node,
        "--store",
        "postgresql://artemis@db/artemis",
        "--jsonl",
        f"{tmp_path}/artemis-regress-findings.jsonl.{node}",
        "--textfile",
        str(text),
    ]
    assert "#SBATCH --exclusive" in (DEPLOY / "slurm/regress.sh").read_text()


def test_torchrun_example_sets_plugin_and_job(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "artemis-agent").write_text("#!/bin/sh\necho /opt/x/libnccl-profiler-artemis.so\n")
    (bin_dir / "torchrun").write_text(
        '#!/bin/sh\necho "plugin=$NCCL_PROFILER_PLUGIN job=$ARTEMIS_JOB"\necho "args=$*"\n'
    )
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "RUN_ID": "run7", "NPROC_PER_NODE": "2"}
    r = run([str(DEPLOY / "torchrun/example.sh"), "train.py", "--lr", "1"], env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("plugin=/opt/x/lib") and lines[0].endswith(
        "-profiler-artemis.so job=run7"
    )
    assert "--nproc-per-node 2" in lines[1] and lines[1].endswith("train.py --lr 1")
