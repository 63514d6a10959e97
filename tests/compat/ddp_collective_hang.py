# A gloo DDP job that beats once per step. At step 5, rank 1 stops inside its own code (a sleep
# that never ends) while rank 0 waits for it in the step's all_reduce: both fall silent within
# moments of each other. ctrun must name both and save both ranks' stacks: rank 0's show the
# collective, rank 1's do not.
import os
import time

import torch
import torch.distributed as dist

hb = os.environ.get("CTRUN_HEARTBEAT_FD")
try: s = os.fstat(int(hb)); hb = int(hb) if f"{s.st_dev}:{s.st_ino}" == os.environ.get("CTRUN_HEARTBEAT_ID") else None
except (TypeError, ValueError, OSError): hb = None

dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
for step in range(1, 11):
    if step == 5 and rank == 1:
        while True:
            time.sleep(1)
    t = torch.ones(1)
    dist.all_reduce(t)  # rank 0 waits here at step 5
    if hb is not None: os.write(hb, b"%d\n" % step)
dist.destroy_process_group()
