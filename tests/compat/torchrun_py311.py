#!/usr/bin/python3
# Debian's torchrun (torch 1.13) under Python 3.11: Std.from_str turns "0" and "3" into None there
# (iterating an IntFlag skips its zero and composite members), and every run parses --redirects
# "0", so the stock script fails before it starts a worker. This runs torch.distributed.run with
# that one method mended; the side-by-side tests compare ctrun with it.
import sys

import torch.distributed.elastic.multiprocessing.api as api

_checked = api.Std.from_str  # still raises ValueError for what does not parse


def _from_str(vm):
    _checked(vm)
    if ":" not in vm:
        return api.Std(int(vm))
    return {int(i): api.Std(int(v)) for i, v in (m.split(":") for m in vm.split(","))}


api.Std.from_str = staticmethod(_from_str)

from torch.distributed.run import main  # noqa: E402

# Guarded as the console script is: --run_path's workers are spawned children that import this
# file again as __mp_main__.
if __name__ == "__main__":
    sys.exit(main())
