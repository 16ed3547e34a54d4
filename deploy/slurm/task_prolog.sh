#!/bin/bash
# Slurm TaskProlog for Artemis: points each task's NCCL/RCCL at the Artemis
# profiler plugin. slurm.conf:
#   TaskProlog=/etc/slurm/artemis_task_prolog.sh
# (Prolog=/etc/slurm/artemis_prolog.sh makes sure the ring folder exists.)
#
# A TaskProlog runs as the job's user with the task's environment; every line
# it prints as "export NAME=value" is set in the task's environment, and a line
# "print TEXT" goes to the task's standard output.
#
# Opt-in per job:  sbatch --export=ALL,ARTEMIS=1 ...   (ARTEMIS=0 opts out)
# Site default:    ARTEMIS_DEFAULT below (or in /etc/default/artemis-slurm).
# A job that sets NCCL_PROFILER_PLUGIN itself is left alone.

ARTEMIS_DEFAULT=off                        # on: every job is watched unless ARTEMIS=0
: "${ARTEMIS_PLUGIN_DIR:=/opt/artemis/lib}" # where the install put the plugin (see operator guide)
ARTEMIS_SHM_DIR_DEFAULT=/dev/shm/artemis
# shellcheck disable=SC1091
[ -r /etc/default/artemis-slurm ] && . /etc/default/artemis-slurm

want="${ARTEMIS:-}"
if [ -z "$want" ]; then
    case "$ARTEMIS_DEFAULT" in on|1|yes|true) want=1 ;; *) want=0 ;; esac
fi
case "$want" in 1|on|yes|true) ;; *) exit 0 ;; esac

if [ -n "${NCCL_PROFILER_PLUGIN:-}" ]; then
    echo "print artemis: NCCL_PROFILER_PLUGIN already set by the job; not watching it"
    exit 0
fi

# One library on NVIDIA and AMD nodes: RCCL loads profiler plugins under
# NCCL's libnccl-profiler prefix and reads the same NCCL_PROFILER_PLUGIN; the
# plugin tells RCCL from NCCL by looking at the process.
lib="libnccl-profiler-artemis.so"
plugin="$ARTEMIS_PLUGIN_DIR/$lib"
if [ ! -r "$plugin" ] && command -v artemis-agent >/dev/null 2>&1; then
    plugin="$(dirname "$(artemis-agent plugin-path)")/$lib"
fi
if [ ! -r "$plugin" ]; then
    echo "print artemis: plugin $lib not found in $ARTEMIS_PLUGIN_DIR; job runs unwatched"
    exit 0
fi

echo "export NCCL_PROFILER_PLUGIN=$plugin"
echo "export ARTEMIS_JOB=${SLURM_JOB_ID:-unknown}"
echo "export ARTEMIS_SHM_DIR=${ARTEMIS_SHM_DIR:-$ARTEMIS_SHM_DIR_DEFAULT}"
exit 0
