#!/usr/bin/env bash
# make test-torch-repeat: run a pytest command N times under two busy loops and count
# the passes. A bench run, not CI: it takes N times the real-PyTorch runs' minutes.
#   tests/torch_repeat.sh N OUTDIR CMD...
set -u
n=$1 out=$2
shift 2
mkdir -p "$out"
busy=()
stop() { for p in "${busy[@]}"; do kill "$p" 2>/dev/null; done; }
trap stop EXIT
trap 'exit 130' INT TERM
for _ in 1 2; do
	yes >/dev/null &
	busy+=($!)
done
pass=0
for i in $(seq 1 "$n"); do
	t0=$(date +%s)
	if "$@" >"$out/run-$i.log" 2>&1; then
		pass=$((pass + 1)) verdict=passed
	else
		verdict=FAILED
	fi
	echo "run $i: $verdict in $(($(date +%s) - t0)) s, load average $(cut -d' ' -f1-3 /proc/loadavg)" |
		tee -a "$out/summary.txt"
done
echo "torch_e2e under two busy loops: $pass of $n passed (logs: $out)" | tee -a "$out/summary.txt"
[ "$pass" -eq "$n" ]
