#!/usr/bin/env bash
# The demo: a real 4-worker data-parallel LibTorch training job under ctrun. Rank 2 crashes at
# step 37; ctrun kills the survivors, restarts everyone, and training resumes from the latest
# snapshot (step 30), finishing with the same parameters an uninterrupted run produces.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/install-deps.sh"
build="${CTRUN_BUILD_DIR:-$root/build}"
# A fresh build directory gets only what the demo runs; one configured before (by
# scripts/test.sh, or by hand) keeps its settings, so the demo does not switch its tests off.
fresh=()
[ -f "$build/CMakeCache.txt" ] || fresh=(-DCTRUN_BUILD_TESTS=OFF -DCTRUN_BUILD_BENCH=OFF)
"$root/scripts/build.sh" "${fresh[@]}"
snapshots="$(mktemp -d /tmp/ctrun_demo_XXXXXX)"
trap 'rm -rf "$snapshots"' EXIT
set -x
"$build/ctrun" --standalone --nproc_per_node=4 --max_restarts=3 \
  "$build/examples/train" --epochs 8 --batch-size 16 --snapshot-dir "$snapshots" --snapshot-every 10 \
  --fail-at-step 37 --fail-rank 2
