#!/usr/bin/python3
"""Hang detection latency and heartbeat cost under ctrun (issue 10 benchmark; not a test).

  1. detection latency, 8 and 64 workers: every worker beats every 20 ms through the worker
     library; rank 1 stops beating after 1 s. Latency = the last worker's SIGTERM arrival
     (CLOCK_MONOTONIC, recorded in the worker's handler) - (rank 1's last beat + the heartbeat
     timeout), i.e. deadline -> every worker signalled. --stack-timeout 0 (no stack capture); a
     second row with the capture on (eu-stack) shows what saving the stacks adds.
  2. heartbeat cost per beat, 8 and 64 workers beating at once, from the worker library (C++) and
     from Python (the README's two lines), paced PACE_US apart: mean, p50, p99 wall time of one
     call, and the worker's CPU time per beat (the paced loop with beats minus the same loop without).

Usage: bench/health/health_bench.py BUILD_DIR [--reps N] [--beats N] [--pace-us US]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def read_rank_files(d, n):
    out = []
    for r in range(n):
        with open(os.path.join(d, f"out.{r}")) as f:
            out.append(f.read())
    return out


def latency(build, n, timeout, stack, reps):
    worker = os.path.join(build, "bench", "health", "ctrun_health_bench_worker")
    vals = []
    for _ in range(reps):
        with tempfile.TemporaryDirectory() as d:
            cmd = [os.path.join(build, "ctrun"), f"--nproc_per_node={n}", f"--heartbeat-timeout={timeout}",
                   "--heartbeat-first-timeout=30", f"--stack-timeout={stack}", "--log-dir", d,
                   worker, "hang", "20", "1", "1000", os.path.join(d, "out")]
            p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=300,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
            if p.returncode != 124:
                sys.exit(f"ctrun exited {p.returncode}, expected 124:\n{p.stderr[-3000:]}")
            files = read_rank_files(d, n)
            terms = [int(l.split()[1]) for f in files for l in f.splitlines() if l.startswith("term")]
            last = [int(l.split()[1]) for l in files[1].splitlines() if l.startswith("last")][0]
            vals.append((max(terms) - (last + int(timeout * 1e9))) / 1e6)
    return vals


def cost(build, n, beats, pace_us, python):
    with tempfile.TemporaryDirectory() as d:
        if python:
            entry = [os.path.join(HERE, "py_beat.py")]
        else:
            entry = [os.path.join(build, "bench", "health", "ctrun_health_bench_worker"), "cost"]
        cmd = [os.path.join(build, "ctrun"), f"--nproc_per_node={n}", "--heartbeat-timeout=60", "--log-dir", d,
               *entry, str(beats), str(pace_us), os.path.join(d, "out")]
        p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=900,
                           env=dict(os.environ, OMP_NUM_THREADS="1", PYTHON_EXEC="/usr/bin/python3"))
        if p.returncode != 0:
            sys.exit(f"ctrun exited {p.returncode}:\n{p.stderr[-3000:]}")
        rows = [list(map(int, f.split())) for f in read_rank_files(d, n)]
    col = lambda i: statistics.median(r[i] for r in rows)
    return col(0), col(1), col(2), col(3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--beats", type=int, default=20000)
    ap.add_argument("--pace-us", type=int, default=100)
    ap.add_argument("--timeout", type=float, default=1.0)
    a = ap.parse_args()
    print(f"== hang detection latency: deadline -> every worker signalled (heartbeat timeout {a.timeout} s, "
          f"{a.reps} runs; target <= 50 ms) ==")
    for n in (8, 64):
        for stack in (0, 10):
            v = latency(a.build, n, a.timeout, stack, a.reps)
            label = "no stack capture" if stack == 0 else "with eu-stack capture"
            print(f"{n:3d} workers, {label:22s} median {statistics.median(v):8.1f} ms  "
                  f"min {min(v):8.1f}  max {max(v):8.1f}")
    print(f"\n== heartbeat cost per beat ({a.beats} beats per worker, {a.pace_us} us apart, all workers at once; "
          f"median over workers; target < 2 us) ==")
    for python in (False, True):
        for n in (8, 64):
            beats = a.beats if not python else a.beats // 4
            mean, p50, p99, cpu = cost(a.build, n, beats, a.pace_us, python)
            who = "Python os.write" if python else "worker library"
            print(f"{who:16s} {n:3d} workers: mean {mean / 1000:6.2f} us  p50 {p50 / 1000:6.2f} us  "
                  f"p99 {p99 / 1000:6.2f} us  CPU/beat {cpu / 1000:6.2f} us")


if __name__ == "__main__":
    main()
