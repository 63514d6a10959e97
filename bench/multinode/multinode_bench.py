#!/usr/bin/python3
"""Multi-node ctrun vs torchrun's c10d rendezvous, side by side in one run (a benchmark, not a test).

Every agent runs on this machine on loopback (127.0.0.1); ctrun and Debian's torchrun 1.13
(../shared/bench/torchrun-baseline, run with /usr/bin/python3) get the same flags and the same
--rdzv_conf: join_timeout=300, last_call_timeout=3, keep_alive_interval=1, keep_alive_max_attempt=3,
and is_host=1 for agent 0, is_host=0 for the others (so the agent that hosts the rendezvous store
is known). torch 1.13's c10d handler reads join_timeout, last_call_timeout, close_timeout (dynamic
rendezvous), is_host, read_timeout, store_type (c10d backend); it ignores the keep_alive_* keys and
hard-codes a 5 s interval x 3 attempts (DynamicRendezvousHandler.from_backend). The worker,
bench/multinode/mn_worker.c, is compiled with cc at run time and stamps CLOCK_MONOTONIC (one clock
for every process on the machine) into files.

  1. arrival: N agents x 1 worker, --nnodes=N:N. Agents 1..N-1 start one after the other, each once
     the previous one waits in the rendezvous: it listens on the rendezvous port (agent 0) or holds
     a connection to it, and used < 10% of a CPU over two 0.3 s windows. That pause is also what
     keeps 32 torchrun agents (~2 s of CPU and 130-230 MB each) feasible on 2 cores: about 70 s
     and 4.3 GB for 31 of them. After a 1 s settle, with no worker started yet, T0 = monotonic time
     just before the last agent is spawned; result = max(worker start stamps) - T0 (it includes
     the last agent's own start-up: Python and torch's import for torchrun).
  2. failure: N agents x 2 workers, --nnodes=N:N. The last global rank waits until every worker is
     up (+0.2 s), stamps the time and exits 1; every other worker has a SIGTERM handler that stamps
     the time; result = max(stop stamps of all other workers) - failure stamp.
     --max_restarts=1: torchrun 1.13 stops the other nodes only by restarting: the failed node's
     agent notices the exit at its next monitor tick and re-joins; the others see a waiting node
     at their next tick and restart too (monitor_interval: 5 s by default in 1.13, 0.1 s shown as
     well). --max_restarts=0 (2 agents): torchrun 1.13 stops the failed node's own workers and
     leaves the other nodes' running (a real job would wait for a collective's timeout).
  3. lost node: 3 agents x 1 worker, --nnodes=2:3. Once the 3 workers run (+1.5 to 2.5 s, a random
     phase against the heartbeats), T0, and one agent that does not host the store is SIGKILLed
     with its whole node: its process group first, then every descendant's group (ctrun's
     watchdog and workers have their own); result = first start stamp of a new worker - T0.

Reference ("bare processes"): bench/multinode/mn_ref.c does the same process work with
posix_spawn and kill and no launcher: 1. start N workers; 2. notice a worker's exit and SIGTERM the
W-1 others; 3. start one worker, after the heartbeat deadline, which runs from the dead node's last
heartbeat (0 to 1 interval before T0), hence a window.

Reps are interleaved (rep 1 of bare, ctrun, torchrun, then rep 2, ...) so that other load on the
machine hits every side alike. A torchrun measurement is bounded by --bound seconds (default 60);
one that hits the bound is reported as "> bound" and, unless --repeat-timeouts, not repeated. Every
process started here is SIGKILLed by process group at the end of each run, also on Ctrl-C, SIGTERM
or an exception (the script is a child subreaper, so orphans come back to it to be killed and
reaped); ports are free ones; the agents' logs (--log_dir) and TMPDIR are inside one temp directory
that is removed at the end.

Usage: /usr/bin/python3 bench/multinode/multinode_bench.py BUILD_DIR [--reps 3] [--agents 2,8,32]
         [--fail-agents 2,8] [--scenarios 1,2,3] [--bound 60] [--no-torchrun] [--out FILE]
         [--keep-logs DIR]
"""
import argparse
import ctypes
import math
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = os.path.normpath(os.path.join(HERE, "..", "..", "..", "shared", "bench", "torchrun-baseline"))
PYTHON = "/usr/bin/python3"
CLK_TCK = os.sysconf("SC_CLK_TCK")
HEARTBEAT = (1, 3)  # keep_alive_interval, keep_alive_max_attempt
CONF = f"join_timeout=300,last_call_timeout=3,keep_alive_interval={HEARTBEAT[0]},keep_alive_max_attempt={HEARTBEAT[1]}"
TORCH_HEARTBEAT_S = 15  # torch 1.13 DynamicRendezvousHandler.from_backend: keep_alive 5 s x 3 attempts


class RunError(Exception):
    pass


class Interrupted(BaseException):
    pass


def now_ns():
    return time.monotonic_ns()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- processes

def proc_table():
    """pid -> (state, ppid, pgid, utime + stime ticks)."""
    out = {}
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat") as f:
                s = f.read()
        except OSError:
            continue
        r = s[s.rindex(")") + 2:].split()
        out[int(e)] = (r[0], int(r[1]), int(r[2]), int(r[11]) + int(r[12]))
    return out


def descendants(root, table):
    kids = {}
    for pid, (_, ppid, _, _) in table.items():
        kids.setdefault(ppid, []).append(pid)
    out, stack = [], [root]
    while stack:
        for c in kids.get(stack.pop(), []):
            out.append(c)
            stack.append(c)
    return out


def cpu_ticks(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            r = f.read()
        r = r[r.rindex(")") + 2:].split()
        return int(r[11]) + int(r[12])
    except OSError:
        return None


class Procs:
    """Every process this script starts, each in its own session (process group)."""

    def __init__(self):
        self.popens = []
        self.me = os.getpid()
        self.my_pgrp = os.getpgrp()

    def start(self, argv, log_path, env):
        log = open(log_path, "wb")
        try:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 env=env, start_new_session=True)
        finally:
            log.close()
        self.popens.append(p)
        return p

    def _kill(self, pids, table):
        pgids = {table[p][2] for p in pids if p in table}
        for pg in pgids:
            if pg != self.my_pgrp and pg > 1:
                try:
                    os.killpg(pg, signal.SIGKILL)
                except OSError:
                    pass
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass

    def kill_node(self, p):
        """SIGKILLs an agent with its whole tree: its process group and every descendant's group.
        The agent's group goes first: an agent that outlived its workers by a moment would see them
        killed and report that as a worker failure, which a dead machine never does."""
        table = proc_table()
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            pass
        self._kill([p.pid] + descendants(p.pid, table), table)

    def reap_orphans(self, table=None):
        table = table or proc_table()
        mine = {p.pid for p in self.popens}
        for pid, (st, ppid, _, _) in table.items():
            if ppid == self.me and pid not in mine and st == "Z":
                try:
                    os.waitpid(pid, os.WNOHANG)
                except OSError:
                    pass
        for p in self.popens:
            p.poll()

    def kill_all(self, timeout=20):
        """SIGKILLs every descendant of this script (by process group) and reaps them all."""
        deadline = time.monotonic() + timeout
        while True:
            table = proc_table()
            desc = descendants(self.me, table)
            live = [p for p in desc if table.get(p, ("Z",))[0] != "Z"]
            if live:
                self._kill(live, table)
            self.reap_orphans(table)
            if not desc:
                break
            if time.monotonic() > deadline:
                print(f"warning: could not reap processes {desc}", file=sys.stderr)
                break
            time.sleep(0.02)
        self.popens = [p for p in self.popens if p.returncode is None]


# ---------------------------------------------------------------- rendezvous state of an agent

def port_sockets(port):
    """socket inode -> 'L' (listening on port) or 'E' (established connection to port)."""
    res = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            parts = ln.split()
            lport = int(parts[1].rsplit(":", 1)[1], 16)
            rport = int(parts[2].rsplit(":", 1)[1], 16)
            if parts[3] == "0A" and lport == port:
                res[int(parts[9])] = "L"
            elif parts[3] == "01" and rport == port:
                res[int(parts[9])] = "E"
    return res


def holds(pid, port, kind):
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    socks = port_sockets(port)
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and socks.get(int(link[8:-1])) == kind:
            return True
    return False


def wait_joined(run, p, host, timeout):
    """Until agent p listens on (host) or is connected to the rendezvous port and is idle."""
    deadline = time.monotonic() + timeout
    kind = "L" if host else "E"
    idle = 0
    while idle < 2:
        if time.monotonic() > deadline:
            raise RunError(f"agent pid {p.pid} did not settle in the rendezvous within {timeout} s")
        if p.poll() is not None:
            raise RunError(f"agent pid {p.pid} exited with {p.returncode} while joining")
        if not holds(p.pid, run.port, kind):
            idle = 0
            time.sleep(0.1)
            continue
        c0 = cpu_ticks(p.pid)
        time.sleep(0.3)
        c1 = cpu_ticks(p.pid)
        idle = idle + 1 if c0 is not None and c1 is not None and (c1 - c0) <= 0.03 * CLK_TCK else 0


# ---------------------------------------------------------------- launchers and runs

class Launcher:
    def __init__(self, name, prefix, extra=()):
        self.name, self.prefix, self.extra = name, prefix, list(extra)

    def argv(self, run, agent, nnodes, nproc, max_restarts, worker_args):
        conf = CONF + (",is_host=1" if agent == 0 else ",is_host=0")
        return self.prefix + [
            f"--nnodes={nnodes}", f"--nproc_per_node={nproc}", "--rdzv_backend=c10d",
            f"--rdzv_endpoint=127.0.0.1:{run.port}", f"--rdzv_id={run.rdzv_id}", f"--rdzv_conf={conf}",
            f"--max_restarts={max_restarts}", f"--log_dir={run.path('logs', f'a{agent}')}", *self.extra,
            "--no_python", run.bench.worker, run.data, *worker_args]


class Run:
    """One multi-agent run: its own port, rendezvous id, stamp directory and logs."""
    counter = 0

    def __init__(self, bench, launcher):
        Run.counter += 1
        self.bench, self.launcher = bench, launcher
        self.dir = os.path.join(bench.tmp, f"run{Run.counter}")
        self.data = self.path("stamps")
        os.makedirs(self.path("logs"))
        os.makedirs(self.data)
        self.port = free_port()
        self.rdzv_id = f"mnbench{os.getpid()}x{Run.counter}"
        self.agents = []

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    def start(self, nnodes, nproc, max_restarts, worker_args):
        i = len(self.agents)
        argv = self.launcher.argv(self, i, nnodes, nproc, max_restarts, worker_args)
        p = self.bench.procs.start(argv, self.path(f"agent{i}.out"), self.bench.env)
        self.agents.append(p)
        return p

    def stamps(self, prefix):
        """name -> (ns, world) of the stamp files starting with prefix."""
        out = {}
        for n in os.listdir(self.data):
            if n.startswith(prefix):
                try:
                    with open(os.path.join(self.data, n)) as f:
                        parts = f.read().split()
                except OSError:
                    continue
                if parts:
                    out[n] = (int(parts[0]), int(parts[1]) if len(parts) > 1 else None)
        return out

    def check_alive(self):
        for i, p in enumerate(self.agents):
            if p.poll() is not None:
                raise RunError(f"agent {i} exited early with {p.returncode}")

    def wait_for(self, cond, timeout, what, check_alive=True, interval=0.01):
        deadline = time.monotonic() + timeout
        while True:
            v = cond()
            if v:
                return v
            if check_alive:
                self.check_alive()
            if time.monotonic() > deadline:
                if what is None:
                    return None
                raise RunError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(interval)

    def wait_exit(self, timeout):
        """Exit codes of the agents still tracked after waiting up to timeout (None: still running)."""
        deadline = time.monotonic() + timeout
        codes = []
        for p in self.agents:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            codes.append(p.returncode)
        return codes

    def tail(self, lines=6):
        out = []
        for i in range(len(self.agents)):
            try:
                with open(self.path(f"agent{i}.out"), errors="replace") as f:
                    t = f.read().splitlines()[-lines:]
            except OSError:
                t = []
            out.append(f"  --- agent {i} ---\n" + "\n".join("  " + ln for ln in t))
        return "\n".join(out)

    def finish(self, keep_log=False):
        self.bench.procs.kill_all()
        if keep_log:
            print(self.tail(), file=sys.stderr)
        if self.bench.args.keep_logs:  # for investigations only: the agents' output and the stamps
            shutil.copytree(self.dir, os.path.join(self.bench.args.keep_logs,
                                                   f"{os.path.basename(self.dir)}-{self.launcher.name.split()[0]}"))
        shutil.rmtree(self.dir, ignore_errors=True)


# ---------------------------------------------------------------- scenarios (one rep each)

def arrival(bench, launcher, n):
    """ms from just before spawning the last of n agents to the last worker's first instruction."""
    run = Run(bench, launcher)
    try:
        spec = f"{n}:{n}"
        for i in range(n - 1):
            p = run.start(spec, 1, 0, ["start"])
            wait_joined(run, p, host=(i == 0), timeout=120)
        time.sleep(1.0)
        run.check_alive()
        if run.stamps("start."):
            raise RunError("workers started before the last agent arrived")
        bench.procs.reap_orphans()
        t0 = now_ns()
        run.start(spec, 1, 0, ["start"])
        got = run.wait_for(lambda: len(s := run.stamps("start.")) >= n and s, 180, f"{n} workers to start",
                           check_alive=False)
        if any(w != n for _, w in got.values()):
            raise RunError(f"a worker saw a world size other than {n}: {got}")
        codes = run.wait_exit(120)
        if any(c != 0 for c in codes):
            raise RunError(f"agents exited with {codes}")
        run.finish()
        return (max(t for t, _ in got.values()) - t0) / 1e6
    except BaseException:
        run.finish(keep_log=True)
        raise


def failure(bench, launcher, n, nproc, max_restarts):
    """ms from the failing worker's exit to the last other worker's SIGTERM; math.inf if not all
    were stopped within the bound."""
    run = Run(bench, launcher)
    world = n * nproc
    try:
        spec = f"{n}:{n}"
        args = ["fail", str(world - 1)]
        run.start(spec, nproc, max_restarts, args)
        run.wait_for(lambda: holds(run.agents[0].pid, run.port, "L"), 120, "agent 0 to listen", interval=0.1)
        for _ in range(n - 1):
            run.start(spec, nproc, max_restarts, args)
        got = run.wait_for(lambda: run.stamps("fail"), 240, "the failing worker", interval=0.05)
        fail_ns = got["fail"][0]
        stopped = run.wait_for(lambda: len(s := run.stamps("stop.")) >= world - 1 and s, bench.bound, None,
                               check_alive=False, interval=0.02)
        if not stopped:
            got = run.stamps("stop.")
            print(f"    {launcher.name}: {len(got)} of {world - 1} other workers stopped within {bench.bound:.0f} s",
                  flush=True)
            run.finish()
            return math.inf
        if max_restarts > 0:
            run.wait_for(lambda: len(run.stamps("start.")) >= world, 120, "the restarted workers",
                         check_alive=False, interval=0.05)
        want = 0 if max_restarts > 0 else None
        codes = run.wait_exit(60)
        if want is not None and any(c != want for c in codes):
            raise RunError(f"agents exited with {codes}, expected {want}")
        if want is None and any(c is None or c == 0 for c in codes):
            raise RunError(f"agents exited with {codes}, expected a failure")
        run.finish()
        return (max(t for t, _ in stopped.values()) - fail_ns) / 1e6
    except BaseException:
        run.finish(keep_log=True)
        raise


def lost_node(bench, launcher):
    """ms from SIGKILLing one node of 3 to the first start of a new worker on a survivor; math.inf
    if none started within the bound."""
    run = Run(bench, launcher)
    try:
        args = ["hang", "3"]
        run.start("2:3", 1, 0, args)
        run.wait_for(lambda: holds(run.agents[0].pid, run.port, "L"), 120, "agent 0 to listen", interval=0.1)
        run.start("2:3", 1, 0, args)
        run.start("2:3", 1, 0, args)
        got = run.wait_for(lambda: len(s := run.stamps("start.")) >= 3 and s, 240, "3 workers", interval=0.05)
        if any(w != 3 for _, w in got.values()):
            raise RunError(f"the first round did not have all 3 nodes: {got}")
        # Steady state, and a random phase against the heartbeats (a node dies at any moment).
        time.sleep(1.5 + random.uniform(0, HEARTBEAT[0]))
        run.check_alive()
        bench.procs.reap_orphans()
        t0 = now_ns()
        bench.procs.kill_node(run.agents[2])
        new = run.wait_for(lambda: [t for t, _ in run.stamps("start.").values() if t > t0], bench.bound, None,
                           check_alive=False, interval=0.02)
        if not new:
            run.finish()
            return math.inf
        first = min(run.stamps("start.").items(), key=lambda kv: kv[1][0] if kv[1][0] > t0 else math.inf)
        if first[1][1] != 2:
            print(f"    note: {launcher.name}: the first new worker saw WORLD_SIZE={first[1][1]}, not 2", flush=True)
        codes = run.wait_exit(60)
        if codes[0] != 0 or codes[1] != 0:
            print(f"    note: {launcher.name} survivors exited with {codes[:2]} (expected 0)", flush=True)
        run.finish()
        return (min(new) - t0) / 1e6
    except BaseException:
        run.finish(keep_log=True)
        raise


def bare(bench, mode, n):
    """The bare process cost (ms) via mn_ref: 'spawn' -> max(start) - T0, 'first' -> min(start) - T0,
    'stop' -> max(stop) - fail."""
    d = tempfile.mkdtemp(dir=bench.tmp)
    try:
        out = subprocess.run([bench.ref, "stop" if mode == "stop" else "spawn", str(n), bench.worker, d],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=bench.env, timeout=60,
                             text=True, check=True).stdout
        names = os.listdir(d)

        def read(n):
            with open(os.path.join(d, n)) as f:
                return int(f.read().split()[0])
        if mode == "stop":
            return (max(read(x) for x in names if x.startswith("stop.")) - read("fail")) / 1e6
        starts = [read(x) for x in names if x.startswith("start.")]
        if len(starts) != n:
            raise RunError(f"mn_ref: {len(starts)} of {n} workers started")
        t0 = int(out.split()[0])
        return ((max(starts) if mode == "spawn" else min(starts)) - t0) / 1e6
    finally:
        shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------- driver

class Bench:
    def __init__(self, args):
        self.args = args
        self.bound = float(args.bound)
        self.procs = Procs()
        self.tmp = tempfile.mkdtemp(prefix="ctrun_mnbench_")
        os.makedirs(os.path.join(self.tmp, "tmp"))
        self.env = dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=os.path.join(self.tmp, "tmp"),
                        PYTHONDONTWRITEBYTECODE="1")
        self.worker = os.path.join(self.tmp, "mn_worker")
        self.ref = os.path.join(self.tmp, "mn_ref")
        try:
            for src, out in (("mn_worker.c", self.worker), ("mn_ref.c", self.ref)):
                subprocess.run([os.environ.get("CC", "cc"), "-O2", "-o", out, os.path.join(HERE, src)], check=True,
                               timeout=120, env=self.env)
        except BaseException:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise

    def close(self):
        self.procs.kill_all()
        shutil.rmtree(self.tmp, ignore_errors=True)


def measure(bench, cases, reps):
    """cases: [(key, label, fn)]; runs rep 1 of every case, then rep 2, ... (so load changes on the
    machine hit every case alike). key -> {median, min, max, n, timeouts} or None."""
    vals = {k: [] for k, _, _ in cases}
    done = set()
    for r in range(reps):
        for key, label, fn in cases:
            if key in done:
                continue
            try:
                v = fn()
            except RunError as e:
                print(f"    {label}: rep {r + 1} failed: {e}", flush=True)
                continue
            vals[key].append(v)
            print(f"    {label}: rep {r + 1}: " + (f"{v:.2f} ms" if math.isfinite(v) else f"> {bench.bound:.0f} s"),
                  flush=True)
            if math.isinf(v) and not bench.args.repeat_timeouts:
                done.add(key)
    out = {}
    for key, v in vals.items():
        out[key] = None if not v else {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v),
                                       "timeouts": sum(1 for x in v if math.isinf(x))}
    return out


def num(v):
    return f"{v:.1f}" if v < 100 else f"{v:.0f}"


def fmt_ms(r, bound, what="not stopped"):
    """median ms (min–max), or '> bound' when the median run hit the bound."""
    if r is None:
        return "error"
    if "text" in r:
        return r["text"]
    if math.isinf(r["median"]):
        runs = f"{r['n']} run" + ("s" if r["n"] != 1 else "")
        return f"> {bound:.0f} s ({what}; {runs})"
    s = f"{num(r['median'])} ms"
    if r["n"] > 1:
        hi = num(r["max"]) if math.isfinite(r["max"]) else f"> {bound:.0f} s"
        s += f" ({num(r['min'])}–{hi})"
    return s


def ratio(a, b):
    if a is None or b is None or "text" in a or "text" in b:
        return "-"
    if math.isinf(a["median"]) or math.isinf(b["median"]):
        return "-"
    r = a["median"] / b["median"]
    return f"{r:.0f}×" if r >= 10 else f"{r:.1f}×"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("build", help="build directory with ctrun")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--agents", default="2,8,32", help="agent counts of scenario 1 (arrival)")
    ap.add_argument("--fail-agents", default="2,8", help="agent counts of scenario 2 (failure)")
    ap.add_argument("--scenarios", default="1,2,3")
    ap.add_argument("--bound", type=float, default=60, help="seconds a torchrun measurement may take")
    ap.add_argument("--repeat-timeouts", action="store_true", help="repeat a case that hit the bound")
    ap.add_argument("--no-torchrun", action="store_true")
    ap.add_argument("--out", help="write the Markdown table here too")
    ap.add_argument("--keep-logs", metavar="DIR", help="copy every run's agent output and stamps into DIR "
                    "(for investigations; off by default, so nothing is left behind)")
    args = ap.parse_args()
    agents = [int(x) for x in args.agents.split(",") if x]
    fail_agents = [int(x) for x in args.fail_agents.split(",") if x]
    scenarios = {int(x) for x in args.scenarios.split(",") if x}
    ctrun = os.path.join(os.path.abspath(args.build), "ctrun")
    if not os.access(ctrun, os.X_OK):
        sys.exit(f"{ctrun} not found; build it first")
    torchrun = None if args.no_torchrun else TORCHRUN
    if torchrun and not os.path.exists(torchrun):
        print(f"note: {torchrun} not found; ctrun only")
        torchrun = None

    # The script reaps orphans (ctrun's watchdog and workers after their agent is killed).
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER

    def on_signal(sig, _frame):
        raise Interrupted(sig)
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGINT too: a background job inherits it ignored
        signal.signal(s, on_signal)

    bench = Bench(args)
    rows = []
    interrupted = 0
    try:
        ver = subprocess.run([ctrun, "--version"], stdout=subprocess.PIPE, text=True).stdout.strip()
        print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; {ver}; torchrun: {torchrun or '-'}")
        print(f"--rdzv_conf={CONF},is_host=1 (agent 0) / is_host=0 (the others), for both launchers", flush=True)
        C = Launcher("ctrun", [ctrun])
        T = Launcher("torchrun", [PYTHON, torchrun]) if torchrun else None
        T01 = Launcher("torchrun --monitor_interval=0.1", [PYTHON, torchrun], ["--monitor_interval=0.1"]) if torchrun else None
        reps = args.reps

        if 1 in scenarios:
            print("\n== 1. last agent's arrival -> all workers started (N agents x 1 worker, --nnodes=N:N) ==")
            for n in agents:
                print(f"  {n} agents", flush=True)
                cases = [("b", "bare", lambda: bare(bench, "spawn", n)), ("c", "ctrun", lambda: arrival(bench, C, n))]
                if T:
                    cases.append(("t", "torchrun", lambda: arrival(bench, T, n)))
                m = measure(bench, cases, reps)
                rows.append((f"last agent's arrival → all workers started, {n} agents × 1 worker", m["b"], m["c"],
                             m.get("t"), "≤ 50 ms" if n == 32 else "", 50 if n == 32 else None, "never started"))

        if 2 in scenarios:
            print("\n== 2. a worker's failure -> every other worker on every node stopped (N agents x 2 workers) ==")
            for n, mr in [(n, 1) for n in fail_agents] + [(min(fail_agents), 0)]:
                print(f"  {n} agents, --max_restarts={mr}", flush=True)
                cases = [("b", "bare", lambda: bare(bench, "stop", n * 2)),
                         ("c", "ctrun", lambda: failure(bench, C, n, 2, mr))]
                variants = [("t", "torchrun 1.13 (default --monitor_interval=5)", T),
                            ("t01", "torchrun --monitor_interval=0.1", T01)] if T else []
                if mr == 0:
                    variants = variants[1:]
                for key, vname, L in variants:
                    cases.append((key, vname, lambda L=L: failure(bench, L, n, 2, mr)))
                m = measure(bench, cases, reps)
                label = f"worker failure → all other workers stopped, {n} agents × 2 workers, --max_restarts={mr}"
                for key, vname, _ in variants or [(None, "", None)]:
                    rows.append((label + (f", vs {vname}" if key else ""), m["b"], m["c"], m.get(key),
                                 "≤ 100 ms", 100, "not stopped"))

        if 3 in scenarios:
            print("\n== 3. a node SIGKILLed -> survivors' workers restarted (3 agents, --nnodes=2:3, heartbeat 1 s x 3) ==")
            deadline_ms = HEARTBEAT[0] * HEARTBEAT[1] * 1000
            cases = [("b", "bare", lambda: bare(bench, "first", 1)), ("c", "ctrun", lambda: lost_node(bench, C))]
            if T:
                cases.append(("t", "torchrun", lambda: lost_node(bench, T)))
            m = measure(bench, cases, reps)
            b = m["b"]
            if b:
                # The deadline runs from the killed node's last heartbeat, 0 to 1 interval before T0.
                b = dict(b, text=f"{(deadline_ms - HEARTBEAT[0] * 1000) / 1000:.0f}–{deadline_ms / 1000:.0f} s "
                                 f"+ {b['median']:.1f} ms")
            rows.append(("node SIGKILLed → first worker restarted on a survivor, 3 agents × 1 worker, --nnodes=2:3 "
                         f"(heartbeat deadline: ctrun {deadline_ms / 1000:.0f} s; torchrun 1.13 ignores the keys: "
                         f"{TORCH_HEARTBEAT_S} s)", b, m["c"], m.get("t"), f"≤ {deadline_ms + 100} ms",
                         deadline_ms + 100, "never restarted"))
        print(f"\nload at the end: {os.getloadavg()[0]:.2f}")
    except (KeyboardInterrupt, Interrupted) as e:
        sig = e.args[0] if isinstance(e, Interrupted) else signal.SIGINT
        print(f"\ninterrupted by {signal.Signals(sig).name}; stopping every process started", file=sys.stderr)
        interrupted = 128 + sig
    finally:
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)  # a second ^C must not cut the cleanup short
        bench.close()
    if interrupted:
        sys.exit(interrupted)

    table = render(rows, args.bound, args.reps)
    print("\n== summary ==\n" + table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")


def render(rows, bound, reps):
    out = [f"| metric (median of {reps}; CLOCK_MONOTONIC stamps) | bare processes | ctrun | torchrun 1.13 | "
           "torchrun / ctrun | ctrun / bare | ctrun target |",
           "|---|---|---|---|---|---|---|"]
    for label, b, c, t, target, target_ms, never in rows:
        tr = fmt_ms(t, bound, never) if t is not None else "-"
        if c and t and math.isinf(t["median"]) and math.isfinite(c["median"]):
            rt = f"> {bound * 1000 / c['median']:,.0f}×"
        else:
            rt = ratio(t, c)
        tgt = target
        if target_ms is not None and c is not None and math.isfinite(c["median"]):
            tgt += " ✓" if c["median"] <= target_ms else " ✗"
        out.append(f"| {label} | {fmt_ms(b, bound)} | {fmt_ms(c, bound, never)} | {tr} | {rt} | {ratio(c, b)} | {tgt} |")
    return "\n".join(out)


if __name__ == "__main__":
    main()
