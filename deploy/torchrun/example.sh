#!/bin/bash
# Run a training script under torchrun with Artemis watching it. The script is
# unchanged: NCCL (or RCCL) loads the profiler plugin named by
# NCCL_PROFILER_PLUGIN, which writes rings the node's artemis-agent reads.
#
# Run on every node (same command), e.g.:
#   MASTER_ADDR=node-0 NNODES=2 NODE_RANK=0 deploy/torchrun/example.sh train.py --epochs 1
set -euo pipefail

NNODES="${NNODES:-1}"
NPROC_PER_NODE="${NPROC_PER_NODE:-8}"
NODE_RANK="${NODE_RANK:-0}"
MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
MASTER_PORT="${MASTER_PORT:-29500}"
RUN_ID="${RUN_ID:-artemis-$(date +%Y%m%d-%H%M%S)}"   # same on every node

# The plugin: one library for NCCL and RCCL (RCCL loads it under NCCL's name).
plugin="$(artemis-agent plugin-path)"                  # .../libnccl-profiler-artemis.so
export NCCL_PROFILER_PLUGIN="$plugin"
# Rings are named after the job; torchrun's run id is the fallback the plugin
# uses (TORCHELASTIC_RUN_ID), ARTEMIS_JOB makes it explicit.
export ARTEMIS_JOB="$RUN_ID"
export ARTEMIS_SHM_DIR="${ARTEMIS_SHM_DIR:-/dev/shm/artemis}"

exec torchrun \
    --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" --node-rank "$NODE_RANK" \
    --rdzv-id "$RUN_ID" --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \
    "$@"
