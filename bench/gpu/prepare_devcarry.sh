#!/bin/bash
# Fills the carry folder for bench/gpu/libtorch_check.sh from a local build: the GPU machine has
# neither Debian's dev packages nor this build, so what the check needs from here travels with it.
#   CARRY/ctrun, CARRY/ct-watchdog    stripped (they link no LibTorch and no CUDA; ctrun finds
#                                     ct-watchdog beside itself, so they stay together)
#   CARRY/nccl_allreduce              stripped, when the build has it
#   CARRY/include/CLI, .../nlohmann   header-only libraries that train.cc and warm_main.cc include
# Usage: bench/gpu/prepare_devcarry.sh [BUILD_DIR] [CARRY_DIR]
#   (defaults: <repo>/build and <repo>/.devcarry; the carry folder must be ignored by git, or it
#   would be committed: the default is, through .git/info/exclude)
# Prints what it copied and the folder's size (the tree plus what is carried must stay under 64 MiB).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$repo/build}" && pwd)
carry=${2:-$repo/.devcarry}

for f in ctrun ct-watchdog; do
  [ -x "$build/$f" ] || { echo "missing $build/$f: build it first (ninja -C $build ctrun ct-watchdog)" >&2; exit 1; }
done
rm -rf "$carry"
mkdir -p "$carry/include"
# Asked once the folder exists: a pattern such as "/.devcarry/" matches directories only.
if git -C "$repo" rev-parse --git-dir >/dev/null 2>&1 && ! git -C "$repo" check-ignore -q "$carry"; then
  echo "warning: $carry is not ignored by git; add it to .git/info/exclude" >&2
fi
strip -o "$carry/ctrun" "$build/ctrun"
strip -o "$carry/ct-watchdog" "$build/ct-watchdog"
if [ -x "$build/examples/nccl_allreduce" ]; then
  strip -o "$carry/nccl_allreduce" "$build/examples/nccl_allreduce"
fi
for dir in CLI nlohmann; do
  src=${CTRUN_SYSTEM_INCLUDE:-/usr/include}/$dir
  [ -d "$src" ] || { echo "missing $src (Debian packages libcli11-dev, nlohmann-json3-dev)" >&2; exit 1; }
  cp -r "$src" "$carry/include/"
done

echo "carry folder $carry:"
ls -l "$carry"
du -sh "$carry"
