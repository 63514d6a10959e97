# torchrun's test_script.py contract: every variable must exist (KeyError otherwise); touches
# <dir>/<RANK> and checks is_torchelastic_launched().
import os
import sys

import torch.distributed as dist

REQUIRED = ["LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
            "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
            "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "OMP_NUM_THREADS", "TEST_SENTINEL_PARENT",
            "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_USE_AGENT_STORE"]
values = {k: os.environ[k] for k in REQUIRED}
assert dist.is_torchelastic_launched()
out_dir = sys.argv[1]
with open(os.path.join(out_dir, values["RANK"]), "w") as f:
    for k in REQUIRED:
        f.write(f"{k}={values[k]}\n")
