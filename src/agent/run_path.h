// --run_path: torchrun runs the script with runpy.run_path(script, run_name="__main__") inside a
// worker function that its @record wraps, so an uncaught exception lands in the worker's error
// file (TORCHELASTIC_ERROR_FILE) although the script has no @record of its own. ctrun has no
// Python agent; each worker is `<python> -u -c <kRunPathBootstrap> SCRIPT ARGS...`, which does the
// same in a fresh interpreter:
//  - sys.argv is [SCRIPT, ARGS...]; the script runs as __main__ through runpy.run_path;
//  - sys.path[0] is what `python -u SCRIPT` would have: the script's directory, or for a
//    directory or zip archive with a __main__.py the path itself (runpy puts it there); torchrun's
//    workers have the agent's instead; -P / PYTHONSAFEPATH leave it out, as Python does;
//  - faulthandler is on (torchrun's record() enables it);
//  - an uncaught Exception (not SystemExit, not KeyboardInterrupt: as record()) is written to
//    $TORCHELASTIC_ERROR_FILE in torchelastic's layout, then re-raised: the interpreter prints
//    the traceback and exits 1. A file that cannot be written does not hide the exception.
#pragma once

namespace ctrun {

extern const char* const kRunPathBootstrap;

}  // namespace ctrun
