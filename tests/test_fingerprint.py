"""Fingerprints, the pure parts: the privacy filter, the wire message, the coordinator's
diff / workload hash / job fingerprint, the monitor's record of them (and its restore),
the agent's version codes and the summariser's step signature."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgpack
import msgspec
import numpy as np
import pytest
from artemis.agent.fingerprint import nccl_version, software_of, workload_signature
from artemis.agent.summary import WindowSummarizer
from artemis.agent.telemetry.nvml import cuda_version
from artemis.detect.fingerprint import JobFingerprint, combine, diff, workload_hash
from artemis.detect.monitor import JobMonitor
from artemis.detect.settings import Settings
from artemis.protocol.messages import Fingerprint, ProtocolError, decode_body, encode_body
from artemis.protocol.records import Software
from artemis.ring import format as rf

SW = {
    "gpu_model": "NVIDIA H100 80GB HBM3",
    "driver": "550.54.15",
    "cuda": "12.4",
    "nccl": "2.21.5",
    "kernel": "6.1.0-18-amd64",
    "env": {"NCCL_ALGO": "Ring"},
}


def test_privacy_filter_keeps_the_prefixes_and_drops_secret_names() -> None:
    env = {
        "NCCL_IB_HCA": "mlx5",
        "RCCL_MSCCL_ENABLE": "1",
        "TORCH_NCCL_BLOCKING_WAIT": "1",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "HSA_FORCE_FINE_GRAIN_PCIE": "1",
        "NCCL_API_KEY": "s3cret",
        "CUDA_token_x": "s3cret",  # any case
        "HSA_SECRET": "s3cret",
        "NCCL_PASSWORD_FILE": "/x",
        "NCCL_MONKEY": "s3cret",  # KEY anywhere in the name
        "PATH": "/usr/bin",
        "MY_NCCL_X": "1",  # the prefix starts the name
    }
    kept = rf.filter_env(env)
    assert kept == {
        "CUDA_VISIBLE_DEVICES": "0,1",
        "HSA_FORCE_FINE_GRAIN_PCIE": "1",
        "NCCL_IB_HCA": "mlx5",
        "RCCL_MSCCL_ENABLE": "1",
        "TORCH_NCCL_BLOCKING_WAIT": "1",
    }
    assert "s3cret" not in str(kept)
    long = rf.filter_env({"NCCL_X": "v" * 5000})
    assert len(long["NCCL_X"]) == rf.ENV_VALUE_MAX


def test_the_message_round_trips_and_refuses_a_secret_name_or_an_empty_version() -> None:
    msg = Fingerprint(job="j", rank=3, software=Software.from_dict(SW), workload="ab" * 16)
    back = decode_body(encode_body(msg, seq=7))
    assert isinstance(back, Fingerprint) and back.seq == 7
    assert back.software.to_dict() == SW and back.workload == "ab" * 16
    wire: dict[str, Any] = msgpack.unpackb(encode_body(msg, seq=7))
    wire["software"]["env"]["NCCL_API_KEY"] = "x"
    with pytest.raises(ProtocolError, match=r"fingerprint\.software\.env.*NCCL_API_KEY"):
        decode_body(msgpack.packb(wire))
    del wire["software"]["env"]["NCCL_API_KEY"]
    wire["software"]["driver"] = ""
    with pytest.raises(ProtocolError, match=r"fingerprint\.software\.driver"):
        decode_body(msgpack.packb(wire))
    wire["software"]["driver"] = "1"
    wire["workload"] = "not hex"
    with pytest.raises(ProtocolError, match=r"fingerprint\.workload"):
        decode_body(msgpack.packb(wire))
    # absent components stay absent (never "")
    assert Software.from_dict({"driver": "", "torch": None}).to_dict() == {"env": {}}
    assert msgspec.msgpack.decode(encode_body(Fingerprint(job="j", rank=0)))["t"] == "fingerprint"


def test_diff_names_each_changed_component_and_env_variable() -> None:
    new = {**SW, "driver": "560.28.03", "env": {"NCCL_ALGO": "Tree", "NCCL_PROTO": "LL"}}
    del new["kernel"]
    assert diff(SW, new) == {
        "driver": ["550.54.15", "560.28.03"],
        "env.NCCL_ALGO": ["Ring", "Tree"],
        "env.NCCL_PROTO": [None, "LL"],
        "kernel": ["6.1.0-18-amd64", None],
    }
    assert diff(SW, dict(SW)) == {}


def test_combine_agrees_or_lists_the_values_and_the_job_fingerprint_needs_every_rank() -> None:
    other = {**SW, "driver": "560.28.03", "env": {"NCCL_ALGO": "Ring", "NCCL_IB_HCA": "mlx5"}}
    job = combine([SW, SW, other])
    assert job["driver"] == ["550.54.15", "560.28.03"]
    assert job["nccl"] == "2.21.5"
    assert job["env"] == {"NCCL_ALGO": "Ring", "NCCL_IB_HCA": "mlx5"}
    # job-level diffs work the same way
    assert diff(combine([SW, SW]), job) == {
        "driver": ["550.54.15", ["550.54.15", "560.28.03"]],
        "env.NCCL_IB_HCA": [None, "mlx5"],
    }

    s = Settings()
    m = JobMonitor("j", s, nranks=3)
    assert m.on_fingerprint(0, SW, "a" * 32)
    assert not m.on_fingerprint(0, dict(SW), "a" * 32)  # the same again: no change
    m.on_fingerprint(1, SW, "a" * 32)
    assert m.fingerprint() is None  # rank 2 not heard from
    m.on_fingerprint(2, other, "b" * 32)
    fp = m.fingerprint()
    assert fp is not None and fp.nranks == 3 and fp.hardware == ["NVIDIA H100 80GB HBM3"]
    assert fp.software == job
    assert fp.workload == workload_hash(["a" * 32, "a" * 32, "b" * 32], 3, fp.hardware)
    # restored from a snapshot (through msgpack, as the coordinator saves it)
    state = msgpack.unpackb(msgpack.packb(m.snapshot()), strict_map_key=False)
    back = JobMonitor.restore(state, s)
    assert back.fingerprint() == fp
    assert JobFingerprint.from_dict(fp.to_dict()) == fp
    # a rank without a signature yet: no workload hash
    m.on_fingerprint(2, other, None)
    got = m.fingerprint()
    assert got is not None and got.workload is None


def test_workload_hash_is_order_free_but_counts_ranks_and_hardware() -> None:
    sigs = ["a" * 32, "b" * 32, "a" * 32]
    h = workload_hash(sigs, 3, ["H100"])
    assert h == workload_hash(list(reversed(sigs)), 3, ["H100"])
    assert h != workload_hash(["a" * 32, "b" * 32, "b" * 32], 3, ["H100"])  # a multiset
    assert h != workload_hash(sigs, 4, ["H100"])
    assert h != workload_hash(sigs, 3, ["MI300X"])
    assert len(h) == 32 and int(h, 16) >= 0


def test_version_codes() -> None:
    assert nccl_version(22105) == "2.21.5"
    assert nccl_version(23003) == "2.30.3"
    assert nccl_version(2804) == "2.8.4"  # the encoding before 2.9
    assert nccl_version(0) is None
    assert cuda_version(12040) == "12.4" and cuda_version(13000) == "13.0"
    assert cuda_version(0) is None
    sw = software_of({"kernel": "k", "driver": "1"}, {"driver": "2", "env": {"NCCL_A": "1"}})
    assert sw.to_dict() == {"driver": "2", "kernel": "k", "env": {"NCCL_A": "1"}}


def _records(funcs: list[int], sizes: list[int], n: int, prefix: int = 0) -> np.ndarray:
    r = np.zeros(n, dtype=rf.SLOT_DTYPE)
    r["kind"], r["state"] = rf.KIND_COLL, rf.STATE_DONE
    r["coll_seq"] = r["seq"] = np.arange(n)
    reps = -(-n // len(funcs))
    r["func"] = np.tile(funcs, reps)[:n]
    r["bytes"] = np.tile(sizes, reps)[:n]
    r["func"][:prefix] = rf.FUNC_CODES["Broadcast"]  # start-up collectives
    r["start"] = np.arange(n) * 1000 + 10
    r["end"] = r["start"] + 500
    return r


def test_the_step_signature_is_a_steady_step_and_its_hash_follows_the_workload() -> None:
    def sig(funcs: list[int], sizes: list[int], prefix: int = 0) -> str:
        s = WindowSummarizer("j", "c", 0, 2, "h", window_steps=2)
        s.feed(_records(funcs, sizes, 300, prefix))
        assert s.take_windows()
        assert s.step_signature is not None
        return workload_signature(s.step_signature)

    base = sig([1, 1, 2], [100, 200, 300])
    assert sig([1, 1, 2], [100, 200, 300], prefix=5) == base  # start-up left out
    assert sig([1, 1, 2], [100, 200, 400]) != base  # another bucket size
    assert sig([1, 2, 2], [100, 200, 300]) != base  # another function
    assert sig([1, 1, 2, 1], [100, 200, 300, 100]) != base  # another count


def test_incidents_show_names_the_jobs_fingerprint(tmp_path: Path) -> None:
    from artemis.store import open_store, store_url
    from store_records import flagship

    url = store_url(tmp_path / "artemis.db")
    rec = flagship()[-1]
    fp = JobFingerprint.of({0: SW, 1: {**SW, "driver": "560.28.03"}}, {0: "a" * 32, 1: "a" * 32}, 2)
    with open_store(url) as s:
        s.write_incident(rec)
        s.write_job(rec["job"], {"fingerprint": fp.to_dict()})
    artemis = str(Path(sys.executable).parent / "artemis")
    env = {**os.environ, "COLUMNS": "200"}
    out = subprocess.run(
        [artemis, "incidents", "show", rec["id"], "--store", url],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    line = next(ln for ln in out.splitlines() if "software" in ln)
    assert "driver 550.54.15 | 560.28.03" in line and "nccl 2.21.5" in line
    assert fp.workload is not None
    assert "1 env" in line and f"workload {fp.workload[:12]}" in line


def test_a_fingerprint_is_kept_until_acked_and_resent_like_any_data_message() -> None:
    from artemis.protocol.session import Outbox

    box = Outbox()
    seq, dropped = box.add(Fingerprint(job="j", rank=1, software=Software.from_dict(SW)))
    assert dropped == []
    # a reconnect resends from the first unacked seq: the frame decodes to the message
    ((s, frame),) = list(box.frames_from(1))
    back = decode_body(frame[4:])
    assert s == seq and isinstance(back, Fingerprint) and back.software.to_dict() == SW
    box.ack(seq)
    assert list(box.frames_from(1)) == []
