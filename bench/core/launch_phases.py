#!/usr/bin/env python3
"""Where a cold launch's time goes, step by step, by ctrun's own clock; not a test.

Needs a ctrun built with bench/core/launch_phases.patch applied (throwaway stamps at named steps:
`git apply bench/core/launch_phases.patch`, build, measure, `git checkout -- src` and remove
src/base/phase_clock.h). Each launch of N x /bin/true appends its CLOCK_MONOTONIC stamps to a
file; this prints, per step, the median time since the Popen that started ctrun (the same clock
as time.monotonic_ns), and the medians of the whole launch and of the bare limit, interleaved.

  python3 bench/core/launch_phases.py BUILD_DIR [--reps N] [--nproc N] [-- CTRUN_FLAGS...]

A step seen k times in one launch (childexit) is reported as name, name#2, ... name#k.
"""
import argparse
import collections
import os
import statistics
import subprocess
import sys
import tempfile
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--reps", type=int, default=31)
    ap.add_argument("--nproc", type=int, default=8)
    argv = sys.argv[1:]
    flags = argv[argv.index("--") + 1:] if "--" in argv else []
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    a.flags = flags  # extra ctrun flags, after --
    stamps = os.path.join(tempfile.mkdtemp(prefix="ctrun-phases-"), "stamps")
    env = dict(os.environ, OMP_NUM_THREADS="1", CTRUN_PHASES=stamps)
    ctrun = [os.path.join(a.build, "ctrun"), "--standalone", f"--nproc_per_node={a.nproc}", "--no_python"]
    bare = [os.path.join(a.build, "bench/core/ctrun_bare_limit"), "launch", str(a.nproc), "/bin/true"]
    rows, order, total, bare_total = collections.defaultdict(list), [], [], []
    for _ in range(a.reps):
        if os.path.exists(stamps):
            os.unlink(stamps)
        t0 = time.monotonic_ns()
        subprocess.run(ctrun + a.flags + ["/bin/true"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        total.append((time.monotonic_ns() - t0) / 1e6)
        seen = collections.Counter()
        if os.path.exists(stamps):
            for line in open(stamps):
                if line.startswith("--"):
                    continue
                name, ns = line.split()
                seen[name] += 1
                key = name if seen[name] == 1 else f"{name}#{seen[name]}"
                if key not in order:
                    order.append(key)
                rows[key].append((int(ns) - t0) / 1e6)
        t0 = time.monotonic_ns()
        subprocess.run(bare, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        bare_total.append((time.monotonic_ns() - t0) / 1e6)
    if not rows:
        raise SystemExit("no stamps: is the patch applied to this build?")
    print(f"launch {a.nproc} x /bin/true, {a.reps} runs, load {os.getloadavg()[0]:.2f}; ms since Popen (medians)")
    for k in order:
        print(f"{k:16s} {statistics.median(rows[k]):8.2f}  ({len(rows[k])} runs)")
    print(f"{'exited':16s} {statistics.median(total):8.2f}   bare limit {statistics.median(bare_total):.2f}")


if __name__ == "__main__":
    main()
