"""``backend="artemis"`` with no ``import artemis.job``: torch's ``torch.backends`` autoload.

pyproject.toml declares the entry point; torch calls it at the end of ``import torch``
(``torch._import_device_backends``) unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``. Every
check runs a fresh interpreter, as a job's would.

The entry point exists once ``pip install -e .`` has run with today's pyproject.toml.
Where the installed metadata predates it, the subprocesses see a stand-in
``artemis-*.dist-info`` made from pyproject.toml's own table (the form pip writes), so
what is tested is still torch's real discovery of the declared entry point.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from artemis.common.tomlfile import read_toml

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
GROUP = "torch.backends"
VALUE = "artemis.job._autoload:register"


def _declared() -> dict[str, str]:
    return dict(read_toml(ROOT / "pyproject.toml")["project"]["entry-points"][GROUP])


def _env(tmp_path: Path, autoload: bool) -> dict[str, str]:
    """The subprocess environment: autoload on or off, and the entry point visible."""
    env = dict(os.environ)
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "1" if autoload else "0"
    installed = [ep for ep in importlib.metadata.entry_points(group=GROUP) if ep.name == "artemis"]
    assert all(ep.value == VALUE for ep in installed), installed
    if not installed:  # an install from before the entry point: stand in for pip's metadata
        dist_info = tmp_path / "standin" / "artemis-0.1.0.dist-info"
        dist_info.mkdir(parents=True, exist_ok=True)
        (dist_info / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: artemis\nVersion: 0.1.0\n"
        )
        lines = "".join(f"{k} = {v}\n" for k, v in _declared().items())
        (dist_info / "entry_points.txt").write_text(f"[{GROUP}]\n{lines}")
        env["PYTHONPATH"] = os.pathsep.join(
            [str(dist_info.parent), *filter(None, [env.get("PYTHONPATH")])]
        )
    return env


def _python(code: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_pyproject_declares_the_autoload_entry_point() -> None:
    assert _declared() == {"artemis": VALUE}


_LOADED = """
import json, sys
import torch, torch.distributed as dist
print(json.dumps({
    "registered": "ARTEMIS" in dist.Backend._plugins,
    "artemis": sorted(m for m in sys.modules if m.startswith("artemis")),
}))
"""


def test_import_torch_registers_the_backend_lazily_and_autoload_0_turns_it_off(
    tmp_path: Path,
) -> None:
    on = _python(_LOADED, _env(tmp_path, True))
    assert on.returncode == 0, on.stderr
    got = json.loads(on.stdout.splitlines()[-1])
    assert got["registered"]
    # only the stub: the backend (and its torch-heavy imports) load when a group is made
    assert got["artemis"] == ["artemis", "artemis.job", "artemis.job._autoload"]
    off = _python(_LOADED, _env(tmp_path, False))
    assert off.returncode == 0, off.stderr
    assert json.loads(off.stdout.splitlines()[-1]) == {"registered": False, "artemis": []}


_FIRST_RUN = """
import sys
import torch, torch.distributed as dist
dist.init_process_group(backend="artemis", init_method="file://" + sys.argv[1], rank=0, world_size=1)
t = torch.ones(3)
dist.all_reduce(t)
print(dist.get_backend(), t.tolist(), "artemis.job.backend" in sys.modules)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_script_with_no_artemis_import_runs_on_the_backend(tmp_path: Path) -> None:
    env = _env(tmp_path, True)
    env["ARTEMIS_SHM_DIR"], env["ARTEMIS_JOB"] = str(tmp_path / "shm"), "autoload"
    run = _python(_FIRST_RUN, env, str(tmp_path / "init"))
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[0] == "artemis [1.0, 1.0, 1.0] True"
    assert list((tmp_path / "shm").glob("autoload.*.ring"))  # the collective was recorded
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    off = _python(_FIRST_RUN, env, str(tmp_path / "init-off"))
    assert off.returncode != 0
    assert "Unknown backend type artemis" in off.stderr  # torch's own error


# One fresh interpreter per sample, timing the real `import torch`: torch's autoload
# step is timed from just after its scan of the installed metadata (which it makes
# with or without artemis) to just after its last entry point ran, with artemis's
# entry point in the list ("on") or filtered out ("off"). The difference is what the
# artemis entry point adds to `import torch`. The bound is on CPU time (the cost to the
# job); wall time, which the scheduler of a shared machine inflates by tens of ms
# either way, is reported alongside.
_COST = """
import importlib.metadata as md, sys, time
real, got = md.entry_points, {}

class Stop:  # the last entry point torch runs: the end of its autoload step
    name = "stop"
    def load(self):
        c, w = time.process_time(), time.perf_counter()
        got.update(cpu=c - got["cpu0"], wall=w - got["wall0"])
        return lambda: None

def entry_points(**kw):
    eps = real(**kw)
    if kw.get("group") != "torch.backends":
        return eps
    keep = [e for e in eps if sys.argv[1] == "on" or e.name != "artemis"]
    got.update(cpu0=time.process_time(), wall0=time.perf_counter())
    return [*keep, Stop()]

md.entry_points = entry_points
import torch
assert ("artemis.job._autoload" in sys.modules) == (sys.argv[1] == "on")
print(got["cpu"], got["wall"])
"""


@pytest.mark.slow
def test_the_autoload_adds_at_most_5_ms_to_import_torch(tmp_path: Path) -> None:
    env = _env(tmp_path, True)
    cpu: dict[str, list[float]] = {"on": [], "off": []}
    wall: dict[str, list[float]] = {"on": [], "off": []}
    for _ in range(5):  # interleaved, so load on the machine falls on both arms alike
        for arm in ("off", "on"):
            run = _python(_COST, env, arm)
            assert run.returncode == 0, run.stderr
            c, w = (float(x) for x in run.stdout.split()[-2:])
            cpu[arm].append(c)
            wall[arm].append(w)

    def added_ms(d: dict[str, list[float]]) -> float:
        return (statistics.median(d["on"]) - statistics.median(d["off"])) * 1e3

    print(f"autoload adds {added_ms(cpu):.2f} ms CPU, {added_ms(wall):.2f} ms wall (medians of 5)")
    assert added_ms(cpu) <= 5.0, cpu
