#!/usr/bin/python3
"""Store benchmark: ctrun's StoreServer vs torch 1.13's own TCPStore server, side by side.

Usage: /usr/bin/python3 bench/store/bench_store.py [BUILD_DIR] [--seconds S] [--repeat N]
BUILD_DIR (default build-store) must hold tests/store/ctrun_store_server and
bench/store/ctrun_store_bench:
    cmake --build BUILD_DIR --target ctrun_store_server ctrun_store_bench

Both servers get the same load from ctrun_store_bench (64 client threads, one connection each,
torch <= 2.0 dialect, which is the only one torch 1.13's server speaks): set/get/add ops/s, and the
time for 256 fresh clients to connect and pass an ADD+WAIT barrier. The servers run one at a time,
alternating, and the best of --repeat runs is reported for each metric (the machine is shared).
"""
import argparse
import os
import subprocess
import sys

TORCH_SERVER = r"""
import datetime, sys
import torch.distributed as dist
s = dist.TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=600))
print("PORT", s.port, flush=True)
sys.stdin.read()  # serve until our stdin closes
"""


def start(argv):
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    line = p.stdout.readline().decode()
    if not line.startswith("PORT "):
        p.kill()
        raise SystemExit(f"server {argv[0]} did not start: {line!r}")
    return p, int(line.split()[1])


def stop(p):
    p.stdin.close()
    try:
        p.wait(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def run_bench(bench, port, seconds, tag):
    out = subprocess.run([bench, "--port", str(port), "--seconds", str(seconds), "--clients", "64",
                          "--barrier", "256", "--tag", tag],
                         check=True, capture_output=True, text=True, timeout=600).stdout
    return {k: float(v) for k, v in (line.split() for line in out.splitlines() if line.strip())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir", nargs="?", default="build-store")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    server_bin = os.path.join(args.build_dir, "tests/store/ctrun_store_server")
    bench = os.path.join(args.build_dir, "bench/store/ctrun_store_bench")
    for f in (server_bin, bench):
        if not os.path.exists(f):
            raise SystemExit(f"missing {f}: cmake --build {args.build_dir} --target "
                             "ctrun_store_server ctrun_store_bench")

    best = {"ctrun": {}, "torch": {}}
    for r in range(args.repeat):
        for name, argv in (("ctrun", [server_bin]), ("torch", ["/usr/bin/python3", "-c", TORCH_SERVER])):
            p, port = start(argv)
            try:
                res = run_bench(bench, port, args.seconds, f"{name}{r}")
            finally:
                stop(p)
            for k, v in res.items():
                lower_is_better = k.endswith("_s") and not k.endswith("ops_s")
                old = best[name].get(k)
                if old is None or (v < old if lower_is_better else v > old):
                    best[name][k] = v
            print(f"run {r + 1}/{args.repeat} {name}: " +
                  " ".join(f"{k}={v:g}" for k, v in res.items()), file=sys.stderr)

    rows = [("set ops/s (64 clients)", "set_ops_s", True),
            ("get ops/s (64 clients, wait+get)", "get_ops_s", True),
            ("add ops/s (64 clients, one counter)", "add_ops_s", True),
            ("256-client connect+barrier (s)", "barrier_s", False)]
    print(f"{'metric':38} {'ctrun':>12} {'torch 1.13':>12} {'ctrun/torch':>12}")
    for label, key, higher_better in rows:
        c, t = best["ctrun"][key], best["torch"][key]
        ratio = c / t if t else float("inf")
        fmt = "{:12.0f}" if higher_better else "{:12.4f}"
        note = "" if higher_better else "  (lower is better)"
        print(f"{label:38} {fmt.format(c)} {fmt.format(t)} {ratio:12.2f}{note}")


if __name__ == "__main__":
    main()
