#!/bin/bash
# Restart-to-first-step time of examples/train: a rank crashes at step S in attempt 0; measure
# from the crash (the "injecting failure ... unix_ms=" line) to rank 0's first completed step of
# attempt 1 ("attempt 1 first step done unix_ms="), under ctrun and under torchrun
# (../shared/bench/torchrun-baseline beside the checkout, torch 1.13, whose default --monitor_interval is 5 s; it
# is also measured with --monitor_interval=0.1, the 2.x default).
# Usage: bench/snapshot/restart_bench.sh BUILD_DIR [RUNS] [NPROC]
set -euo pipefail
build=${1:?build dir}
runs=${2:-3}
nproc=${3:-2}
ctrun=$build/ctrun
train=$build/examples/train
torchrun=${TORCHRUN:-$(cd "$(dirname "$0")/../.." && pwd)/../shared/bench/torchrun-baseline}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

measure() {  # label, launcher argv...
  local label=$1; shift
  local total=0
  for i in $(seq 1 "$runs"); do
    rm -rf "$work/snap"
    "$@" "$train" --epochs 2 --snapshot-dir "$work/snap" --snapshot-every 5 --fail-at-step 12 --fail-rank 1 \
      --quiet >"$work/out" 2>&1 || { echo "$label run failed:"; tail -20 "$work/out"; return 1; }
    local t_fail t_first
    t_fail=$(grep -o 'injecting failure.*unix_ms=[0-9]*' "$work/out" | grep -o '[0-9]*$' | head -1)
    t_first=$(grep -o 'attempt 1 first step done unix_ms=[0-9]*' "$work/out" | grep -o '[0-9]*$' | head -1)
    local d=$((t_first - t_fail))
    echo "$label run $i: restart-to-first-step ${d} ms"
    total=$((total + d))
  done
  echo "$label mean: $((total / runs)) ms"
}

measure "ctrun" "$ctrun" --standalone --nproc_per_node="$nproc" --max_restarts=1
measure "torchrun(monitor 5s)" "$torchrun" --standalone --nproc_per_node="$nproc" --max_restarts=1 --no_python
measure "torchrun(monitor 0.1s)" "$torchrun" --standalone --nproc_per_node="$nproc" --max_restarts=1 \
  --monitor_interval=0.1 --no_python
