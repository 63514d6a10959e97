#!/bin/bash
# GPU checks that cannot run on a machine without GPUs (prepared on one; run on a GPU machine):
#   1. --nproc-per-node=gpu counts the GPUs (NVML) and nccl_allreduce runs under ctrun;
#   2. --virtual-local-rank: each worker sees only its GPU, as device 0;
#   3. --numa-binding=node / exclusive with --report-bindings: CPUs from each GPU's PCI locality,
#      and the workers' real affinity (taskset -p) matching the report;
#   4. a forced failure (rank 1, or rank 0 on one GPU, SIGKILLed while holding GPU memory) and a restart that waits until
#      the previous attempt's processes are gone from every GPU (nvidia-smi shows none before the
#      new attempt's workers start);
#   5. --gpus 0 runs one worker on GPU 0 only;
#   6. two agents of a multi-node job on loopback (python3 with torch): a failure, and each node's
#      wait for its workers' GPU release before the next round's workers start;
#   7. --warm with CUDA and NCCL (python3 with torch): workers forked from the warm server use the
#      GPU, and a restart forks them again; none starts cold.
# Usage: bench/gpu/gpu_check.sh BUILD_DIR   (BUILD_DIR has ctrun and examples/nccl_allreduce)
# Prints every command and its output; ends with a PASS/FAIL line per check and exits non-zero if
# any failed. Each ctrun run is bounded by `timeout`.
set -uo pipefail
build=$(cd "${1:?build dir}" && pwd)
ctrun=$build/ctrun
nccl=$build/examples/nccl_allreduce
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
results=()
record() { results+=("$1 $2"); echo "--> $1: $2"; }
run() {  # name, command...: runs with a 180 s bound, output to $work/<name>.log and the console
  local name=$1; shift
  echo; echo "== $name: $*"
  timeout -s KILL 180 "$@" >"$work/$name.log" 2>&1
  local rc=$?
  cat "$work/$name.log"
  return $rc
}

echo "== machine"; nvidia-smi -L; nproc; lstopo-no-graphics --no-io --of console 2>/dev/null | head -20
ngpu=$(nvidia-smi -L | grep -c '^GPU')
[ -x "$nccl" ] || { echo "missing $nccl (CUDA + NCCL not found at build time?)"; exit 1; }

# 1. one worker per GPU, NCCL all-reduce.
if run gpu_count "$ctrun" --standalone --nproc-per-node=gpu "$nccl" --iters=20 &&
   grep -q "starting $ngpu worker" "$work/gpu_count.log" &&
   [ "$(grep -c 'result OK' "$work/gpu_count.log")" -eq "$ngpu" ]; then
  record nproc_gpu_nccl PASS; else record nproc_gpu_nccl FAIL; fi

# 2. --virtual-local-rank: LOCAL_RANK=0 and one visible GPU each; nccl_allreduce binds device 0.
if run virtual "$ctrun" --standalone --nproc-per-node=gpu --virtual-local-rank "$nccl" --iters=5 &&
   [ "$(grep -c 'gpu 0: result OK' "$work/virtual.log")" -eq "$ngpu" ]; then
  record virtual_local_rank PASS; else record virtual_local_rank FAIL; fi

# 3. NUMA binding reported and applied: each worker prints its affinity before the all-reduce.
cat >"$work/affinity.sh" <<'EOS'
#!/bin/sh
echo "rank $RANK affinity $(taskset -cp $$ | sed 's/.*: //')"
exec "$NCCL" --iters=5
EOS
chmod +x "$work/affinity.sh"
for mode in node exclusive; do
  if NCCL=$nccl run "numa_$mode" "$ctrun" --standalone --nproc-per-node=gpu --numa-binding=$mode \
       --report-bindings "$work/affinity.sh" &&
     [ "$(grep -c 'binding: rank' "$work/numa_$mode.log")" -eq "$ngpu" ]; then
    ok=PASS
    for r in $(seq 0 $((ngpu - 1))); do  # the affinity the worker saw is the one reported
      reported=$(grep -o "binding: rank $r (local_rank $r): cpus [0-9,-]*" "$work/numa_$mode.log" | awk '{print $NF}')
      seen=$(grep -o "rank $r affinity [0-9,-]*" "$work/numa_$mode.log" | awk '{print $NF}')
      [ -n "$reported" ] && [ "$reported" = "$seen" ] || ok=FAIL
    done
    record "numa_binding_$mode" $ok
  else record "numa_binding_$mode" FAIL; fi
done

# 4. Forced failure with GPU memory held, restart after the release. Rank 1 of attempt 0 (rank 0
#    on a machine with one GPU, where it is the only rank) runs a long all-reduce and is
#    SIGKILLed after 8 s; the others are then stopped by ctrun. Before the
#    restart ctrun waits until NVML lists none of them; attempt 1 checks that no process of
#    attempt 0 is still on a GPU (nvidia-smi) and runs the all-reduce.
cat >"$work/fail_once.sh" <<'EOS'
#!/bin/sh
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  if [ "$RANK" = "$FAIL_RANK" ]; then exec timeout -s KILL 8 "$NCCL" --iters=100000000; fi
  exec "$NCCL" --iters=100000000
fi
if [ "$RANK" = 0 ]; then
  left=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -c . || true)
  echo "attempt 1 starts with $left compute process(es) on the GPUs"
fi
exec "$NCCL" --iters=5
EOS
chmod +x "$work/fail_once.sh"
start=$(date +%s%N)
if NCCL=$nccl FAIL_RANK=$((ngpu > 1 ? 1 : 0)) run restart "$ctrun" --standalone --nproc-per-node=gpu --max-restarts=1 --shutdown-timeout=5 \
     "$work/fail_once.sh" &&
   grep -q "restarting all workers" "$work/restart.log" &&
   grep -q "attempt 1 starts with 0 compute process" "$work/restart.log" &&
   [ "$(grep -c 'result OK' "$work/restart.log")" -eq "$ngpu" ]; then
  record restart_after_gpu_release PASS; else record restart_after_gpu_release FAIL; fi
echo "restart check took $((($(date +%s%N) - start) / 1000000)) ms"

# 5. --gpus 0: one worker, on GPU 0 only.
if run gpus_select "$ctrun" --standalone --nproc-per-node=gpu --gpus=0 --report-bindings "$nccl" --iters=5 &&
   grep -q "starting 1 worker" "$work/gpus_select.log" && grep -q "result OK" "$work/gpus_select.log"; then
  record gpus_select PASS; else record gpus_select FAIL; fi

# 6. Two agents of a multi-node job on loopback, one worker each, both on GPU 0 (python3 with torch:
#    each holds 1 GiB). Rank 1 exits 1 in attempt 0; both nodes wait for their workers' GPU release
#    beside the next round's rendezvous, and attempt 1 starts with no compute process left.
cat >"$work/hold_gpu.py" <<'EOS'
import os, subprocess, sys, time
import torch
r, a = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if a == 0:
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda:0"); torch.cuda.synchronize()
    print(f"rank {r} attempt 0 pid {os.getpid()} holds 1 GiB on the GPU", flush=True)
    if r == 1:
        time.sleep(3); sys.exit(1)
    time.sleep(600)
out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.split()
print(f"rank {r} attempt {a} starts with {len(out)} compute process(es) on the GPU", flush=True)
EOS
if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  port=$((29500 + RANDOM % 1000))
  for n in 0 1; do
    timeout -s KILL 150 "$ctrun" --nnodes=2 --nproc_per_node=1 --max_restarts=1 --rdzv_backend=c10d \
      --rdzv_endpoint=127.0.0.1:$port --rdzv_id=gpucheck "$work/hold_gpu.py" >"$work/multinode$n.log" 2>&1 &
  done
  wait
  ok=PASS
  for n in 0 1; do
    echo; echo "== multinode agent $n"; cat "$work/multinode$n.log"
    grep -q "no process of the previous attempt is left on the GPUs" "$work/multinode$n.log" &&
      grep -q "attempt 1 starts with 0 compute process" "$work/multinode$n.log" &&
      grep -q "all workers finished successfully" "$work/multinode$n.log" || ok=FAIL
  done
  record multinode_gpu_release $ok
else
  echo "multinode_gpu_release: skipped (python3 has no torch with CUDA)"
fi

# 7. --warm on CUDA (python3 with torch): the server imports torch and torch.distributed without
#    initialising CUDA, so it forks; each forked worker initialises CUDA and NCCL itself. The forced
#    failure (rank 1, or 0 on one GPU, SIGKILLed after its all-reduce in attempt 0) restarts every
#    worker from the server; no worker may start cold (ctrun warns "... start(s) cold" when one does).
#    Also timed, cold and warm: from the crash (the failing rank writes the time just before its
#    SIGKILL) to the end of rank 0's first all-reduce in attempt 1 (init_process_group included).
cat >"$work/warm_cuda.py" <<'EOS'
import os, signal, time
import torch
import torch.distributed as dist
r, lr, a = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
torch.cuda.set_device(lr)
dist.init_process_group("nccl")
t = torch.ones(1, device=f"cuda:{lr}") * (r + 1)
dist.all_reduce(t)
torch.cuda.synchronize()
print(f"rank {r} attempt {a} all-reduce {t.item():.0f} on {torch.cuda.get_device_name(lr)}", flush=True)
if a == 1 and r == 0:
    with open(os.environ["CRASH_AT"]) as f:
        print(f"crash to first all-reduce of attempt 1: {(time.time() - float(f.read())) * 1000:.0f} ms", flush=True)
if a == 0 and r == int(os.environ["FAIL_RANK"]):
    with open(os.environ["CRASH_AT"], "w") as f:
        f.write(repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)
dist.destroy_process_group()
EOS
if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  start=$(date +%s%N)
  FAIL_RANK=$((ngpu > 1 ? 1 : 0)) CRASH_AT=$work/crash_at run cold_cuda "$ctrun" --standalone --nproc-per-node=gpu \
    --max-restarts=1 "$work/warm_cuda.py"
  echo "cold: $(grep -h 'crash to first all-reduce' "$work/cold_cuda.log")"
  if FAIL_RANK=$((ngpu > 1 ? 1 : 0)) CRASH_AT=$work/crash_at run warm_cuda "$ctrun" --standalone --nproc-per-node=gpu --warm --max-restarts=1 \
       "$work/warm_cuda.py" &&
     grep -q "restarting all workers" "$work/warm_cuda.log" &&
     ! grep -qE "starts? cold|started cold" "$work/warm_cuda.log" &&
     [ "$(grep -c "attempt 1 all-reduce $((ngpu * (ngpu + 1) / 2))" "$work/warm_cuda.log")" -eq "$ngpu" ]; then
    record warm_cuda_nccl PASS; else record warm_cuda_nccl FAIL; fi
  echo "warm: $(grep -h 'crash to first all-reduce' "$work/warm_cuda.log")"
  echo "cold and warm runs took $((($(date +%s%N) - start) / 1000000)) ms"
else
  echo "warm_cuda_nccl: skipped (python3 has no torch with CUDA)"
fi

echo; echo "== summary"; printf '%s\n' "${results[@]}"
! printf '%s\n' "${results[@]}" | grep -q FAIL
