#!/bin/bash
# The worker library's LibTorch part and examples/train.cc on CUDA, checked on a GPU machine that
# has a python3 with a CUDA torch wheel (its include/ and lib/ serve as LibTorch) but no Debian
# dev packages and no build of this repository:
#   1. build: the worker library sources and train.cc, compiled in parallel against that LibTorch
#      (torch_support.cc twice: with NCCL, when nccl.h and the CUDA headers are found, and
#      without; train links the NCCL one when it compiled);
#   2. resume_gpu / params_identical_gpu: train under ctrun on the GPU (one worker, NCCL), an
#      injected crash between two snapshots, one restart that resumes from the last snapshot and
#      finishes; its final parameters compared bit for bit with an uncrashed run's (and, when
#      they differ, an uncrashed run with another: is the run itself deterministic?);
#      warm_gpu: the same with --warm (train's CTRUN_MAIN server forks the workers), bit-identical;
#   3. cross_gpu_to_cpu / cross_cpu_to_gpu: snapshots saved by a CUDA run are resumed by a run
#      that sees no GPU (CUDA_VISIBLE_DEVICES=), and the reverse: each must load and finish;
#   4. two_workers_cpu: two workers on the CPU (gloo), a crash of rank 1 and a resume, compared
#      with an uncrashed run. Two workers on the one GPU are not tried: train picks NCCL whenever
#      CUDA is there (no backend option) and NCCL refuses two ranks on one GPU.
# On a machine without a GPU (a rehearsal against Debian's CPU LibTorch: TORCH_DIR=debian) the
# CUDA checks print SKIP and their flows run CPU-only instead, so the script itself is exercised.
#
# Usage: bash bench/gpu/libtorch_check.sh CARRY_DIR
#   CARRY_DIR: ctrun and ct-watchdog (one folder) and include/ with CLI11 and nlohmann
#   (bench/gpu/prepare_devcarry.sh fills it). Environment:
#   TORCH_DIR      the torch package folder (include/, lib/); default: python3's torch;
#                  "debian": Debian's libtorch-dev (/usr/include, /usr/lib/<triplet>)
#   TORCH_INCLUDE, TORCH_LIB, TORCH_ABI, TORCH_EXTRA_CXXFLAGS, TORCH_EXTRA_LIBS: overrides
#   CUDA_HOME      CUDA toolkit for nccl.h and the CUDA headers (default /usr/local/cuda)
#   COMPILE_TIMEOUT seconds allowed per compiled file (default 240)
#   OUT            when set, stdout.log (all that is printed), build.log (every compiler output)
#                  and summary.txt are written there
# Prints every command and its output; ends with one PASS/FAIL/SKIP line per check and exits
# non-zero if any failed. Every step is bounded by `timeout`.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
carry=$(cd "${1:?usage: libtorch_check.sh CARRY_DIR}" && pwd)
ctrun=$carry/ctrun
work=$(mktemp -d /tmp/libtorch_check.XXXXXX)
trap 'rm -rf "$work"' EXIT
out=${OUT:-}
if [ -n "$out" ]; then  # everything printed is also kept whole there (stdout comes back cut)
  mkdir -p "$out"
  exec > >(tee "$out/stdout.log") 2>&1
  tee_pid=$!
fi
finish() {  # exit status; lets tee write its last lines first
  if [ -n "$out" ]; then exec >&- 2>&-; wait "$tee_pid" 2>/dev/null; fi
  exit "$1"
}
jobs=$(nproc)
results=()
notes=()  # facts repeated before the summary, which ends the (cut) output
note() { notes+=("$*"); echo "[note] $*"; }
record() {  # check, PASS|FAIL|SKIP, reason
  local line="$1 $2${3:+ ($3)}"
  results+=("$line")
  echo "--> $line"
}
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
t_start=$(now)

# ---------------------------------------------------------------------------------------------
# Machine, LibTorch, CUDA

echo "== machine"
nproc; g++ --version | head -1
gpu=0
if timeout 30 nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  gpu=1
  timeout 30 nvidia-smi -L
  timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
else
  echo "no GPU (nvidia-smi lists none): the CUDA checks will SKIP and their flows run on the CPU"
fi
[ -x "$ctrun" ] && [ -x "$carry/ct-watchdog" ] || { echo "missing $ctrun or $carry/ct-watchdog"; finish 1; }

echo; echo "== LibTorch"
torch_dir=${TORCH_DIR:-}
torch_abi=${TORCH_ABI:-}
extra_cxxflags=${TORCH_EXTRA_CXXFLAGS:-}
extra_libs=${TORCH_EXTRA_LIBS:-}
if [ "$torch_dir" = debian ]; then
  triplet=$(gcc -dumpmachine)
  torch_include=${TORCH_INCLUDE:-/usr/include}
  torch_lib=${TORCH_LIB:-/usr/lib/$triplet}
  # What Debian's TorchConfig.cmake adds: c10 is built with glog and gflags.
  extra_cxxflags=${TORCH_EXTRA_CXXFLAGS:--DGFLAGS_IS_A_DLL=0 -DGLOG_CUSTOM_PREFIX_SUPPORT}
  extra_libs=${TORCH_EXTRA_LIBS:--lglog -lgflags -lprotobuf}
  torch_abi=${torch_abi:-1}
else
  if [ -z "$torch_dir" ]; then
    echo "+ ${PYTHON:-python3} -c 'import torch; ...'"
    info=$(timeout 60 "${PYTHON:-python3}" -c 'import torch, os
print(os.path.dirname(torch.__file__), int(torch._C._GLIBCXX_USE_CXX11_ABI), torch.__version__, torch.version.cuda, torch.cuda.is_available())')
    echo "$info"
    read -r torch_dir py_abi py_version py_cuda py_cuda_ok <<<"$info"
    echo "python's torch $py_version, CUDA $py_cuda, torch.cuda.is_available() $py_cuda_ok"
    torch_abi=${torch_abi:-$py_abi}
  fi
  torch_include=${TORCH_INCLUDE:-$torch_dir/include}
  torch_lib=${TORCH_LIB:-$torch_dir/lib}
fi
torch_abi=${torch_abi:-1}
version_h=$torch_include/torch/csrc/api/include/torch/version.h
[ -f "$version_h" ] || { echo "no LibTorch headers: $version_h missing"; record build FAIL "no LibTorch"; printf '%s\n' "${results[@]}"; finish 1; }
# Newer LibTorch keeps the numbers in torch/headeronly/version.h, which this one includes; else
# python's torch.__version__ names it.
torch_version=$(cat "$version_h" "$torch_include/torch/headeronly/version.h" 2>/dev/null |
  awk '/define TORCH_VERSION_(MAJOR|MINOR|PATCH) / { v = v (v ? "." : "") $3 } END { print v }')
torch_version=${torch_version:-${py_version:-unknown}}
echo "LibTorch $torch_version: include $torch_include, lib $torch_lib, _GLIBCXX_USE_CXX11_ABI=$torch_abi"
# A Python wheel's LibTorch ships no gloo headers: torch_support.cc then leaves the gloo backend out
# (init_distributed refuses it with the reason), so nothing runs on the CPU across processes.
no_gloo=""
if [ ! -f "$torch_include/gloo/algorithm.h" ] && [ ! -f /usr/include/gloo/algorithm.h ]; then
  no_gloo="this LibTorch has no gloo headers (a Python wheel's): no CPU process group"
  notes+=("$no_gloo")
  echo "$no_gloo"
fi
cuda_libs=0
[ -e "$torch_lib/libtorch_cuda.so" ] && cuda_libs=1
echo "libtorch_cuda.so: $([ $cuda_libs = 1 ] && echo present || echo absent)"

# CUDA headers for ProcessGroupNCCL.hpp: the toolkit first, then the wheels' nvidia/*/include.
cuda_incs=()
nccl_reason=""
if [ $cuda_libs = 1 ]; then
  cands=("${CUDA_HOME:-/usr/local/cuda}/include")
  for d in "$torch_dir"/../nvidia/*/include; do [ -d "$d" ] && cands+=("$(cd "$d" && pwd)"); done
  for d in "${cands[@]}"; do [ -d "$d" ] && cuda_incs+=("$d"); done
  ls "$torch_dir/../nvidia" 2>/dev/null | tr '\n' ' ' | sed 's/^/python packages under nvidia\/: /'; echo
  echo "CUDA include candidates: ${cuda_incs[*]:-none}"
  for h in nccl.h cuda_runtime_api.h cublas_v2.h cusparse.h; do
    found=""
    for d in "${cuda_incs[@]}"; do [ -f "$d/$h" ] && { found=$d/$h; break; }; done
    echo "  $h: ${found:-NOT FOUND}"
    [ -n "$found" ] || nccl_reason="${nccl_reason:+$nccl_reason, }no $h"
  done
else
  nccl_reason="LibTorch has no libtorch_cuda.so"
fi

# ---------------------------------------------------------------------------------------------
# 1. Build

echo; echo "== 1. build"
bdir=$work/build
mkdir -p "$bdir"
sys_inc() { [ "$1" = /usr/include ] || printf -- '-isystem %s ' "$1"; }  # never reorder /usr/include
common="-O2 -pthread -I$repo/include -I$repo/src -I$repo/src/worker $(sys_inc "$carry/include")"
plain_flags="$common -DCTRUN_WORKER_HAVE_ZSTD=0"
torch_flags="$common $(sys_inc "$torch_include") $(sys_inc "$torch_include/torch/csrc/api/include")"
torch_flags+=" -DUSE_C10D_GLOO -DUSE_DISTRIBUTED -DCTRUN_WITH_TORCH=1 -D_GLIBCXX_USE_CXX11_ABI=$torch_abi $extra_cxxflags"
nccl_flags="-DUSE_C10D_NCCL -DCTRUN_TORCH_HAS_NCCL=1"
for d in "${cuda_incs[@]}"; do nccl_flags+=" $(sys_inc "$d")"; done
plain=(atomic_file crc32c error_file heartbeat launch_env snapshot_store warm_main)
# One script per object file, run in parallel by xargs -P (make is not on every machine).
compile_limit=${COMPILE_TIMEOUT:-240}  # seconds per file (a loaded 2-core machine needs more)
mkdir -p "$bdir/jobs"
write_job() {  # name, -std value, source, flags... (flags word-split on purpose)
  local name=$1 std=$2 src=$3; shift 3
  printf 'cd %q && timeout %s %q -std=%s %s -c %q -o %q >%q 2>&1 && mv %q %q\n' "$bdir" "$compile_limit" "${CXX:-g++}" "$std" "$*" \
    "$src" "$name.o.tmp" "$name.log" "$name.o.tmp" "$name.o" >"$bdir/jobs/$name.sh"
}
write_torch_jobs() {  # -std value, names...
  local std=$1; shift
  for n in "$@"; do
    case $n in
      torch_support_gloo) write_job "$n" "$std" "$repo/src/worker/torch_support.cc" $torch_flags ;;
      torch_support_nccl) write_job "$n" "$std" "$repo/src/worker/torch_support.cc" $torch_flags $nccl_flags ;;
      train) write_job "$n" "$std" "$repo/examples/train.cc" $torch_flags ;;
    esac
  done
}
run_jobs() {  # names...
  for n in "$@"; do echo "+ $(cat "$bdir/jobs/$n.sh")"; done
  printf '%s\n' "$@" | timeout $((compile_limit + 20)) xargs -P "$jobs" -I{} bash "$bdir/jobs/{}.sh"
}
torch_jobs=(torch_support_gloo train)
[ -z "$nccl_reason" ] && torch_jobs+=(torch_support_nccl)
# shellcheck disable=SC2086
for n in "${plain[@]}"; do write_job "$n" c++20 "$repo/src/worker/$n.cc" $plain_flags; done
write_torch_jobs c++20 "${torch_jobs[@]}"
t0=$(now)
run_jobs "${torch_jobs[@]}" "${plain[@]}"  # the long ones first
note "compile wall time: $(elapsed "$t0") s ($jobs jobs)"
build_std=c++20
# LibTorch's headers might need C++17: the LibTorch files that failed are tried again with it.
retry=()
for n in "${torch_jobs[@]}"; do [ -f "$bdir/$n.o" ] || retry+=("$n"); done
if [ ${#retry[@]} -gt 0 ]; then
  for n in "${retry[@]}"; do cp "$bdir/$n.log" "$bdir/$n.c++20.log"; done
  echo "again with -std=c++17: ${retry[*]} (failed with -std=c++20)"
  write_torch_jobs c++17 "${retry[@]}"
  t0=$(now)
  run_jobs "${retry[@]}"
  echo "c++17 retry wall time: $(elapsed "$t0") s"
  build_std="c++20, c++17 for ${retry[*]}"
fi
build_ok=1
for log in "$bdir"/*.log; do
  n=$(basename "$log" .log)
  o=$bdir/${n%.c++20}.o
  warnings=$(grep -c 'warning:' "$log")
  if [[ $n == *.c++20 ]] || [ ! -f "$o" ]; then
    echo "---- $n: FAILED (first 60 lines of the compiler's output)"
    head -60 "$log"
  else
    echo "---- $n: ok, $warnings warning(s)"
    [ "$warnings" -gt 0 ] && grep -A3 'warning:' "$log" | head -30
  fi
done
for n in "${plain[@]}" torch_support_gloo train; do [ -f "$bdir/$n.o" ] || build_ok=0; done
support=torch_support_gloo.o
if [ -z "$nccl_reason" ]; then
  if [ -f "$bdir/torch_support_nccl.o" ]; then support=torch_support_nccl.o; else nccl_reason="torch_support.cc with NCCL did not compile"; fi
fi
link_libs="-L$torch_lib -Wl,-rpath,$torch_lib -Wl,--no-as-needed -ltorch -ltorch_cpu"
[ $cuda_libs = 1 ] && link_libs+=" -ltorch_cuda -lc10_cuda"
link_libs+=" -lc10 -Wl,--as-needed $extra_libs -pthread"
train=$bdir/train
if [ $build_ok = 1 ]; then
  objs=""
  for n in "${plain[@]}"; do objs+=" $bdir/$n.o"; done
  echo "+ ${CXX:-g++} -o $train$objs $bdir/$support $bdir/train.o $link_libs"
  t0=$(now)
  # shellcheck disable=SC2086
  timeout 300 ${CXX:-g++} -o "$train" $objs "$bdir/$support" "$bdir/train.o" $link_libs >"$bdir/link.log" 2>&1
  rc=$?
  echo "link: rc $rc, $(elapsed "$t0") s"
  head -60 "$bdir/link.log"
  # Inline code of the CUDA headers may call the CUDA runtime or NCCL directly, which the torch
  # libraries do not export: link them too, the wheel's copies first (those torch loads).
  if [ $rc != 0 ] && [ $cuda_libs = 1 ] && grep -q "undefined reference to \`\(cuda\|nccl\)" "$bdir/link.log"; then
    more=""
    for lib in cudart nccl; do
      for f in "$torch_dir"/../nvidia/*/lib/lib$lib.so* "${CUDA_HOME:-/usr/local/cuda}"/lib64/lib$lib.so*; do
        [ -f "$f" ] && { more+=" $f -Wl,-rpath,$(dirname "$f")"; break; }
      done
    done
    echo "+ again, with$more"
    # shellcheck disable=SC2086
    timeout 300 ${CXX:-g++} -o "$train" $objs "$bdir/$support" "$bdir/train.o" $link_libs $more >"$bdir/link.log" 2>&1
    rc=$?
    echo "link: rc $rc"
    head -60 "$bdir/link.log"
  fi
  [ $rc = 0 ] || build_ok=0
fi
if [ $build_ok = 1 ]; then
  record build PASS "LibTorch $torch_version, -std=$build_std, train with $support"
else
  record build FAIL "LibTorch $torch_version: see the compiler output above"
fi
if [ -n "$nccl_reason" ]; then
  if [ $cuda_libs = 1 ]; then record build_nccl FAIL "$nccl_reason"; else record build_nccl SKIP "$nccl_reason"; fi
else
  record build_nccl PASS
fi
if [ -n "$out" ]; then
  { cat "$bdir"/jobs/*.sh; for log in "$bdir"/*.log; do echo "==== $(basename "$log")"; cat "$log"; done; } >"$out/build.log"
fi
if [ $build_ok = 0 ]; then
  echo; echo "== summary"; printf '%s\n' "${results[@]}"
  [ -n "$out" ] && printf '%s\n' "${results[@]}" >"$out/summary.txt"
  finish 1
fi
ldd "$train" | grep -E 'torch|c10|nccl|cuda' | head -20

# ---------------------------------------------------------------------------------------------
# Runs under ctrun

# The worker prints what it was given before exec'ing train: proof that CUDA_VISIBLE_DEVICES= got
# through. Proof that a run used the GPU: NCCL's version line (NCCL_DEBUG=VERSION prints it once a
# communicator exists), or train among nvidia-smi's compute processes, sampled during the run.
wrap=$work/train_wrapped.sh
cat >"$wrap" <<EOS
#!/bin/sh
echo "[wrap] rank \$RANK local_rank \$LOCAL_RANK CUDA_VISIBLE_DEVICES=\${CUDA_VISIBLE_DEVICES-<unset>}"
exec "$train" "\$@"
EOS
chmod +x "$wrap"
export NCCL_DEBUG=VERSION
T_ARGS=(--epochs 2 --dataset-size 512 --batch-size 16 --snapshot-every 8 --quiet)
# A run takes seconds; one that hangs at exit (finished, never returned) is stopped at run_limit
# (SIGTERM: ctrun stops its workers; SIGKILL 10 s later), and later runs get a shorter limit.
run_limit=60
run() {  # name, env assignments..., then the ctrun arguments
  local name=$1; shift
  local envs=()
  while [[ $1 == *=* && $1 != -* ]]; do envs+=("$1"); shift; done
  echo; echo "== $name: ${envs[*]} $ctrun $*"
  local t0 watch=""
  t0=$(now)
  if [ $gpu = 1 ]; then
    while :; do nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>/dev/null; sleep 0.3; done \
      >"$work/$name.gpu" &
    watch=$!
  fi
  env "${envs[@]}" timeout -k 10 "$run_limit" "$ctrun" "$@" >"$work/$name.log" 2>&1
  local rc=$?
  if [ -n "$watch" ]; then kill "$watch"; wait "$watch" 2>/dev/null; fi
  cat "$work/$name.log"
  echo "[$name: rc $rc, $(elapsed "$t0") s]"
  if [ $gpu = 1 ]; then echo "[$name: GPU compute processes seen: $(sort -u "$work/$name.gpu" | head -3 | tr '\n' ';')]"; fi
  if [ $rc -ge 124 ] && grep -q '\[train\] done:' "$work/$name.log"; then
    echo "[$name: train finished but the job did not end within $run_limit s: a hang at exit]"
    run_limit=25
  fi
  return $rc
}
has() { grep -q -- "$2" "$work/$1.log"; }
on_gpu() { has "$1" 'NCCL version' || grep -q 'train' "$work/$1.gpu" 2>/dev/null; }
# Compares two --out files; prints the verdict and, when they differ, the first parameters that do.
same_params() {
  local a=$1 b=$2
  [ -s "$a" ] && [ -s "$b" ] || { echo "params: a file is missing or empty"; return 2; }
  sha256sum "$a" "$b" | sed "s|$work/||"
  note "$(basename "$a") $(sha256sum <"$a" | cut -c1-16) vs $(basename "$b") $(sha256sum <"$b" | cut -c1-16)"
  if cmp -s "$a" "$b"; then echo "params: bit-identical"; return 0; fi
  echo "params: DIFFERENT; differing tensors:"
  diff <(cut -d' ' -f1 "$a") <(cut -d' ' -f1 "$b") >/dev/null || echo "  (the parameter lists differ)"
  note "differing tensors: $(paste -d'\n' "$a" "$b" | paste - - | awk '$3 != $6 { printf "%s ", $1 }')"
  return 1
}
snapshots() { ls "$1"/rank* 2>/dev/null | tr '\n' ' '; }
one=(--standalone --nproc-per-node=1)
if [ $gpu = 1 ]; then dev=gpu; else dev=cpu; fi
cpu_env=(CUDA_VISIBLE_DEVICES=)

# 2. Crash between snapshots (steps 8 and 16), one restart, resume from step 8, same result.
echo; echo "== 2. crash and resume on the $dev"
run base_$dev "${one[@]}" "$wrap" "${T_ARGS[@]}" --out "$work/base_$dev.params"
base_rc=$?
run resume_$dev "${one[@]}" --max-restarts 1 "$wrap" "${T_ARGS[@]}" --snapshot-dir "$work/snap_resume" \
  --fail-at-step 13 --out "$work/resume_$dev.params"
rc=$?
why=""
[ $rc = 0 ] || why="rc $rc"
has resume_$dev 'injecting failure at step 13' || why+="${why:+, }no injected failure"
has resume_$dev 'attempt 1: resumed from snapshot at step 8 ' || why+="${why:+, }no resume from step 8"
has resume_$dev 'done: 64 steps, attempt 1' || why+="${why:+, }did not finish in attempt 1"
if [ $gpu = 1 ]; then
  on_gpu resume_$dev || why+="${why:+, }not seen on the GPU"
  on_gpu base_$dev || why+="${why:+, }uncrashed run not seen on the GPU"
fi
[ $base_rc = 0 ] || why+="${why:+, }uncrashed run rc $base_rc"
if [ -z "$why" ]; then record "resume_$dev" PASS "resumed from step 8, finished"; else record "resume_$dev" FAIL "$why"; fi
same_params "$work/base_$dev.params" "$work/resume_$dev.params"
case $? in
  0) record "params_identical_$dev" PASS "crashed+resumed == uncrashed, bit for bit" ;;
  2) record "params_identical_$dev" FAIL "a run wrote no parameters" ;;
  *)
    # Is an uncrashed run itself repeatable here (bf16 autocast on CUDA may not be)?
    run base2_$dev "${one[@]}" "$wrap" "${T_ARGS[@]}" --out "$work/base2_$dev.params"
    if same_params "$work/base_$dev.params" "$work/base2_$dev.params"; then
      record "params_identical_$dev" FAIL "resumed run differs; two uncrashed runs are identical"
    else
      record "params_identical_$dev" FAIL "resumed run differs; so do two uncrashed runs (not deterministic)"
    fi
    ;;
esac

# 2b. The same crash and resume with --warm: train (CTRUN_MAIN) is started once as the warm server
#     with LibTorch loaded, and both attempts' workers are forked from it; none may start cold
#     (libcuda is mapped by a CUDA LibTorch; the driver must still be uninitialised in the server).
echo; echo "== 2b. crash and resume on the $dev, --warm"
run warm_$dev "${one[@]}" --warm --max-restarts 1 "$train" "${T_ARGS[@]}" --snapshot-dir "$work/snap_warm" \
  --fail-at-step 13 --out "$work/warm_$dev.params"
rc=$?
why=""
[ $rc = 0 ] || why="rc $rc"
has warm_$dev '--warm: worker server pid' || why+="${why:+, }no warm server"
! grep -qE 'starts? cold|started cold' "$work/warm_$dev.log" || why+="${why:+, }workers started cold"
has warm_$dev 'attempt 1: resumed from snapshot at step 8 ' || why+="${why:+, }no resume from step 8"
[ $gpu = 1 ] && { on_gpu warm_$dev || why+="${why:+, }not seen on the GPU"; }
same_params "$work/base_$dev.params" "$work/warm_$dev.params" || why+="${why:+, }parameters differ from the uncrashed cold run"
if [ -z "$why" ]; then record "warm_$dev" PASS "forked from the server, resumed from step 8, bit-identical to cold"
else record "warm_$dev" FAIL "$why"; fi

# 3. Cross-device resume: a run that crashes with no restart left leaves snapshots (step 8); a
#    second run on the other device resumes from them (attempt 0: it finds them) and finishes.
echo; echo "== 3. snapshots resumed on the other device"
cross() {  # check name, save env..., --, resume env...
  local check=$1; shift
  local save_env=() resume_env=()
  while [ "$1" != -- ]; do save_env+=("$1"); shift; done; shift
  resume_env=("$@")
  local dir=$work/snap_$check
  run "${check}_save" "${save_env[@]}" "${one[@]}" --max-restarts 0 "$wrap" "${T_ARGS[@]}" --sync-snapshot \
    --snapshot-dir "$dir" --fail-at-step 13
  local save_rc=$?
  echo "snapshots left: $(snapshots "$dir/rank0")"
  run "${check}_resume" "${resume_env[@]}" "${one[@]}" "$wrap" "${T_ARGS[@]}" --snapshot-dir "$dir" \
    --out "$work/$check.params"
  local rc=$? why=""
  [ $save_rc != 0 ] && has "${check}_save" 'injecting failure at step 13' || why="the saving run did not crash as injected"
  [ $rc = 0 ] || why+="${why:+, }resume rc $rc"
  has "${check}_resume" 'attempt 0: resumed from snapshot at step 8 ' || why+="${why:+, }no resume from step 8"
  has "${check}_resume" 'done: 64 steps, attempt 0' || why+="${why:+, }did not finish"
  if [ $gpu = 1 ]; then  # the device each run was on
    local saved_on=cpu resumed_on=cpu
    on_gpu "${check}_save" && saved_on=gpu
    on_gpu "${check}_resume" && resumed_on=gpu
    echo "$check: saved on the $saved_on, resumed on the $resumed_on"
    [ "$check" = "cross_${saved_on}_to_${resumed_on}" ] || why+="${why:+, }ran ${saved_on} -> ${resumed_on}"
  fi
  if [ -z "$why" ]; then
    if [ $gpu = 1 ]; then record "$check" PASS; else record "$check" SKIP "no GPU; the same flow ran CPU -> CPU: ok"; fi
  else
    if [ $gpu = 1 ]; then record "$check" FAIL "$why"; else record "$check" FAIL "no GPU, CPU -> CPU flow: $why"; fi
  fi
}
if [ -n "$no_gloo" ]; then
  record cross_gpu_to_cpu SKIP "$no_gloo"
  record cross_cpu_to_gpu SKIP "$no_gloo"
else
  cross cross_gpu_to_cpu -- "${cpu_env[@]}"
  cross cross_cpu_to_gpu "${cpu_env[@]}" --
fi

# 4. Two workers on the CPU (gloo): rank 1 crashes between snapshots; resume; same result.
two_workers_cpu() {
  echo; echo "== 4. two workers on the CPU (gloo)"
  two=(--standalone --nproc-per-node=2)
  run two_base "${cpu_env[@]}" "${two[@]}" "$wrap" "${T_ARGS[@]}" --out "$work/two_base.params"
  base_rc=$?
  run two_resume "${cpu_env[@]}" "${two[@]}" --max-restarts 1 "$wrap" "${T_ARGS[@]}" --snapshot-dir "$work/snap_two" \
    --fail-at-step 13 --fail-rank 1 --out "$work/two_resume.params"
  rc=$?
  why=""
  [ $base_rc = 0 ] || why="uncrashed run rc $base_rc"
  [ $rc = 0 ] || why+="${why:+, }rc $rc"
  has two_resume 'rank 1 injecting failure at step 13' || why+="${why:+, }no injected failure"
  has two_resume 'attempt 1: resumed from snapshot at step 8 ' || why+="${why:+, }no resume from step 8"
  has two_resume 'done: 32 steps, attempt 1' || why+="${why:+, }did not finish in attempt 1"
  same_params "$work/two_base.params" "$work/two_resume.params" || why+="${why:+, }parameters differ from the uncrashed run"
  if [ -z "$why" ]; then record two_workers_cpu PASS "resumed from step 8, bit-identical"; else record two_workers_cpu FAIL "$why"; fi
}
if [ -n "$no_gloo" ]; then record two_workers_cpu SKIP "$no_gloo"; else two_workers_cpu; fi
record two_workers_one_gpu SKIP "train has no backend option: with CUDA it takes NCCL, which refuses two ranks on one GPU"

echo; echo "== notes"
printf '%s\n' "${notes[@]}"
grep -h -m1 'NCCL version' "$work"/*.log 2>/dev/null | head -1 | sed 's/^/NCCL: /'
echo; echo "== summary (LibTorch $torch_version, $(elapsed "$t_start") s in all)"
printf '%s\n' "${results[@]}"
[ -n "$out" ] && printf '%s\n' "${results[@]}" >"$out/summary.txt"
for r in "${results[@]}"; do [[ $r == *" FAIL"* ]] && finish 1; done
finish 0
