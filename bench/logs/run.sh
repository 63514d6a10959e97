#!/usr/bin/env bash
# Worker-output relay benchmark: N writers x BYTES of short numbered lines, relayed with prefixes
# to a file. Compares ctrun's OutputRelay with `cat` (one per writer, no prefixes: the no-work
# baseline), and, when available, whole launchers: torchrun --tee 3 and ctrun.
#
#   bench/logs/run.sh [BUILD_DIR=build-logs] [WRITERS=8] [BYTES=200000000]
#   env: CTRUN=path/to/ctrun (adds the ctrun launcher runs), TORCHRUN=... (default the baseline),
#        OUT_DIR (default $TMPDIR or /tmp; needs ~4 GB free; files are removed after each run)
# Every run starts after `sync`: otherwise the previous run's ~2 GB of dirty page cache is written
# back during the next one and its kernel time (measured: --tee 3 between 1.8 s and 4.5 s) depends
# on the order of the runs.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build-logs}
N=${2:-8}
BYTES=${3:-200000000}
BIN=$BUILD/bench/logs
WRITER=$BIN/ctrun_bench_writer
OUT_DIR=${OUT_DIR:-${TMPDIR:-/tmp}}
OUT=$OUT_DIR/ctrun_relay_bench.$$.out
TORCHRUN=${TORCHRUN:-$ROOT/../shared/bench/torchrun-baseline}
trap 'rm -rf "$OUT" "$OUT".[0-9]* "$OUT.logs"' EXIT
[[ -x $WRITER && -x $BIN/ctrun_relay_bench ]] || {
  echo "build first: cmake --build $BUILD --target ctrun_relay_bench ctrun_bench_writer" >&2; exit 2; }
echo "# $N writers x $BYTES bytes, $(nproc) CPUs, load: $(cut -d' ' -f1-3 /proc/loadavg)"
for w in "" printf; do
  for mode in cat relay tee; do
    sync
    "$BIN/ctrun_relay_bench" "$WRITER" "$N" "$BYTES" "$OUT" "$mode" $w
    rm -f "$OUT" "$OUT".[0-9]*
  done
done

# Whole launchers. CPU = user+sys of the launcher and its writers (GNU time counts waited-for
# children); subtract the writers' CPU printed above to get the launcher's own.
# Their log files (--tee) go to $OUT.logs, removed after each run.
launcher() {
  local name=$1; shift
  sync
  /usr/bin/time -f "%e %U %S" -o "$OUT.time" "$@" > "$OUT" 2> "$OUT.err" || {
    echo "$name: failed (see below)"; tail -3 "$OUT.err"; return 0; }
  read -r wall user sys < "$OUT.time"
  local lines; lines=$(wc -l < "$OUT")
  awk -v n="$name" -v w="$wall" -v u="$user" -v s="$sys" -v b="$((N * BYTES))" -v l="$lines" \
    'BEGIN { printf "%-28s wall=%.2fs throughput=%.0fMB/s cpu(launcher+writers)=%.2fs lines=%d\n", n, w, b/1e6/w, u+s, l }'
  rm -rf "$OUT" "$OUT.time" "$OUT.err" "$OUT.logs"
}
if [[ -x $TORCHRUN ]]; then
  launcher "torchrun --tee 3" "$TORCHRUN" --standalone --nproc_per_node="$N" --tee 3 --log_dir "$OUT.logs" --no_python "$WRITER" "$BYTES"
fi
if [[ -n ${CTRUN:-} && -x $CTRUN ]]; then
  launcher "ctrun --tee 3" "$CTRUN" --standalone --nproc_per_node="$N" --tee 3 --log_dir "$OUT.logs" --no_python "$WRITER" "$BYTES"
  launcher "ctrun (default prefixes)" "$CTRUN" --standalone --nproc_per_node="$N" --no_python "$WRITER" "$BYTES"
fi
