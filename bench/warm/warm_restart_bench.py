#!/usr/bin/python3
"""Crash -> first training step of the next attempt for examples/train.py (gloo DDP), side by side:
ctrun cold, ctrun --warm, ctrun --warm with the script's own imports preloaded, and torchrun 1.13
(../shared/bench/torchrun-baseline) with --monitor_interval=0.1 and with its default (5 s).
With --example cc the same for the C++ LibTorch example BUILD_DIR/examples/train (CTRUN_MAIN):
ctrun cold, ctrun --warm (the binary started once as the server), torchrun --no_python.

Rank 1 crashes at step 12 of attempt 0 (mid-epoch, not a snapshot step); attempt 1 resumes from the
step-10 snapshot. train.py --timing stamps (unix ns, CLOCK_REALTIME): the crash, and in attempt 1 on
rank 0: script start (before `import torch`), imports done, process group ready, snapshot loaded,
first step done. The C++ train stamps train_main's entry instead of the script start (the dynamic
loading of LibTorch comes before it: in "spawn"), and has no import phase. ctrun's own log gives the moment it decided to restart (detection + teardown).
PSS: the sum of /proc/<pid>/smaps_rollup Pss over every process below the launcher (workers, and
for --warm the server and the waiting children), sampled once attempt 1 has done its first step;
the launcher's own PSS beside it.

Usage: /usr/bin/python3 bench/warm/warm_restart_bench.py BUILD_DIR [--reps N] [--nproc N] [--only LABEL]
                                                          [--example py|cc]
"""
import argparse
import datetime
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TRAIN = os.path.join(ROOT, "examples", "train.py")
TORCHRUN = os.environ.get("TORCHRUN", os.path.join(ROOT, "..", "shared", "bench", "torchrun-baseline"))
STAMP = re.compile(r"timing rank (\d+) attempt (\d+) (\w+) unix_ns=(\d+)")
RESTART = re.compile(r"\[ctrun\] \w (\d\d):(\d\d):(\d\d)\.(\d\d\d) restarting all workers")


def descendants(root):
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                s = f.read()
            ppid = int(s[s.rfind(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def pss_kib(pid):
    try:
        with open("/proc/%d/smaps_rollup" % pid) as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_once(label, argv, env, work, program):
    snap = os.path.join(work, "snap")
    shutil.rmtree(snap, ignore_errors=True)
    out_path = os.path.join(work, "out.txt")
    args = argv + [program, "--epochs", "6", "--snapshot-dir", snap, "--snapshot-every", "5", "--fail-at-step", "12",
                   "--fail-rank", "1", "--timing", "--quiet", "--step-ms", "20"]
    with open(out_path, "w") as out:
        p = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)
        pss_workers = pss_launcher = None
        deadline = time.time() + 300
        while p.poll() is None and time.time() < deadline:
            with open(out_path) as f:
                text = f.read()
            if pss_workers is None and re.search(r"attempt 1 first_step", text):
                pids = descendants(p.pid)
                pss_workers = sum(pss_kib(x) for x in pids)
                pss_launcher = pss_kib(p.pid)
            time.sleep(0.01)
        if p.poll() is None:
            p.kill()
        p.wait()
    with open(out_path) as f:
        text = f.read()
    if p.returncode != 0:
        sys.exit("%s failed (exit %s):\n%s" % (label, p.returncode, text[-3000:]))
    st = {}
    for m in STAMP.finditer(text):
        st[(int(m.group(1)), int(m.group(2)), m.group(3))] = int(m.group(4)) / 1e6  # ms
    crash = st[(1, 0, "crash")]
    a1 = {k[2]: v for k, v in st.items() if k[0] == 0 and k[1] == 1}
    imported = a1.get("imported", a1["start"])  # the C++ example has no import phase
    r = {"total": a1["first_step"] - crash, "pg": a1["pg_ready"] - imported, "load": a1["resumed"] - a1["pg_ready"],
         "step": a1["first_step"] - a1["resumed"], "to_start": a1["start"] - crash,
         "pss_mib": (pss_workers or 0) / 1024.0, "launcher_mib": (pss_launcher or 0) / 1024.0}
    if "imported" in a1:
        r["import"] = a1["imported"] - a1["start"]
    m = RESTART.search(text)
    if m:
        day = datetime.datetime.fromtimestamp(crash / 1000.0)
        t = day.replace(hour=int(m.group(1)), minute=int(m.group(2)), second=int(m.group(3)),
                        microsecond=int(m.group(4)) * 1000).timestamp() * 1000.0
        r["detect_teardown"] = t - crash
        r["spawn"] = a1["start"] - t
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--only", default="")
    ap.add_argument("--example", choices=["py", "cc"], default="py")
    a = ap.parse_args()
    ctrun = os.path.join(a.build, "ctrun")
    n = "--nproc_per_node=%d" % a.nproc
    env = dict(os.environ, PYTHON_EXEC="/usr/bin/python3")
    program = TRAIN if a.example == "py" else os.path.abspath(os.path.join(a.build, "examples", "train"))
    configs = [
        ("ctrun cold", [ctrun, "--standalone", n, "--max_restarts=1"]),
        ("ctrun --warm", [ctrun, "--standalone", n, "--max_restarts=1", "--warm"]),
        ("ctrun --warm (+@script)", [ctrun, "--standalone", n, "--max_restarts=1", "--warm",
                                     "--warm-preload=torch,torch.distributed,@script"]),
        ("torchrun 1.13, monitor 0.1 s", ["/usr/bin/python3", TORCHRUN, "--standalone", n, "--max_restarts=1",
                                          "--monitor_interval=0.1"]),
        ("torchrun 1.13, default 5 s", ["/usr/bin/python3", TORCHRUN, "--standalone", n, "--max_restarts=1"]),
    ]
    if a.example == "cc":  # no @script row; torchrun runs a binary with --no_python
        configs = [(label, argv + ["--no_python"] if "torchrun" in label else argv)
                   for label, argv in configs if "@script" not in label]
    work = tempfile.mkdtemp()
    rows = []
    try:
        for label, argv in configs:
            if a.only and a.only not in label:
                continue
            runs = [run_once(label, argv, env, work, program) for _ in range(a.reps)]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            print("%s: %s" % (label, ", ".join("%s=%.0f" % (k, r["total"]) for k, r in
                                               zip(["run%d" % i for i in range(len(runs))], runs))), flush=True)
            rows.append((label, med))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def f(med, k):
        return "%.0f ms" % med[k] if k in med else "-"

    print()
    print("| %s, %d ranks, median of %d | crash → first step | detection + teardown | spawn%s | import | "
          "process group | snapshot load | first step | PSS of workers (+ server) | launcher PSS |" % (
              os.path.basename(program), a.nproc, a.reps, " (+ loading LibTorch)" if a.example == "cc" else ""))
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, med in rows:
        spawn = f(med, "spawn") if "spawn" in med else "%s (crash → script start)" % f(med, "to_start")
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %.0f MiB | %.0f MiB |" % (
            label, f(med, "total"), f(med, "detect_teardown"), spawn, f(med, "import"), f(med, "pg"),
            f(med, "load"), f(med, "step"), med["pss_mib"], med["launcher_mib"]))
    base = dict(rows).get("torchrun 1.13, monitor 0.1 s")
    if base:
        for label, med in rows:
            print("%s: %.2f of torchrun (monitor 0.1 s)" % (label, med["total"] / base["total"]))


if __name__ == "__main__":
    main()
