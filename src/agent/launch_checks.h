// Launch checks: what main() verifies after parsing and before anything is started, so bad input
// ends with one clear line and exit code 2 and never with a worker, a restart loop or a hang.
//  - ResolveNproc: --nproc_per_node=cpu|gpu|auto -> a count (GPUs probed at run time).
//  - ResolveEntrypoint: the program (or interpreter and script) exists and is executable; gives the
//    file every worker execs, found through PATH once, here (the spawner searches nothing).
#pragma once

#include <string>

#include "base/environment.h"
#include "base/status.h"
#include "config/launch_config.h"
#include "gpu/gpu_probe.h"

namespace ctrun {

// cpus: the number of CPUs this process may run on (sched_getaffinity); gpus: after --gpus.
Status ResolveNproc(LaunchConfig* config, const GpuInventory& gpus, int cpus);
// After ResolveNproc: the warning line for a CUDA_VISIBLE_DEVICES list of several MIG instances
// (a CUDA process uses only the first): gpu/auto counted one worker for it, or a count of workers
// all share the first instance; "" when it does not apply (--virtual-local-rank gives each worker
// its own entry).
std::string MigListNotice(const LaunchConfig& config, const GpuInventory& gpus);
// After ResolveNproc: --virtual-local-rank has a CUDA_VISIBLE_DEVICES entry for every local
// rank (worker_env: the workers' base environment, after --gpus); --debug-rank names a rank of
// a fixed-size job.
Status CheckGpuFlags(const LaunchConfig& config, const Environment& worker_env);
// `name` resolved through $PATH like execvp; "" when not found.
std::string FindOnPath(const std::string& name, const Environment& env);
// python_exec: FindPython's answer. Returns python_exec for .py and -m entrypoints, else the
// entrypoint itself, resolved through $PATH when it has no '/'.
StatusOr<std::string> ResolveEntrypoint(const LaunchConfig& config, const std::string& python_exec,
                                        const Environment& env);
// Resolves argv0 the way execvp would, through `path` (the value of PATH; nullptr: unset, then
// the usual system directories); returns argv0 unchanged when it contains '/', or when nothing
// executable is found.
std::string ResolveExecutable(const std::string& argv0, const std::string* path);
// $PYTHON_EXEC, else python3 resolved through PATH; "" when neither exists.
std::string FindPython(const Environment& env);
// The Python a script's #! line runs it with ("#!/usr/bin/env python3": python3 resolved through
// `path`, as env(1) does); "" when the file has no #! line or it names no python*.
std::string ShebangPython(const std::string& script, const std::string* path);

// torchrun runs every entrypoint without --no_python under Python; ctrun executes one that does
// not end in .py directly, except what it could not execute and Python can run: those set
// config->python_text_entrypoint and run under Python, as torchrun would run them:
//  - a Python text file without the exec bit, or without a #! line;
//  - a bare name (no '/') that PATH does not have but the working directory has as an executable
//    Python text file (a command name found in PATH still runs that command);
//  - a directory with a __main__.py, and a zip archive (a zipapp, .pyz) without a #! line.
// A Python text file: a regular file whose first 4 KiB hold no NUL byte and that starts with a
// python #! line or with no #! line at all (a "#!/bin/sh" script without the exec bit stays an
// error). `path`: $PATH. Returns the one-line notice to log when it applies, else "".
// An executable Python text file with a #! line that the kernel runs sets
// config->python_shebang_entrypoint instead (its workers get PYTHONUNBUFFERED=1: BuildWorkerEnv).
std::string ClassifyEntrypoint(LaunchConfig* config, const std::string* path);

// The info line naming the interpreter the workers run under and where it came from; "" when the
// entrypoint does not run under Python.
std::string PythonNotice(const LaunchConfig& config, const std::string& python_exec, const Environment& env);

// One warning line when flags that only shape single-node restarts are given to a multi-node job
// (its restarts are the rendezvous's): --restart-backoff, and the crash-loop guard that
// --heartbeat-timeout turns on; "" otherwise.
std::string MultiNodeRestartFlagsNotice(const LaunchConfig& c);

// One warning line for --event-log-handler console, where torchrun prints its agent's events and
// ctrun does not (its own: --events-file); "" for null and dynamic_rendezvous, which print nothing
// in torchrun either.
std::string EventLogHandlerNotice(const LaunchConfig& c);

}  // namespace ctrun
