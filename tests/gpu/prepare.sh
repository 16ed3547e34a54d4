#!/usr/bin/env bash
# Run where there is network, before a GPU machine is lent: puts into
# tests/gpu/wheels (ignored by git) the pure-Python wheels that run.sh installs
# there without network: NVML's binding (nvidia-ml-py, imported as pynvml) and
# pytest with its dependencies for Python 3.10 and later. Carry the folder to
# the lent machine with the working tree.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
mkdir -p wheels
common=(--quiet --dest wheels --only-binary=:all: --python-version 3.10
        --implementation py --abi none --platform any)
"$PY" -m pip download "${common[@]}" 'nvidia-ml-py==13.615.71' pytest pytest-timeout
# pytest's dependencies for Python < 3.11, which the resolver above leaves out
"$PY" -m pip download "${common[@]}" exceptiongroup tomli typing_extensions
ls wheels
