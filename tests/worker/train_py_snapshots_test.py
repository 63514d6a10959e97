"""examples/train.py's snapshot store: a save keeps the newest `keep` steps up to its own and
drops the steps above it (a future the job went back from), so a save never removes itself; a
resume drops the steps above the one it resumed from (all of them on a fresh start).

Usage: train_py_snapshots_test.py TRAIN_PY. Exit 0: pass, 1: fail, 77: no torch (skipped)."""
import importlib.util
import sys
import tempfile

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
print("ok")
