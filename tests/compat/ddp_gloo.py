# init_process_group("gloo", env://) + all_reduce of a one-hot vector (torchrun's
# test_script_init_method.py), then a small DDP step; exits non-zero on a wrong sum.
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
assert world == int(os.environ["WORLD_SIZE"]) and rank == int(os.environ["RANK"])
t = torch.zeros(world)
t[rank] = 1
dist.all_reduce(t)
if not torch.equal(t, torch.ones(world)):
    print(f"rank {rank}: bad all_reduce result {t}", file=sys.stderr)
    sys.exit(3)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
model(torch.ones(2, 4)).sum().backward()
dist.barrier()
if rank == 0:
    print(f"all_reduce ok world_size={world} restart={os.environ['TORCHELASTIC_RESTART_COUNT']} "
          f"agent_store={os.environ['TORCHELASTIC_USE_AGENT_STORE']}", flush=True)
fail_attempt = os.environ.get("CTRUN_TEST_FAIL_UNTIL_ATTEMPT")
if fail_attempt is not None and int(os.environ["TORCHELASTIC_RESTART_COUNT"]) < int(fail_attempt) and rank == world - 1:
    sys.exit(9)
dist.destroy_process_group()
