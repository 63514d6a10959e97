#!/usr/bin/env bash
# Installs what is missing, builds everything with warnings as errors, runs the whole suite
# through ctest (units, process, end-to-end, store, logs, worker library, PyTorch compatibility,
# rendezvous: every folder under tests/).
#
# Every option that decides what the suite contains is given here on each run, so a build
# directory configured before with fewer parts (./scripts/demo.sh caches CTRUN_BUILD_TESTS=OFF)
# is reconfigured, not reused as it is; and ctest fails when it finds no tests at all.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh" -DCTRUN_WERROR=ON -DCTRUN_BUILD_TESTS=ON -DCTRUN_TEST_AREAS=all \
  -DCTRUN_BUILD_EXAMPLES=ON -DCTRUN_WITH_TORCH=ON -DCTRUN_BUILD_BENCH=ON
build="${CTRUN_BUILD_DIR:-$root/build}"
cd "$build"
ctest --output-on-failure --no-tests=error -j "$(nproc)" --timeout 600
