#!/usr/bin/env python3
"""Where a cold launch's time goes: launch 8 x /bin/true with pieces of ctrun's work switched off,
interleaved run by run with the bare limit, and print the medians.

  python3 bench/core/launch_parts.py BUILD_DIR [--reps N] [--nproc N] [--floor]

Rows: default (fresh $TMPDIR/torchelastic_* base, removed after the successful run); --log_dir of
an existing directory (no base made, nothing removed); --log_dir /dev/null (no directory at all);
CTRUN_NO_CGROUP=1 (no job cgroup); all three off (--log_dir /dev/null, --no-agent-store, no
cgroup: what is left is ctrun's start, the watchdog, the pipes and the loop); the bare limit (bench/core/bare_limit.c). Wall time of each
launch from Popen to wait, as launch_restart.py measures it.

--floor adds the rows below "all three off", towards the least a launch by ctrun can cost: also
--log-prefix inherit (no output pipes); also no watchdog, which only a build with the throwaway
bench/core/launch_floor.patch applied can skip (CTRUN_BENCH_NO_WATCHDOG=1; `git apply` it, build
ctrun, measure, `git checkout -- src`); also both; and `/bin/true` and `ctrun --version` alone
(one process's start and exit). Without the patch the no-watchdog rows measure the watchdog.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time


def run(argv, env):
    t = time.monotonic()
    p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    p.wait()
    return (time.monotonic() - t) * 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--reps", type=int, default=41)
    ap.add_argument("--nproc", type=int, default=8)
    ap.add_argument("--floor", action="store_true")
    a = ap.parse_args()
    ctrun = os.path.join(a.build, "ctrun")
    bare = os.path.join(a.build, "bench/core/ctrun_bare_limit")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    logdir = tempfile.mkdtemp(prefix="ctrun-bench-")
    base = [ctrun, "--standalone", f"--nproc_per_node={a.nproc}", "--no_python"]
    rows = {
        "default": (base + ["/bin/true"], env),
        "--log_dir DIR": (base + ["--log_dir", logdir, "/bin/true"], env),
        "--log_dir /dev/null": (base + ["--log_dir", "/dev/null", "/bin/true"], env),
        "CTRUN_NO_CGROUP=1": (base + ["/bin/true"], dict(env, CTRUN_NO_CGROUP="1")),
        "all three off": (base + ["--log_dir", "/dev/null", "--no-agent-store", "/bin/true"],
                          dict(env, CTRUN_NO_CGROUP="1")),
    }
    if a.floor:
        off = base + ["--log_dir", "/dev/null", "--no-agent-store"]
        no_cg = dict(env, CTRUN_NO_CGROUP="1")
        no_wd = dict(no_cg, CTRUN_BENCH_NO_WATCHDOG="1")
        rows.update({
            "+ inherit": (off + ["--log-prefix", "inherit", "/bin/true"], no_cg),
            "+ no watchdog": (off + ["/bin/true"], no_wd),
            "+ both": (off + ["--log-prefix", "inherit", "/bin/true"], no_wd),
            "/bin/true": (["/bin/true"], env),
            "ctrun --version": ([ctrun, "--version"], env),
        })
    rows["bare limit"] = ([bare, "launch", str(a.nproc), "/bin/true"], env)
    res = {k: [] for k in rows}
    try:
        for _ in range(a.reps):
            for k, (argv, e) in rows.items():
                res[k].append(run(argv, e))
            shutil.rmtree(logdir, ignore_errors=True)
            os.mkdir(logdir)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    bare_median = statistics.median(res["bare limit"])
    print(f"launch {a.nproc} x /bin/true, {a.reps} interleaved runs each, load {os.getloadavg()[0]:.2f}")
    for k, v in res.items():
        m = statistics.median(v)
        print(f"{k:22s} {m:7.2f} ms [{min(v):.2f}-{max(v):.2f}]  / bare {m / bare_median:.2f}")


if __name__ == "__main__":
    main()
