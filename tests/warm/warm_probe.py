"""A worker for the --warm tests: writes what a worker can observe about how it was started to
<dir>/attempt<TORCHELASTIC_RESTART_COUNT>-rank<RANK>.json, then behaves as asked.

  warm_probe.py DIR [--exit N] [--exit-attempt A] [--raise] [--touch FILE] [--sleep S] [--torch] [--print-module M]
               [--barrier NRANKS]  (before exiting, wait until every rank of the attempt wrote its file)
               [--grandchild]  (first of all, fork a child that sleeps; its pid is in the file)
"""
import json
import os
import random
import signal
import stat
import sys
import time


def fd_kind(fd):
    try:
        st = os.fstat(fd)
    except OSError:
        return "closed"
    if stat.S_ISFIFO(st.st_mode):
        return "pipe"
    if stat.S_ISREG(st.st_mode):
        return "file"
    if stat.S_ISCHR(st.st_mode):
        return "chr:" + os.readlink("/proc/self/fd/%d" % fd)
    return "other"


def status_fields():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("SigBlk", "SigIgn", "SigCgt", "Threads", "NoNewPrivs"):
                out[k] = v.strip()
    return out


def handlers():
    out = {}
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGCHLD, signal.SIGUSR1, signal.SIGXFSZ):
        h = signal.getsignal(s)
        out[signal.Signals(s).name] = getattr(h, "__name__", str(h))
    return out


def stdio(f):
    """How the interpreter made a std stream (None when its fd was closed at start)."""
    if f is None:
        return None
    return {k: repr(getattr(f, k, "<absent>")) for k in
            ("mode", "name", "encoding", "errors", "line_buffering", "write_through")} | {
        "buffer": type(getattr(f, "buffer", None)).__name__}


def pdeathsig():
    import ctypes
    sig = ctypes.c_int(0)
    ctypes.CDLL(None).prctl(2, ctypes.byref(sig))  # PR_GET_PDEATHSIG
    return sig.value


def ps_args():
    # The command line as ps, top and pgrep -f show it: the arguments joined by spaces.
    with open("/proc/self/cmdline", "rb") as f:
        return f.read().rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")


def main():
    out_dir = sys.argv[1]
    args = sys.argv[2:]

    def opt(name, default=None):
        return args[args.index(name) + 1] if name in args else default

    grandchild = None
    if "--grandchild" in args:
        grandchild = os.fork()
        if grandchild == 0:
            time.sleep(600)
            os._exit(0)
    main_mod = sys.modules["__main__"]
    info = {
        "grandchild": grandchild,
        "env": dict(os.environ),
        "argv": sys.argv,
        "orig_argv": getattr(sys, "orig_argv", None),
        "ps_args": ps_args(),
        "cwd": os.getcwd(),
        "path0": sys.path[0],
        "name": __name__,
        "file": __file__,
        "main_is_us": main_mod.__dict__.get("main") is main,
        "main_spec": [getattr(main_mod.__spec__, "name", None), getattr(main_mod.__spec__, "origin", None)],
        "fds": [fd_kind(0), fd_kind(1), fd_kind(2)],
        "status": status_fields(),
        "handlers": handlers(),
        "pgid_is_pid": os.getpgid(0) == os.getpid(),
        "pdeathsig": pdeathsig(),
        "stdout_line_buffering": sys.stdout.line_buffering,
        "stdout_write_through": getattr(sys.stdout, "write_through", None),
        "stdin_name": getattr(sys.stdin, "name", None),
        "stdio": [stdio(sys.stdin), stdio(sys.stdout), stdio(sys.stderr)],
        "path": sys.path,
        "authkey": __import__("multiprocessing").current_process().authkey.hex(),
        "flags": repr(sys.flags),
        "executable": sys.executable,
        "random": random.random(),
        "modules_module": opt("--print-module") and getattr(__import__(opt("--print-module")), "VALUE", None),
    }
    if "--torch" in args:
        import torch
        info["torch_rand"] = torch.rand(1).item()
        info["torch_threads"] = torch.get_num_threads()
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    path = os.path.join(out_dir, "attempt%s-rank%s.json" % (attempt, os.environ.get("RANK", "0")))
    with open(path + ".tmp", "w") as f:
        json.dump(info, f, indent=1, sort_keys=True)
    os.rename(path + ".tmp", path)
    print("probe rank %s attempt %s" % (os.environ.get("RANK"), attempt), flush=True)
    if opt("--barrier"):  # wait (bounded) until every rank of this attempt has written its file
        deadline = time.time() + 30
        while time.time() < deadline and sum(
                os.path.exists(os.path.join(out_dir, "attempt%s-rank%d.json" % (attempt, r)))
                for r in range(int(opt("--barrier")))) < int(opt("--barrier")):
            time.sleep(0.005)
    exit_attempt = opt("--exit-attempt")
    if opt("--touch") and attempt == "0":
        with open(opt("--touch"), "a") as f:
            f.write("\nVALUE = 2\n")
    if opt("--sleep"):
        time.sleep(float(opt("--sleep")))
    if "--raise" in args:
        raise ValueError("probe raised on purpose")
    if opt("--exit") and (exit_attempt is None or exit_attempt == attempt):
        sys.exit(int(opt("--exit")))


if __name__ == "__main__":
    main()
