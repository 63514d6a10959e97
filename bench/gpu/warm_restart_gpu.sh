#!/bin/bash
# Crash -> first all-reduce of the next attempt on GPUs, ctrun cold against ctrun --warm (and the
# torchrun on PATH, --monitor-interval=0.1, when there is one), N runs each, alternated; prints
# every run and the medians. Not a test. Needs a python3 with a CUDA torch.
# The workers (one per GPU, NCCL) init the process group, all-reduce once and print; in attempt 0
# the failing rank (1, or 0 on one GPU) writes the time and SIGKILLs itself; rank 0 of attempt 1
# prints the time from that crash to the end of its first all-reduce (init_process_group included).
# Usage: bench/gpu/warm_restart_gpu.sh CTRUN_DIR [REPS]   (CTRUN_DIR holds ctrun and ct-watchdog)
set -uo pipefail
ctrun=$(cd "${1:?ctrun dir}" && pwd)/ctrun
reps=${2:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ngpu=$(nvidia-smi -L | grep -c '^GPU')
cat >"$work/restart.py" <<'EOS'
import os, signal, time
import torch
import torch.distributed as dist
r, lr, a = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
torch.cuda.set_device(lr)
dist.init_process_group("nccl")
t = torch.ones(1, device=f"cuda:{lr}")
dist.all_reduce(t)
torch.cuda.synchronize()
if a == 1 and r == 0:
    with open(os.environ["CRASH_AT"]) as f:
        print(f"crash to first all-reduce: {(time.time() - float(f.read())) * 1000:.0f} ms", flush=True)
if a == 0 and r == int(os.environ["FAIL_RANK"]):
    with open(os.environ["CRASH_AT"], "w") as f:
        f.write(repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)
dist.destroy_process_group()
EOS
declare -A all=([cold]="" [warm]="" [torchrun]="")
modes=(cold warm)
command -v torchrun >/dev/null && modes+=(torchrun)
for i in $(seq "$reps"); do
  for mode in "${modes[@]}"; do
    launcher=("$ctrun")
    [ $mode = warm ] && launcher+=(--warm)
    [ $mode = torchrun ] && launcher=(torchrun --monitor-interval=0.1)
    ms=$(FAIL_RANK=$((ngpu > 1 ? 1 : 0)) CRASH_AT=$work/crash_at timeout -s KILL 120 "${launcher[@]}" --standalone \
           --nproc-per-node=gpu --max-restarts=1 "$work/restart.py" 2>"$work/err" |
         sed -n 's/^crash to first all-reduce: \([0-9]*\) ms$/\1/p')
    grep -E 'cold|preloaded' "$work/err"
    echo "run $i $mode: ${ms:-FAILED} ms"
    all[$mode]+="${ms:-} "
  done
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2); else print "none" }'; }
cold=$(echo "${all[cold]}" | median)
warm=$(echo "${all[warm]}" | median)
torchrun=$(echo "${all[torchrun]}" | median)
echo "medians over $reps runs, $ngpu GPU(s): ctrun cold $cold ms, ctrun --warm $warm ms, torchrun 0.1 s $torchrun ms"
