#!/usr/bin/python3
"""train.py - the `train` example in Python: DDP (gloo) on a deterministic synthetic dataset,
with crash-safe snapshots and a resume that all ranks agree on. Same flags as examples/train.cc.

Run:  ctrun --standalone --nproc_per_node=2 --max_restarts=3 /usr/bin/python3 examples/train.py \
          --epochs 3 --snapshot-dir /tmp/snaps --snapshot-every 5 --fail-at-step 12 --fail-rank 1
(or under torchrun: torchrun --standalone --nproc_per_node=2 examples/train.py ...)

Snapshots: <dir>/rank<R>/snapshot-<step:020d>.ptsnap = b"CTPYSNP1" + u64 length + sha256 +
torch.save(state) bytes, written to a temp file, fsync'ed, renamed, directory fsync'ed; the newest
file whose length and digest check out is used. Bit-deterministic like the C++ example: the final
parameters (--out) are identical with and without injected failures, at any step (a crash in
mid-epoch resumes from an earlier snapshot; the gradient average does not depend on the layout of
DDP's buckets, see ordered_mean_hook). --timing prints unix_ns stamps of the start-up phases.
"""
import time

T_START = time.time_ns()  # before the imports: --timing reports how long they took

import argparse
import collections
import hashlib
import io
import os
import re
import socket
import struct
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

MAGIC = b"CTPYSNP1"
HEADER = struct.Struct("<8sQ32s")


HOST = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "unknown-host"
TEMP_PREFIX = ".tmp-"
FOREIGN_TEMP_AGE_S = 3600


def temp_name(path):
    """The temp file of a save: host and pid name its writer (the C++ library's rule, shared
    with its snapshots in the same directory), so a store opened later can tell a dead writer's."""
    return os.path.join(os.path.dirname(path), "%s%s-%s-%d" % (TEMP_PREFIX, os.path.basename(path), HOST, os.getpid()))


def remove_dead_writers_temps(d):
    """Temps of saves cut short (a SIGKILL mid-save) hold a whole snapshot each and would pile up
    over restarts. One of this host whose pid is gone goes now; another host's (a shared file
    system) only after an hour without a change, as its writer's pid cannot be checked here."""
    for name in os.listdir(d):
        m = re.fullmatch(re.escape(TEMP_PREFIX) + r"snapshot-\d+\.ptsnap-(.+)-(\d+)", name)
        if not m:
            continue
        path = os.path.join(d, name)
        host, pid = m.group(1), int(m.group(2))
        try:
            # Our own pid: saves here are synchronous, so none is in flight; the file is a dead
            # writer's that had our pid (a restarted container's fresh pid namespace).
            if host == HOST and pid != os.getpid():
                try:
                    os.kill(pid, 0)
                    continue
                except ProcessLookupError:
                    pass
                except PermissionError:
                    continue  # alive, another user's
            elif host != HOST and time.time() - os.lstat(path).st_mtime < FOREIGN_TEMP_AGE_S:
                continue
            os.unlink(path)
        except OSError:
            pass


def write_atomic(path, data):
    d = os.path.dirname(path)
    tmp = temp_name(path)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    fsync_dir(d)


def fsync_dir(d):
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SnapshotStore:
    def __init__(self, directory, keep):
        self.dir = directory
        self.keep = keep
        os.makedirs(directory, exist_ok=True)
        remove_dead_writers_temps(directory)

    def path(self, step):
        return os.path.join(self.dir, "snapshot-%020d.ptsnap" % step)

    def steps(self):
        out = []
        for name in os.listdir(self.dir):
            if name.startswith("snapshot-") and name.endswith(".ptsnap"):
                try:
                    out.append(int(name[len("snapshot-"):-len(".ptsnap")]))
                except ValueError:
                    pass
        return sorted(out)

    def save(self, step, state):
        buf = io.BytesIO()
        torch.save(state, buf)
        payload = buf.getvalue()
        write_atomic(self.path(step), HEADER.pack(MAGIC, len(payload), hashlib.sha256(payload).digest()) + payload)
        # Steps above this one are a future the job went back from (the ranks resumed from an
        # older step they all had): they go, or they would push this snapshot out of the `keep`.
        self.discard_above(step)
        for old in [s for s in self.steps() if s <= step][:-self.keep]:
            os.unlink(self.path(old))

    def discard_above(self, step):
        """Removes the snapshots above `step` (all for -1), durably. A resume calls it once the
        ranks agreed: a newer snapshot kept on one rank could be agreed on later, after a save of
        that step which only the other ranks finished, and the ranks would resume from two runs."""
        newer = [s for s in self.steps() if s > step]
        for s in newer:
            os.unlink(self.path(s))
        if newer:
            fsync_dir(self.dir)

    def load(self, step):
        try:
            with open(self.path(step), "rb") as f:
                data = f.read()
        except OSError:
            return None
        if len(data) < HEADER.size:
            return None
        magic, length, digest = HEADER.unpack_from(data)
        payload = data[HEADER.size:]
        if magic != MAGIC or length != len(payload) or hashlib.sha256(payload).digest() != digest:
            print("[train.py] skipping corrupt snapshot %s" % self.path(step), file=sys.stderr)
            return None
        return torch.load(io.BytesIO(payload))

    def latest(self, max_step=None):
        for step in reversed(self.steps()):
            if max_step is not None and step > max_step:
                continue
            state = self.load(step)
            if state is not None:
                return step, state
        return -1, None


def all_min(value):
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    _COLLECTIVE_TENSORS.append(t)
    return int(t.item())


def agreed_resume(store):
    """Every rank proposes its newest loadable step; repeat MIN until all hold the same one. The
    snapshots above it (all of them on a fresh start) are removed before training goes on."""
    bound = None
    while True:
        step, state = store.latest(bound)
        agreed = all_min(step)
        if agreed < 0:
            break
        if step != agreed:
            state = store.load(agreed)
        if all_min(1 if state is not None else 0) == 1:
            store.discard_above(agreed)
            return state
        if agreed == 0:
            break
        bound = agreed - 1
    store.discard_above(-1)
    return None


class Mlp(nn.Module):
    def __init__(self, features, hidden, classes):
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, classes)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        x = self.drop(F.relu(self.fc1(x)))
        return self.fc3(F.relu(self.fc2(x)))


# The tensors of the last collectives, kept referenced past the process group's end. A gloo worker
# thread drops a finished work a moment after the work's waiter returns; a tensor whose Python
# object is gone by then is freed by that thread, which takes the GIL to do it. At the script's end
# the DDP reducer drops the last reference to the process group, whose destructor (torch 1.13)
# joins those threads while holding the GIL: a thread still freeing such a tensor then waits for
# the GIL forever and the rank never exits (seen under load). Every collective here puts its
# tensors in, so a thread's drop is never the last one; the last collective's stay to the end.
_COLLECTIVE_TENSORS = collections.deque(maxlen=4)


def ordered_mean_hook(_state, bucket):
    """Gradient averaging whose result does not depend on DDP's bucket layout.

    The default hook all-reduces each bucket; gloo's ring adds an element's contributions in an order
    that depends on where the element sits in the bucket. A DDP wrapper re-created on resume lays
    out its buckets differently in its first iteration (before it rebuilds them in gradient-ready
    order), so a resumed run would differ from an uninterrupted one in the last bits. Gathering every
    rank's bucket and adding them in rank order gives each element the same sum in every layout."""
    t = bucket.buffer()
    world = dist.get_world_size()
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t)  # synchronous: the buffers are complete when the sum reads them
    _COLLECTIVE_TENSORS.append((t, parts))
    total = parts[0].clone()
    for p in parts[1:]:
        total += p
    fut = torch.futures.Future()
    fut.set_result(total.div_(world))
    return fut


def ints(s):
    return [int(v) for v in s.split(",")] if s else []


@record
def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--dataset-size", type=int, default=512)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--snapshot-dir", default="")
    p.add_argument("--snapshot-every", type=int, default=0)
    p.add_argument("--keep", type=int, default=3)
    p.add_argument("--fail-at-step", type=ints, default=[])
    p.add_argument("--fail-rank", type=ints, default=[])
    p.add_argument("--fail-attempt", type=ints, default=[])
    p.add_argument("--out", default="")
    p.add_argument("--step-ms", type=int, default=0)
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--timing", action="store_true", help="print unix_ns stamps of the start-up phases")
    a = p.parse_args()
    t_imported = time.time_ns()

    def stamp(what, t=None):
        if a.timing:
            print("[train.py] timing rank %d attempt %s %s unix_ns=%d" % (
                int(os.environ.get("RANK", "0")), os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"), what,
                t if t is not None else time.time_ns()), flush=True)

    torch.set_num_threads(1)
    stamp("start", T_START)
    stamp("imported", t_imported)
    dist.init_process_group("gloo")
    stamp("pg_ready")
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    features, classes = 16, 4

    g = torch.Generator().manual_seed(a.seed)
    x = torch.randn(a.dataset_size, features, generator=g)
    teacher = torch.randn(features, classes, generator=g)
    y = (x @ teacher + 0.5 * torch.randn(a.dataset_size, classes, generator=g)).argmax(1)

    torch.manual_seed(a.seed)
    model = Mlp(features, a.hidden, classes)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    sampler = DistributedSampler(range(a.dataset_size), num_replicas=world, rank=rank, shuffle=True, seed=a.seed)
    steps_per_epoch = (len(sampler) + a.batch_size - 1) // a.batch_size
    total = steps_per_epoch * a.epochs

    store = SnapshotStore(os.path.join(a.snapshot_dir, "rank%d" % rank), a.keep) if a.snapshot_dir else None
    step, samples_seen = 0, 0
    state = agreed_resume(store) if store else None
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng_cpu"])
        step, samples_seen = state["step"], state["samples_seen"]
    stamp("resumed")
    if rank == 0:
        print("[train.py] attempt %d: %s" % (attempt, "resumed from snapshot at step %d" % step if state else
                                             "starting fresh: world %d, %d steps/epoch" % (world, steps_per_epoch)),
              flush=True)
    ddp = DDP(model)  # broadcasts rank 0's parameters, as the C++ example does on a fresh start
    ddp.register_comm_hook(None, ordered_mean_hook)

    samples_this_attempt = 0
    while step < total:
        epoch, in_epoch = divmod(step, steps_per_epoch)
        for i, s in enumerate(a.fail_at_step):
            r = a.fail_rank[i] if i < len(a.fail_rank) else (a.fail_rank[-1] if a.fail_rank else 0)
            att = a.fail_attempt[i] if i < len(a.fail_attempt) else i
            if s == step and r == rank and att == attempt:
                stamp("crash")
                print("[train.py] rank %d injecting failure at step %d (attempt %d)" % (rank, step, attempt),
                      file=sys.stderr, flush=True)
                raise RuntimeError("injected failure at step %d on rank %d" % (step, rank))
        sampler.set_epoch(epoch)
        mine = list(sampler)
        idx = torch.tensor(mine[in_epoch * a.batch_size:(in_epoch + 1) * a.batch_size], dtype=torch.int64)
        torch.manual_seed(a.seed * 1000003 + step * 7919 + rank)
        ddp.train()
        opt.zero_grad()
        loss = F.cross_entropy(ddp(x.index_select(0, idx)), y.index_select(0, idx))
        loss.backward()
        opt.step()
        if in_epoch == steps_per_epoch - 1:
            sched.step()
        step += 1
        if samples_this_attempt == 0:
            stamp("first_step")
        samples_this_attempt += len(idx)
        samples_seen += len(idx)
        if rank == 0 and not a.quiet and (step % max(1, total // 20) == 0 or step == total):
            print("[train.py] step %d/%d epoch %d loss %.4f" % (step, total, epoch, loss.item()), flush=True)
        if store and a.snapshot_every > 0 and step % a.snapshot_every == 0 and step < total:
            store.save(step, {"model": model.state_dict(), "optimizer": opt.state_dict(),
                              "scheduler": sched.state_dict(), "rng_cpu": torch.get_rng_state(),
                              "step": step, "epoch": step // steps_per_epoch, "samples_seen": samples_seen})
        if a.step_ms:
            time.sleep(a.step_ms / 1000.0)

    counts = torch.zeros(2 * world, dtype=torch.int64)
    counts[rank], counts[world + rank] = samples_this_attempt, samples_seen
    dist.all_reduce(counts)
    _COLLECTIVE_TENSORS.append(counts)
    if rank == 0:
        print("[train.py] samples processed per rank (this attempt / all attempts):")
        for r in range(world):
            print("[train.py]   rank %d: %d / %d" % (r, counts[r], counts[world + r]))
        if a.out:
            with open(a.out, "w") as f:
                for name, t in model.named_parameters():
                    f.write("%s %d %s\n" % (name, t.numel(), t.detach().contiguous().numpy().tobytes().hex()))
        print("[train.py] done: %d steps, attempt %d" % (total, attempt), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
