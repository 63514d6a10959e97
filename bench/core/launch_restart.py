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


def bench_restart(build, torchrun, nprocs, reps, monitor=None):
    worker = os.path.join(build, "bench", "core", "ctrun_restart_worker")
    results = {}
    for name, cmd, env in launchers(build, torchrun):
        lat = []
        for _ in range(reps):
            d = tempfile.mkdtemp(prefix="ctrun_bench_")
            extra = ["--max_restarts=1", f"--nproc_per_node={nprocs}", "--no_python"]
            if name == "torchrun" and monitor is not None:
                extra.append(f"--monitor_interval={monitor}")
            _, _, code = run(cmd + extra + [worker, d], env)
            if code != 0:
                sys.exit(f"{name} restart run failed with {code}")
            fail = int(open(os.path.join(d, "fail_ns")).read())
            starts = [int(open(os.path.join(d, f"start.{i}")).read()) for i in range(nprocs)]
            lat.append((max(starts) - fail) / 1e6)
            shutil.rmtree(d)
        label = name if name == "ctrun" or monitor is None else f"torchrun (monitor_interval={monitor})"
        results[label] = statistics.median(lat)
        print(f"{label:38s} {nprocs:3d} workers: failure->all restarted median {results[label]:9.2f} ms "
              f"(min {min(lat):.2f}, max {max(lat):.2f}, {reps} runs)")
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
    table = []
    for n in (4, 64):
        r = bench_restart(args.build, torchrun, n, args.reps if n == 4 else max(2, args.reps // 2))
        if torchrun:
            r.update(bench_restart(args.build, torchrun, n, max(2, args.reps // 2), monitor=0.1))
        table.append((n, r))
    print("\n== summary ==")
    print("| metric | ctrun | torchrun | ratio |")
    print("|---|---|---|---|")
    if "torchrun" in launch:
        c, t = launch["ctrun"], launch["torchrun"]
        print(f"| launch 8x /bin/true, wall | {c[0]*1000:.1f} ms | {t[0]*1000:.0f} ms | {t[0]/c[0]:.0f}x |")
        print(f"| launch 8x /bin/true, peak RSS | {c[1]/1024:.1f} MiB | {t[1]/1024:.1f} MiB | {t[1]/c[1]:.0f}x |")
    for n, r in table:
        for k, v in r.items():
            if k == "ctrun":
                continue
            print(f"| failure->restarted, {n} workers ({k}) | {r['ctrun']:.2f} ms | {v:.0f} ms | {v/r['ctrun']:.0f}x |")
        if len(r) == 1:
            print(f"| failure->restarted, {n} workers | {r['ctrun']:.2f} ms | - | - |")


if __name__ == "__main__":
    main()
