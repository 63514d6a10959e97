#!/usr/bin/python3
"""ctrun's cold path vs this machine's bare limit (and torchrun), side by side in one run; not a test.

The bare limit is bench/core/bare_limit.c (built as ctrun_bare_limit): the same process work in
plain C that ../shared/bench/restart_limit.c does (posix_spawn, kill, reap), on the same worker.

  1. launch: N workers of /bin/true (8 by default) -- wall time of the whole command, from a
     posix_spawn here to its reaping. The launcher's peak RSS is taken in one more run under GNU
     time (%M: ru_maxrss of the launcher and the largest of its reaped children).
  2. failure -> all-restarted latency with 4 and 64 workers (bench/core/restart_worker.c): rank 0
     exits 1 once all ranks are up; latency = the last restarted worker's first instruction - the
     failing worker's exit stamp (CLOCK_MONOTONIC, system-wide).
With --breakdown, ctrun runs once more per rep with --events-file and the restart latency is cut
into phases by the events' CLOCK_MONOTONIC stamps: detect (failing worker's stamp -> its exit
seen), teardown (-> the last worker of attempt 0 reaped), prepare (-> attempt 1 starts: the
sweep of leftovers, log directories, output plans, cgroups), spawn (-> the last restarted
worker's first instruction).
With --baseline CTRUN, a second ctrun binary (say main's, copied aside) runs in every row beside
the one under test, as the launcher "baseline", for before/after comparisons of the binary itself.
Every row alternates its launchers rep by rep (ctrun, bare, ctrun, bare, ...), so a change of load
on a shared machine hits both alike. Medians with [min-max]; ratios are of the medians.

Usage: bench/core/launch_restart.py BUILD_DIR [--reps N] [--no-torchrun] [--launch-nproc N] [--breakdown]
                                    [--baseline CTRUN]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = os.path.join(HERE, "..", "..", "..", "shared", "bench", "torchrun-baseline")
# The workers' stamp files live on a memory file system where there is one: each restart run
# creates and removes nproc + 1 of them, and on ext4 without a journal every file or directory
# created within minutes of such removals pays a scan past the recently freed inodes, which would
# slow the launchers' own log directories more and more as the run goes on.
STAMP_BASE = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


def wall_ms(argv, env):
    """Wall time from the launcher's start to its reaping. The wait blocks in waitpid: a wait with a
    timeout (subprocess.run(timeout=...)) polls with doubling sleeps (0.5, 1, 2, 4 ... ms) and
    rounds a 14 ms run up to ~31 ms. The 600 s limit is a timer that kills the launcher."""
    t0 = time.monotonic()
    p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    timer = threading.Timer(600, p.kill)
    timer.start()
    try:
        returncode = p.wait()
    finally:
        timer.cancel()
    wall = (time.monotonic() - t0) * 1000
    if returncode != 0:
        sys.exit(f"{argv[0]} failed with {returncode}: {' '.join(argv)}")
    return wall


def peak_rss_mib(argv, env):
    with tempfile.NamedTemporaryFile(mode="r", suffix=".rss") as rss:
        subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss.name] + argv, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
        lines = [l for l in rss.read().splitlines() if l.strip().isdigit()]
    return int(lines[-1]) / 1024 if lines else 0.0


class Launchers:
    """Command lines of every launcher under test, for launch and for restart."""

    def __init__(self, build, torchrun, baseline=None):
        self.env = dict(os.environ, OMP_NUM_THREADS="1")
        self.ctrun = [os.path.join(build, "ctrun"), "--standalone"]
        self.baseline = [os.path.abspath(baseline), "--standalone"] if baseline else None
        self.bare = os.path.join(build, "bench", "core", "ctrun_bare_limit")
        self.worker = os.path.join(build, "bench", "core", "ctrun_restart_worker")
        self.torchrun = [torchrun, "--standalone"] if torchrun else None

    def launch(self, nproc):
        out = [("ctrun", self.ctrun + [f"--nproc_per_node={nproc}", "--no_python", "/bin/true"]),
               ("bare", [self.bare, "launch", str(nproc), "/bin/true"])]
        if self.baseline:
            out.append(("baseline", self.baseline + [f"--nproc_per_node={nproc}", "--no_python", "/bin/true"]))
        if self.torchrun:
            out.append(("torchrun", self.torchrun + [f"--nproc_per_node={nproc}", "--no_python", "/bin/true"]))
        return out

    def restart(self, nproc):
        """(label, function of the stamp directory -> argv)."""
        flags = ["--max_restarts=1", f"--nproc_per_node={nproc}", "--no_python"]
        out = [("ctrun", lambda d: self.ctrun + flags + [self.worker, d]),
               ("bare", lambda d: [self.bare, "restart", str(nproc), self.worker, d])]
        if self.baseline:
            out.append(("baseline", lambda d: self.baseline + flags + [self.worker, d]))
        if self.torchrun:
            out.append(("torchrun 0.1 s", lambda d: self.torchrun + ["--monitor_interval=0.1"] + flags + [self.worker, d]))
            out.append(("torchrun 5 s", lambda d: self.torchrun + flags + [self.worker, d]))
        return out


def restart_latency_ms(argv_of, nproc, env):
    d = tempfile.mkdtemp(prefix="ctrun_bench_", dir=STAMP_BASE)
    try:
        wall_ms(argv_of(d), env)
        fail = int(open(os.path.join(d, "fail_ns")).read())
        starts = [int(open(os.path.join(d, f"start.{i}")).read()) for i in range(nproc)]
        return (max(starts) - fail) / 1e6
    finally:
        shutil.rmtree(d)


def restart_phases_ms(ctrun, worker, nproc, env):
    """One ctrun restart run with --events-file; its latency cut into phases (ms)."""
    d = tempfile.mkdtemp(prefix="ctrun_bench_", dir=STAMP_BASE)
    try:
        ev = os.path.join(d, "events.jsonl")
        wall_ms(ctrun + ["--max_restarts=1", f"--nproc_per_node={nproc}", "--no_python", "--events-file", ev,
                         worker, d], env)
        events = [json.loads(l) for l in open(ev)]
        fail = int(open(os.path.join(d, "fail_ns")).read())
        last_start = max(int(open(os.path.join(d, f"start.{i}")).read()) for i in range(nproc))
    finally:
        shutil.rmtree(d)
    exits = [e["mono_ns"] for e in events if e["event"] == "worker_exit" and e["attempt"] == 0]
    seen = min(exits)
    attempt1 = next(e["mono_ns"] for e in events if e["event"] == "attempt_start" and e["attempt"] == 1)
    return {"detect": (seen - fail) / 1e6, "teardown": (max(exits) - seen) / 1e6,
            "prepare": (attempt1 - max(exits)) / 1e6, "spawn": (last_start - attempt1) / 1e6}


def breakdown(L, nproc, reps):
    runs = [restart_phases_ms(L.ctrun, L.worker, nproc, L.env) for _ in range(reps)]
    print(f"ctrun phases, {nproc} workers (--events-file stamps, {reps} runs): " +
          ", ".join(f"{k} {statistics.median([r[k] for r in runs]):.2f} ms" for k in runs[0]))


def interleaved(variants, reps, measure):
    """{label: [values]}, measuring the variants in turn, rep by rep."""
    out = {label: [] for label, _ in variants}
    for _ in range(reps):
        for label, what in variants:
            out[label].append(measure(what))
    return out


def fmt(values):
    return f"{statistics.median(values):8.2f} ms [{min(values):.2f}-{max(values):.2f}]"


def ms(value):
    """Two decimals where they matter (ctrun, a baseline ctrun), none for torchrun's seconds."""
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


def report(title, results, reps):
    print(f"\n== {title} ({reps} runs each, interleaved) ==")
    for label, v in results.items():
        print(f"{label:15s} median {fmt(v)}")
    c, b = statistics.median(results["ctrun"]), statistics.median(results["bare"])
    print(f"ctrun / bare    {c / b:.2f}x")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--launch-nproc", type=int, default=8)
    ap.add_argument("--no-torchrun", action="store_true")
    ap.add_argument("--breakdown", action="store_true")
    ap.add_argument("--baseline", metavar="CTRUN", help="a second ctrun binary, run beside the one under test")
    args = ap.parse_args()
    torchrun = None if args.no_torchrun else os.path.abspath(TORCHRUN)
    if torchrun and not os.path.exists(torchrun):
        print(f"note: {torchrun} not found; ctrun and the bare limit only")
        torchrun = None
    L = Launchers(args.build, torchrun, args.baseline)
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"machine: {os.cpu_count()} CPUs, load average {load}; launcher under test: {args.build}/ctrun")
    if args.baseline:
        print(f"baseline: {args.baseline}")

    rows = []
    launch = interleaved(L.launch(args.launch_nproc), args.reps, lambda argv: wall_ms(argv, L.env))
    report(f"launch: {args.launch_nproc} x /bin/true, wall", launch, args.reps)
    rows.append((f"launch {args.launch_nproc} × `/bin/true`, wall", launch))
    rss = {label: peak_rss_mib(argv, L.env) for label, argv in L.launch(args.launch_nproc)}
    print("peak RSS (MiB): " + ", ".join(f"{k} {v:.1f}" for k, v in rss.items()))
    for n in (4, 64):
        res = interleaved(L.restart(n), args.reps, lambda argv_of: restart_latency_ms(argv_of, n, L.env))
        report(f"failure -> all {n} workers restarted", res, args.reps)
        rows.append((f"failure → all restarted, {n} workers", res))
        if args.breakdown:
            breakdown(L, n, args.reps)

    print("\n== summary (medians; [min-max]) ==")
    extra = [k for k in rows[-1][1] if k not in ("ctrun", "bare")]
    print("| metric | ctrun | bare limit | ctrun / bare |" + "".join(f" {k} |" for k in extra))
    print("|---|---|---|---|" + "---|" * len(extra))
    for name, r in rows:
        c, b = statistics.median(r["ctrun"]), statistics.median(r["bare"])
        cells = "".join(f" {ms(statistics.median(r[k]))} ms |" if k in r else " - |" for k in extra)
        print(f"| {name} | {c:.2f} ms [{min(r['ctrun']):.2f}-{max(r['ctrun']):.2f}] | "
              f"{b:.2f} ms [{min(r['bare']):.2f}-{max(r['bare']):.2f}] | {c / b:.2f}× |{cells}")
    print(f"| launcher peak RSS | {rss['ctrun']:.1f} MiB | {rss['bare']:.1f} MiB | - |"
          + "".join(f" {rss[k]:.1f} MiB |" if k in rss else " - |" for k in extra))


if __name__ == "__main__":
    main()
