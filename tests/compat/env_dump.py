# Writes what a worker sees to <dir>/<RANK>.json: its environment, argv and working directory.
import json
import os
import sys

with open(os.path.join(sys.argv[1], os.environ["RANK"] + ".json"), "w") as f:
    json.dump({"env": dict(os.environ), "argv": sys.argv, "cwd": os.getcwd()}, f)
