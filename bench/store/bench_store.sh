#!/bin/sh
# Builds the store benchmark pieces in BUILD_DIR (default build-store) and runs bench_store.py.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build-store}
[ $# -gt 0 ] && shift
cmake --build "$build" --target ctrun_store_server ctrun_store_bench -j2
exec /usr/bin/python3 "$here/bench_store.py" "$build" "$@"
