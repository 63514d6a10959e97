"""examples/train.py's snapshot store: a save keeps the newest `keep` steps up to its own and
drops the steps above it (a future the job went back from), so a save never removes itself; a
resume drops the steps above the one it resumed from (all of them on a fresh start). Temps of
saves cut short carry host and pid: opening a store removes this host's dead writers' temps, and
another host's only once an hour old.

Usage: train_py_snapshots_test.py TRAIN_PY. Exit 0: pass, 1: fail, 77: no torch (skipped)."""
import importlib.util
import os
import subprocess
import sys
import tempfile
import time

try:
    import torch  # noqa: F401  (train.py needs it)
except ImportError:
    print("skipped: this python has no torch")
    sys.exit(77)

spec = importlib.util.spec_from_file_location("train", sys.argv[1])
train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train)

with tempfile.TemporaryDirectory() as d:
    store = train.SnapshotStore(d, keep=1)
    store.save(15, {"step": 15})  # the rank got further than the others before the crash
    store.save(5, {"step": 5})    # the job resumed from scratch: step 5 of the new attempt
    assert store.steps() == [5], store.steps()
    assert store.load(5) == {"step": 5}
    two = train.SnapshotStore(d + "/two", keep=2)
    for step in (10, 20, 30):
        two.save(step, {"step": step})
    two.save(25, {"step": 25})  # resumed at 20 (30 was not on every rank), saved at 25
    assert two.steps() == [20, 25], two.steps()
    assert two.load(25) == {"step": 25}
    train.all_min = lambda value: value  # one rank: the agreement is its own proposal
    three = train.SnapshotStore(d + "/three", keep=5)
    for step in (10, 20, 30):
        three.save(step, {"step": step})
    with open(three.path(30), "r+b") as f:
        f.truncate(10)  # torn: the resume takes 20, and 30 must not outlive it
    assert train.agreed_resume(three) == {"step": 20}
    assert three.steps() == [10, 20], three.steps()
    with open(three.path(10), "r+b") as f:
        f.truncate(10)
    with open(three.path(20), "r+b") as f:
        f.truncate(10)
    assert train.agreed_resume(three) is None  # nothing loadable: a fresh start keeps nothing
    assert three.steps() == [], three.steps()

    temps = d + "/temps"
    os.makedirs(temps)
    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid is gone (reaped)
    names = {
        "dead": ".tmp-snapshot-%020d.ptsnap-%s-%d" % (1, train.HOST, dead.pid),
        "mine": ".tmp-snapshot-%020d.ptsnap-%s-%d" % (2, train.HOST, os.getpid()),
        "live": ".tmp-snapshot-%020d.ptsnap-%s-%d" % (3, train.HOST, os.getppid()),
        "foreign_new": ".tmp-snapshot-%020d.ptsnap-%s-%d" % (4, "other-host", 1),
        "foreign_old": ".tmp-snapshot-%020d.ptsnap-%s-%d" % (5, "other-host", 1),
        "unrelated": ".tmp-notes-123",
    }
    for name in names.values():
        open(os.path.join(temps, name), "wb").write(b"x" * 10)
    old = time.time() - 2 * train.FOREIGN_TEMP_AGE_S
    os.utime(os.path.join(temps, names["foreign_old"]), (old, old))
    train.SnapshotStore(temps, keep=1)
    left = sorted(k for k, v in names.items() if os.path.exists(os.path.join(temps, v)))
    assert left == ["foreign_new", "live", "unrelated"], left
    assert os.path.basename(train.temp_name(temps + "/snapshot-1.ptsnap")) == \
        ".tmp-snapshot-1.ptsnap-%s-%d" % (train.HOST, os.getpid())
print("ok")
