#!/bin/bash
# Artemis regress under Slurm: the fixed micro-benchmark on every node of the
# allocation, one task per node with the whole node (--exclusive: no job shares
# it), results in one PostgreSQL store for the fleet (what makes same-hardware
# peers comparable; docs/OPERATING.md "Regressions across changes").
#
# In a maintenance reservation (as root):
#   scontrol create reservation reservationname=maint starttime=2026-12-06T03:00 \
#     duration=60 nodes=gpu[001-064] flags=maint,ignore_jobs users=artemis
#   sbatch --reservation=maint --nodes=64 deploy/slurm/regress.sh
# Or on whichever nodes are idle now: sbatch --nodes=4 deploy/slurm/regress.sh
# Weekly, from the artemis user's scrontab (scrontab -e):
#   #SCRON --time=00:30:00 --exclusive --nodes=8
#   0 3 * * 0 /opt/artemis/share/deploy/slurm/regress.sh
#SBATCH --job-name=artemis-regress
#SBATCH --exclusive
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --time=00:30:00
#SBATCH --output=artemis-regress-%j.out
set -euo pipefail

ARTEMIS=${ARTEMIS:-/opt/artemis/bin/artemis}
# The store URL; its password belongs in ~/.pgpass, not here.
STORE=${ARTEMIS_REGRESS_STORE:-postgresql://artemis@artemis-db/artemis}
TEXTFILE=${ARTEMIS_REGRESS_TEXTFILE:-/var/lib/prometheus/node-exporter}
FINDINGS=${ARTEMIS_REGRESS_FINDINGS:-$HOME/artemis-regress-findings.jsonl}

# One task per node; each names itself by its hostname (Slurm's node name) and
# writes its own node's textfile. A node whose run fails does not stop the others.
srun --ntasks-per-node=1 --kill-on-bad-exit=0 bash -c '
  node=$(hostname -s)
  textfile=()
  [ -w "$3" ] && textfile=(--textfile "$3")
  exec "$1" regress --node "$node" --store "$2" --jsonl "$4.$node" "${textfile[@]}"
' _ "$ARTEMIS" "$STORE" "$TEXTFILE" "$FINDINGS"
