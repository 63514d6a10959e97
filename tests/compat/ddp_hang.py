# A gloo DDP job that beats once per step (the README's four lines). In attempt 0, rank 1 blocks
# forever in an all_reduce at step 5: rank 0 never joins it, and keeps beating from where it waits.
# ctrun must find rank 1 hung, save its stacks, stop everything and restart; attempt 1 finishes.
import os
import sys
import time

import torch
import torch.distributed as dist

import os; hb = os.environ.get("CTRUN_HEARTBEAT_FD")
try: s = os.fstat(int(hb)); hb = int(hb) if f"{s.st_dev}:{s.st_ino}" == os.environ.get("CTRUN_HEARTBEAT_ID") else None
except (TypeError, ValueError, OSError): hb = None

dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
for step in range(1, 11):
    if attempt == 0 and step == 5 and rank == 0:
        while True:  # waits on something else, alive: its beats go on
            if hb is not None: os.write(hb, b"%d\n" % step)
            time.sleep(0.05)
    t = torch.ones(1)
    dist.all_reduce(t)  # rank 1 blocks here at step 5 of attempt 0
    model(torch.ones(2, 4)).sum().backward()
    if hb is not None: os.write(hb, b"%d\n" % step)
dist.barrier()
if rank == 0:
    print(f"ddp_hang done restart={attempt}", flush=True)
dist.destroy_process_group()
