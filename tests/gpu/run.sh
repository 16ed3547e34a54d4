#!/usr/bin/env bash
# Every GPU check, in one go, on a lent machine: one NVIDIA GPU, its own CUDA
# build of PyTorch and its own Python, no network. Under 5 minutes (the tests
# are bounded by `timeout 270` below; a typical run is 1-2 minutes).
#
#   tests/gpu/prepare.sh     # beforehand, where there is network: tests/gpu/wheels
#   tests/gpu/run.sh         # on the lent machine, from the repository root or anywhere
#
# It installs the project without touching PyTorch: the project with
# --no-deps, the test tools and nvidia-ml-py from the carried wheels only
# (--no-index), and it checks afterwards that torch is the same build.
# PYTHON picks the interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
WHEELS=tests/gpu/wheels
say() { printf '== %s\n' "$*"; }
die() { printf 'run.sh: %s\n' "$*" >&2; exit 2; }

torch_id() { "$PY" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.__file__)'; }
say "python $("$PY" -c 'import sys; print(sys.version.split()[0])') at $(command -v "$PY")"
before=$(torch_id) || die "this Python has no torch"
say "torch: $before"
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
  || die "PyTorch sees no CUDA GPU"
"$PY" -c 'import torch; print("== GPU:", torch.cuda.get_device_name(0), "NCCL", torch.cuda.nccl.version())'
"$PY" -c 'import numpy' 2>/dev/null || die "numpy is missing (the ring reader needs it)"

# Test tools and NVML's binding, from the carried wheels where missing.
need=()
"$PY" -c 'import pytest' 2>/dev/null || need+=(pytest)
"$PY" -c 'import pytest_timeout' 2>/dev/null || need+=(pytest-timeout)
"$PY" -c 'import pynvml' 2>/dev/null || need+=(nvidia-ml-py)
if ((${#need[@]})); then
  [[ -d $WHEELS ]] || die "missing ${need[*]} and no $WHEELS: run tests/gpu/prepare.sh with network and carry $WHEELS"
  say "installing ${need[*]} from $WHEELS"
  "$PY" -m pip install --quiet --no-index --find-links "$WHEELS" "${need[@]}"
fi

# The plugin: built here when a compiler exists, else the carried build.
if command -v make >/dev/null && command -v "${CC:-cc}" >/dev/null; then
  make -s -C profiler_plugin lib
fi
[[ -f profiler_plugin/build/libnccl-profiler-artemis.so ]] \
  || die "no compiler and no profiler_plugin/build/libnccl-profiler-artemis.so: carry a build"

# The project itself, never its dependencies (torch above all).
if ! "$PY" -m pip install --quiet --no-deps --no-index --no-build-isolation -e . 2>/tmp/artemis-pip.log; then
  # An old setuptools cannot build it: expose the sources as the artemis package instead.
  say "pip could not install the project ($(tail -1 /tmp/artemis-pip.log)); using the source tree"
  farm=$(mktemp -d)/site
  mkdir -p "$farm/artemis"
  # every room (a package artemis.<room> is the folder <room>/): tests/test_gpu_imports.py
  for p in agent cli common coordinator detect job protocol rebalance regress report ring sim store; do
    ln -s "$PWD/$p" "$farm/artemis/$p"
  done
  export PYTHONPATH="$farm${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PY" -c 'import artemis.agent.telemetry, artemis.ring.reader' || die "artemis does not import"
[[ $(torch_id) == "$before" ]] || die "torch changed: $before -> $(torch_id)"

say "GPU checks"
timeout 270 "$PY" -m pytest -q -p no:cacheprovider -rs tests/gpu
