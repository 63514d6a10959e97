#!/usr/bin/python3
"""ctrun vs torchrun, side by side in one run (issue 2 benchmark; not a test).

  1. launch: 8 workers of /bin/true -- wall time and the launcher's peak RSS. The RSS comes from
     GNU time (%M: ru_maxrss of the launcher and the largest of its reaped children, /bin/true and
     ctrun's watchdog being smaller than the agent). It is not taken from Python's own wait4: a
     child forked from this Python script carries the interpreter's RSS until it execs, and
     ru_maxrss is not reset by exec.
  2. failure -> all-restarted latency with 4 and 64 workers: rank 0 exits 1 once all ranks are up;
     latency = last restarted worker's first instruction - the failing worker's exit (CLOCK_MONOTONIC).

Usage: bench/core/launch_restart.py BUILD_DIR [--reps N] [--skip-torchrun-64]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = os.path.join(HERE, "..", "..", "..", "shared", "bench", "torchrun-baseline")


def run(argv, env=None, timeout=600):
    """Runs argv under GNU time; returns (wall seconds, peak RSS KiB, exit code)."""
    with tempfile.NamedTemporaryFile(mode="r", suffix=".rss") as rss:
        t0 = time.monotonic()
        p = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss.name] + argv, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout)
        wall = time.monotonic() - t0
        lines = [l for l in rss.read().splitlines() if l.strip().isdigit()]
    return wall, int(lines[-1]) if lines else 0, p.returncode


def launchers(build, torchrun):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = [("ctrun", [os.path.join(build, "ctrun"), "--standalone"], env)]
    if torchrun:
        out.append(("torchrun", [torchrun, "--standalone"], env))
    return out


def bench_launch(build, torchrun, reps):
    print("\n== launch: 8 workers of /bin/true ==")
    rows = {}
    for name, cmd, env in launchers(build, torchrun):
        walls, rss = [], []
        for _ in range(reps):
            w, r, code = run(cmd + ["--nproc_per_node=8", "--no_python", "/bin/true"], env)
            if code != 0:
                sys.exit(f"{name} failed with {code}")
            walls.append(w)
            rss.append(r)
        rows[name] = (statistics.median(walls), max(rss))
        print(f"{name:9s} wall median {rows[name][0] * 1000:9.1f} ms   peak RSS {rows[name][1] / 1024:8.1f} MiB  ({reps} runs)")
    if "torchrun" in rows:
        print(f"ratio     torchrun/ctrun wall {rows['torchrun'][0] / rows['ctrun'][0]:.0f}x, "
              f"RSS {rows['torchrun'][1] / rows['ctrun'][1]:.0f}x")
    return rows


def restart_latency(cmd, env, worker, nprocs, reps, extra_flags=()):
    """Median/min/max ms from a worker's failure to the last restarted worker's first instruction."""
    lat = []
    for _ in range(reps):
        d = tempfile.mkdtemp(prefix="ctrun_bench_")
        flags = ["--max_restarts=1", f"--nproc_per_node={nprocs}", "--no_python", *extra_flags]
        _, _, code = run(cmd + flags + [worker, d], env)
        if code != 0:
            sys.exit(f"{cmd[0]} restart run failed with {code}")
        fail = int(open(os.path.join(d, "fail_ns")).read())
        starts = [int(open(os.path.join(d, f"start.{i}")).read()) for i in range(nprocs)]
        lat.append((max(starts) - fail) / 1e6)
        shutil.rmtree(d)
    return statistics.median(lat), min(lat), max(lat)


def bench_restart(build, torchrun, nprocs, reps):
    """ctrun, torchrun with its default monitor interval (5 s in 1.13), and torchrun with 0.1 s."""
    worker = os.path.join(build, "bench", "core", "ctrun_restart_worker")
    variants = []
    for name, cmd, env in launchers(build, torchrun):
        if name == "ctrun":
            variants.append(("ctrun", cmd, env, ()))
        else:
            variants.append(("torchrun (monitor_interval 5 s, 1.13 default)", cmd, env, ()))
            variants.append(("torchrun (monitor_interval 0.1 s)", cmd, env, ("--monitor_interval=0.1",)))
    results = {}
    for label, cmd, env, extra in variants:
        med, lo, hi = restart_latency(cmd, env, worker, nprocs, reps, extra)
        results[label] = med
        print(f"{label:48s} {nprocs:3d} workers: median {med:9.2f} ms (min {lo:.2f}, max {hi:.2f}, {reps} runs)")
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-torchrun", action="store_true")
    args = ap.parse_args()
    torchrun = None if args.no_torchrun else os.path.abspath(TORCHRUN)
    if torchrun and not os.path.exists(torchrun):
        print(f"note: {torchrun} not found; ctrun only")
        torchrun = None
    print(f"machine: {os.cpu_count()} CPUs; launcher under test: {args.build}/ctrun")
    launch = bench_launch(args.build, torchrun, args.reps)
    print("\n== failure -> all workers restarted ==")
    table = [(n, bench_restart(args.build, torchrun, n, args.reps if n == 4 else max(3, args.reps // 2)))
             for n in (4, 64)]
    print("\n== summary ==")
    print("| metric | ctrun | torchrun | torchrun / ctrun |")
    print("|---|---|---|---|")
    if "torchrun" in launch:
        c, t = launch["ctrun"], launch["torchrun"]
        print(f"| launch 8 x /bin/true, wall | {c[0]*1000:.1f} ms | {t[0]*1000:.0f} ms | {t[0]/c[0]:.0f}x |")
        print(f"| launch 8 x /bin/true, launcher peak RSS | {c[1]/1024:.1f} MiB | {t[1]/1024:.1f} MiB | {t[1]/c[1]:.0f}x |")
    else:
        c = launch["ctrun"]
        print(f"| launch 8 x /bin/true, wall | {c[0]*1000:.1f} ms | - | - |")
        print(f"| launch 8 x /bin/true, launcher peak RSS | {c[1]/1024:.1f} MiB | - | - |")
    for n, r in table:
        others = [(k, v) for k, v in r.items() if k != "ctrun"]
        if not others:
            print(f"| failure -> all restarted, {n} workers | {r['ctrun']:.2f} ms | - | - |")
        for k, v in others:
            print(f"| failure -> all restarted, {n} workers, vs {k} | {r['ctrun']:.2f} ms | {v:.0f} ms | {v/r['ctrun']:.0f}x |")


if __name__ == "__main__":
    main()
