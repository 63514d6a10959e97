# Under --run_path: writes what the worker sees to <dir>/<RANK>.json (environment, argv, __name__,
# __file__, working directory); then the rank named by the second argument raises.
import json
import os
import sys

with open(os.path.join(sys.argv[1], os.environ["RANK"] + ".json"), "w") as f:
    json.dump({"env": dict(os.environ), "argv": sys.argv, "name": __name__, "file": __file__, "cwd": os.getcwd()}, f)


def load_batch(i):
    raise ValueError(f"corrupt sample {i} on rank {os.environ['RANK']}")


if os.environ["RANK"] == sys.argv[2]:
    load_batch(7)
