#!/usr/bin/python3
"""torch 1.13 Python clients against ctrun_store_server.

Usage: torch_client_test.py /path/to/ctrun_store_server
Exits 77 (ctest: skipped) when torch cannot be imported. Checks TCPStore set/get/add/wait/
compare_set/delete_key/num_keys, the "/" key prefix of 1.13 clients, a PrefixStore as env:// workers
use it, and a 2-process gloo all_reduce through env:// with TORCHELASTIC_USE_AGENT_STORE=True, for
two restart attempts (TORCHELASTIC_RESTART_COUNT 0 and 1) against the same server.
"""
import datetime
import os
import socket
import struct
import subprocess
import sys
import threading
import time

try:
    import torch
    import torch.distributed as dist
except Exception as e:  # noqa: BLE001
    print(f"SKIP: torch not importable: {e}")
    sys.exit(77)

T = datetime.timedelta(seconds=20)

WORKER = r"""
import os, sys, datetime, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
t = torch.zeros(4)
t[dist.get_rank()] = 1
dist.all_reduce(t)
assert t.sum().item() == dist.get_world_size(), t
dist.barrier()
dist.destroy_process_group()
print("worker", os.environ["RANK"], "ok")
"""


def legacy_get(port, key):
    """GET over a raw legacy-dialect socket: proves which exact key a torch client wrote."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        k = key.encode()
        s.sendall(b"\x05" + struct.pack("<Q", 1) + struct.pack("<Q", len(k)) + k)  # WAIT
        assert s.recv(1) == b"\x00"
        s.sendall(b"\x02" + struct.pack("<Q", len(k)) + k)  # GET
        n = struct.unpack("<Q", recv_exact(s, 8))[0]
        return recv_exact(s, n)


def recv_exact(s, n):
    b = b""
    while len(b) < n:
        chunk = s.recv(n - len(b))
        assert chunk, "connection closed"
        b += chunk
    return b


def check_ops(port):
    c = dist.TCPStore("127.0.0.1", port, None, False, timeout=T)
    c.set("foo", "bar")
    assert c.get("foo") == b"bar"
    assert legacy_get(port, "/foo") == b"bar"  # 1.13 clients prefix keys with "/"
    assert c.add("cnt", 5) == 5
    assert c.add("cnt", 2) == 7
    assert c.get("cnt") == b"7"
    c.wait(["foo", "cnt"])
    c.wait(["foo"], datetime.timedelta(seconds=1))
    assert c.compare_set("foo", "bar", "baz") == b"baz"
    assert c.compare_set("foo", "bar", "qux") == b"baz"
    assert c.compare_set("fresh", "", "x") == b"x"
    assert c.compare_set("ghost", "exp", "y") == b"exp"
    assert c.num_keys() == 3, c.num_keys()  # /foo /cnt /fresh
    assert c.delete_key("fresh") is True
    assert c.delete_key("fresh") is False
    assert c.num_keys() == 2
    # A client created with world_size ADDs the unprefixed "init/" key; torch's server counts it.
    w = dist.TCPStore("127.0.0.1", port, 2, False, timeout=T)
    assert c.num_keys() == 3
    assert legacy_get(port, "init/") == b"1"

    # A wait woken by another client (pybind releases the GIL in wait()).
    done = []
    t = threading.Thread(target=lambda: (w.wait(["late"]), done.append(True)))
    t.start()
    time.sleep(0)  # just yield; the set below may come before or after the wait is parked
    c.set("late", "1")
    t.join(20)
    assert done == [True]

    # A wait that times out raises.
    t0 = time.monotonic()
    lonely = dist.TCPStore("127.0.0.1", port, None, False, timeout=T)
    try:
        lonely.wait(["never"], datetime.timedelta(milliseconds=300))
        raise AssertionError("wait did not time out")
    except RuntimeError as e:
        assert "imeout" in str(e) or "timed out" in str(e), e
    assert time.monotonic() - t0 < 10
    del lonely

    # PrefixStore, as env:// uses it with the agent store in 1.13: PrefixStore joins with "/" and
    # TCPStore adds its own "/", so the wire key is "//worker/attempt_0/MASTER".
    p = dist.PrefixStore("/worker/attempt_0", c)
    p.set("MASTER", "x")
    assert legacy_get(port, "//worker/attempt_0/MASTER") == b"x"
    assert p.get("MASTER") == b"x"
    print("python TCPStore ops: ok")


def check_gloo(port, attempt):
    procs = []
    for rank in range(2):
        env = dict(os.environ)
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                   LOCAL_RANK=str(rank), TORCHELASTIC_USE_AGENT_STORE="True",
                   TORCHELASTIC_RESTART_COUNT=str(attempt), TORCHELASTIC_RUN_ID="store-test",
                   OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER], env=env))
    for p in procs:
        assert p.wait(timeout=90) == 0, f"gloo worker failed (attempt {attempt})"
    print(f"gloo all_reduce via env:// agent store, attempt {attempt}: ok")


def main():
    server = subprocess.Popen([sys.argv[1]], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        line = server.stdout.readline().decode()
        assert line.startswith("PORT "), line
        port = int(line.split()[1])
        check_ops(port)
        check_gloo(port, 0)
        check_gloo(port, 1)
    finally:
        server.stdin.close()  # EOF on stdin stops the server
        rc = server.wait(timeout=10)
    assert rc == 0, rc
    print("PASS")


if __name__ == "__main__":
    main()
