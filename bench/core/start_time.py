#!/usr/bin/python3
"""Start-up cost of ctrun binaries side by side (`ctrun --version` by default); not a test.

Each binary runs ARGS --reps times, the binaries alternating run by run so that a change of load on
a shared machine hits them alike. Per run: wall time from posix_spawn to the reaping (os.wait4
blocks, no polling) and the child's CPU time (user + system) from wait4's rusage. Peak RSS comes
from GNU time (%M) in 5 more runs each: a child of posix_spawn shares this Python's memory until
its exec, and Linux keeps that high-water mark across the exec. /bin/true is measured the same way
as the floor of what a process start costs here. Medians with [min-max].

Usage: bench/core/start_time.py CTRUN [CTRUN ...] [--reps N] [-- ARGS...]   (ARGS: --version)
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


def run_once(argv):
    t0 = time.monotonic()
    pid = os.posix_spawn(argv[0], argv, os.environ,
                         file_actions=[(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_WRONLY, 0) for fd in (1, 2)])
    _, status, ru = os.wait4(pid, 0)
    wall = (time.monotonic() - t0) * 1000
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed: status {status}")
    return wall, (ru.ru_utime + ru.ru_stime) * 1000


def peak_rss_mib(argv):
    with tempfile.NamedTemporaryFile(mode="r", suffix=".rss") as rss:
        subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss.name] + argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       check=True)
        return int(rss.read().split()[-1]) / 1024


def fmt(values, unit):
    return f"{statistics.median(values):7.3f} {unit} [{min(values):.3f}-{max(values):.3f}]"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binaries", nargs="+")
    ap.add_argument("--reps", type=int, default=200)
    own, args = sys.argv[1:], ["--version"]
    if "--" in own:
        own, args = own[:own.index("--")], own[own.index("--") + 1:]
    a = ap.parse_args(own)
    variants = [(b, [os.path.abspath(b)] + args) for b in a.binaries] + [("/bin/true", ["/bin/true"])]
    results = {label: [] for label, _ in variants}
    for _ in range(a.reps):
        for label, argv in variants:
            results[label].append(run_once(argv))
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"{' '.join(args)}: {a.reps} runs each, alternating; load average {load} at the end")
    for (label, runs), (_, argv) in zip(results.items(), variants):
        wall, cpu = zip(*runs)
        rss = statistics.median(peak_rss_mib(argv) for _ in range(5))
        print(f"{label}\n  wall {fmt(wall, 'ms')}   cpu {fmt(cpu, 'ms')}   peak RSS {rss:.2f} MiB")


if __name__ == "__main__":
    main()
