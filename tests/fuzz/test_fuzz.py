"""Coverage-guided fuzzing (atheris) of every parser that reads untrusted bytes.

``test_fuzz_target`` runs each harness of tests/fuzz/ for 6 s in a subprocess
(libFuzzer's ``-max_total_time``) from the generated seeds and the kept inputs;
any exception other than the target's documented refusal is a crash, and the
test fails showing it (libFuzzer keeps the input under the test's tmp dir: add
it to tests/fuzz/corpus/TARGET/ once fixed). ``test_kept_inputs_replay`` runs
every kept input through the same target function in-process, so a fixed crash
stays fixed without atheris. ``make fuzz`` runs the harnesses long.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fuzz_targets  # noqa: E402

FUZZ_SECONDS = int(os.environ.get("ARTEMIS_FUZZ_SECONDS", "6"))
# A fixed libFuzzer seed in the suite: the same inputs come in the same order on
# every run (how many fit in the budget still varies), so what the suite finds, a
# rerun finds again; `make fuzz` draws a new seed each time and goes further.
FUZZ_SEED = int(os.environ.get("ARTEMIS_FUZZ_SEED", "1"))


@pytest.mark.parametrize("target", sorted(fuzz_targets.TARGETS))
def test_fuzz_target(target: str, tmp_path: Path) -> None:
    pytest.importorskip("atheris", reason="atheris is in the dev extra (pip install -e .[dev])")
    corpus = tmp_path / "corpus"
    (tmp_path / "tmp").mkdir()
    proc = subprocess.run(
        [
            sys.executable,
            str(HERE / f"fuzz_{target}.py"),
            "--corpus",
            str(corpus),
            f"-max_total_time={FUZZ_SECONDS}",
            f"-artifact_prefix={tmp_path}/",
            "-timeout=10",
            "-rss_limit_mb=1024",
            "-print_final_stats=1",
            f"-seed={FUZZ_SEED}",
        ],
        capture_output=True,
        text=True,
        timeout=FUZZ_SECONDS + 120,
        # libFuzzer exits without Python's atexit: its scratch folders stay in tmp_path
        env={**os.environ, "TMPDIR": str(tmp_path / "tmp")},
    )
    out = proc.stdout + proc.stderr
    crashes = sorted(p.name for p in tmp_path.iterdir() if p.is_file())
    assert proc.returncode == 0 and not crashes, (
        f"fuzz target {target} crashed (rc {proc.returncode}); input kept as {crashes}:\n"
        + out[-6000:]
    )
    runs = re.search(r"Done (\d+) runs", out)
    assert runs and int(runs.group(1)) > 0, out[-3000:]


@pytest.mark.parametrize("target", sorted(fuzz_targets.TARGETS))
def test_kept_inputs_replay(target: str) -> None:
    for data in fuzz_targets.seeds(target):
        fuzz_targets.TARGETS[target](data)
    for p in fuzz_targets.kept(target):
        fuzz_targets.TARGETS[target](p.read_bytes())


def test_the_scenario_crasher_is_refused_by_name() -> None:
    """The first crasher the fuzzer found: a 100-digit rank count ran out of memory."""
    from artemis.sim.scenario import ScenarioError, load_scenario

    kept = HERE / "corpus" / "scenario" / "oom-ranks-huge.toml"
    with pytest.raises(ScenarioError, match=r"\[job\]\.ranks: expected an integer in \[2, "):
        load_scenario(kept)


def test_the_store_url_crasher_is_refused_by_name() -> None:
    """A crasher the fuzzer found: a PostgreSQL URL whose host is not a name
    (getaddrinfo's UnicodeError escaped open_store). Refused before any connection."""
    from artemis.store import StoreError, open_store

    kept = HERE / "corpus" / "store_url" / "crash-idna-host"
    with pytest.raises(StoreError, match="not a PostgreSQL URL: bad host name"):
        open_store(kept.read_bytes().decode("utf-8", "replace"))


def test_the_slowdown_table_crasher_is_refused_by_name() -> None:
    """A crasher the fuzzer found in the suite: `slowdown .0 = 25` (a dotted key: a
    table) on a clock_anomaly fault, where slowdown is ignored, reached float()."""
    from artemis.sim.scenario import ScenarioError, load_scenario

    kept = HERE / "corpus" / "scenario" / "crash-slowdown-table.toml"
    with pytest.raises(ScenarioError, match=r"slowdown: expected a number"):
        load_scenario(kept)
