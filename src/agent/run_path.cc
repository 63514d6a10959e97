#include "agent/run_path.h"

namespace ctrun {

// Python source for `python -c`; it defines one function so that the script's globals (a fresh
// __main__ that runpy makes) see none of its names. It imports only what run_path imports anyway
// (pkgutil) and faulthandler before the script; json and traceback (tens of ms) only on failure.
const char* const kRunPathBootstrap = R"py(import sys
def _ctrun_run_path():
    import faulthandler, os, pkgutil, runpy
    try:
        faulthandler.enable(all_threads=True)
    except Exception:
        pass
    del sys.argv[0]
    if sys.path and sys.path[0] == "" and not getattr(sys.flags, "safe_path", False):
        if pkgutil.get_importer(sys.argv[0]) is None:
            sys.path[0] = os.path.dirname(os.path.realpath(sys.argv[0]))
        else:
            del sys.path[0]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except Exception as e:
        path = os.environ.get("TORCHELASTIC_ERROR_FILE")
        if path:
            try:
                import json, time, traceback
                info = {"py_callstack": traceback.format_exc(), "timestamp": str(int(time.time()))}
                with open(path, "w") as f:
                    json.dump({"message": {"message": "%s: %s" % (type(e).__name__, e), "extraInfo": info}}, f)
            except Exception:
                pass
        raise
_ctrun_run_path()
)py";

}  // namespace ctrun
