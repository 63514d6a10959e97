// The rules that decide whether a worker may be forked from the warm server (ctrun --warm) or must
// be started cold. Pure functions of SpawnSpecs: tested without a server. Two kinds of server: a
// Python interpreter running the embedded warm_server.py, and a C++ binary that opts in with
// CTRUN_MAIN (include/ctrun/warm_main.h; whether it does is read from the file, native_opt_in.h).
//
// A warm worker inherits everything the server's interpreter decided at start-up and everything
// its preloaded modules read at import time. What a child can read again (OMP_NUM_THREADS through
// torch.set_num_threads, TORCH_DISTRIBUTED_DEBUG, TORCH_LOGS) is re-read in the child; what it
// cannot is pinned: when a pinned variable, the interpreter or its flags differ from the server's,
// the worker starts cold.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "process/spawn_spec.h"

namespace ctrun::warm {

// A spec's argv read as "<interpreter> [flags...] script.py args...", "... -m module args..." or
// "... -c code args..." (--run_path's bootstrap), or (native) as a C++ binary that opts in, run as
// itself.
struct WarmLaunch {
  std::string program;             // the file execve would run: the interpreter, or the binary
  std::vector<std::string> flags;  // interpreter flags before the script, -m or -c ("-u")
  bool module = false;
  bool code = false;               // -c: the code is the first argument after it
  std::string target;              // the script path, the module name, or for -c the argument after
                                   // the code (--run_path's script); "" for a binary
  bool native = false;             // a CTRUN_MAIN binary
};

// Why a spec has no warm server kind at all: an interpreter flag that takes a value or reads the
// program from stdin (-W, -X, - or --), named, or an entrypoint that is no .py script, -m module,
// -c code or CTRUN_MAIN binary.
std::string NotWarmEntrypoint(const SpawnSpec& spec);

// "" when every argument, environment entry and the working directory `cwd` is valid UTF-8 (the
// warm path hands them over as JSON text); else which one is not, as a reason to start cold.
std::string NotUtf8(const SpawnSpec& spec, const std::string& cwd);

// The file execve runs for `spec`.
const std::string& ExecutableOf(const SpawnSpec& spec);

// nullopt when the spec is not a Python script, module or -c launch by an interpreter (a program
// whose file name starts with "python").
std::optional<WarmLaunch> ParsePythonLaunch(const SpawnSpec& spec);
// The spec as a launch of its binary (whether the binary opts in is the caller's question).
WarmLaunch NativeLaunch(const SpawnSpec& spec);

// Variables read once by the interpreter or by native libraries at load time, which a forked
// child cannot re-read: PYTHON* (PYTHONHASHSEED, PYTHONPATH, ...), LD_*, OMP_*/KMP_*/MKL_* (but
// OMP_NUM_THREADS, which a Python child re-reads), LANG/LC_* (the interpreter's stdio encoding),
// TORCH_CPP_LOG_LEVEL and TORCH_SHOW_CPP_STACKTRACES (c10's logging, set up at load). For a
// native server (`native`): not PYTHON*, and OMP_NUM_THREADS too (libgomp reads it at load and a
// C++ child has no torch.set_num_threads to call on the program's behalf).
bool IsPinnedVariable(std::string_view name, bool native = false);

// The entries that every env has, in the order of the first (what the server is started with).
std::vector<std::string> CommonEnv(const std::vector<SpawnSpec>& specs);

// What a server was started as.
struct ServerIdentity {
  WarmLaunch launch;                         // program and flags (target: the first spec's)
  std::map<std::string, std::string> pinned; // the pinned variables of its environment
};

ServerIdentity IdentityOf(const WarmLaunch& launch, const std::vector<std::string>& env);

// Why `spec` must start cold rather than be forked from `server`, or "" when it may be forked:
// not a launch of the server's kind, another interpreter, flags or binary, a pinned variable that
// differs (named), or an stdio kind the warm path does not hand over.
std::string WarmMismatch(const ServerIdentity& server, const SpawnSpec& spec);

}  // namespace ctrun::warm
