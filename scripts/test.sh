#!/usr/bin/env bash
# Installs what is missing, builds everything with warnings as errors, runs the whole suite
# through ctest (units, process, end-to-end, store, logs, worker library, PyTorch compatibility).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/install-deps.sh"
"$root/scripts/build.sh" -DCTRUN_WERROR=ON -DCTRUN_TEST_AREAS="store;logs;worker;compat;rendezvous"
build="${CTRUN_BUILD_DIR:-$root/build}"
cd "$build"
ctest --output-on-failure -j "$(nproc)" --timeout 600
