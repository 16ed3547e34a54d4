#!/bin/bash
# Slurm Prolog (runs as root on each allocated node before the job):
#   Prolog=/etc/slurm/artemis_prolog.sh
# Makes sure the ring folder exists with the right mode (in case /dev/shm was
# cleaned) and that the node's agent is running. It never fails the job.
dir="${ARTEMIS_SHM_DIR:-/dev/shm/artemis}"
if command -v systemd-tmpfiles >/dev/null 2>&1 && [ "$dir" = /dev/shm/artemis ]; then
    systemd-tmpfiles --create artemis.conf >/dev/null 2>&1 || true
fi
if [ ! -d "$dir" ]; then
    mkdir -p "$dir" && chmod 1777 "$dir" && { chown artemis:artemis "$dir" 2>/dev/null || true; }
fi
if command -v systemctl >/dev/null 2>&1 && ! systemctl is-active --quiet artemis-agent 2>/dev/null; then
    logger -t artemis "artemis-agent is not running on $(hostname); job ${SLURM_JOB_ID:-?} is not watched here" 2>/dev/null || true
fi
exit 0
