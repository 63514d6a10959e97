// WorkerEnv: the single place that knows the worker environment variables torchrun sets (RANK,
// LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, TORCHELASTIC_*, ...; listed in BuildWorkerEnv) and the
// worker command line. Pure functions of (config, ranks, attempt): no I/O.
#pragma once

#include <string>
#include <vector>

#include "base/environment.h"
#include "config/launch_config.h"

namespace ctrun {

// Ranks of one worker, from the rendezvous (standalone: one node, group_rank 0).
struct RankInfo {
  int local_rank = 0;
  int global_rank = 0;
  int role_rank = 0;
  int group_rank = 0;
  int group_world_size = 1;
  int world_size = 1;
  int role_world_size = 1;
  int local_world_size = 1;
};

// Per-attempt facts shared by every worker of the attempt.
struct AttemptInfo {
  int restart_count = 0;
  std::string master_addr;
  int master_port = 0;
  bool use_agent_store = false;
  std::vector<std::string> error_files;  // per local rank; "" = none
};

// Builds the worker's complete environment: `base_env` (the agent's own) without the agents'
// secrets (CTRUN_RDZV_TOKEN, CTRUN_ETCD_PASSWORD) and without a launcher's heartbeat channel
// (CTRUN_HEARTBEAT_FD, CTRUN_HEARTBEAT_ID: the health monitor sets its own), with torchrun's
// variables set on top.
// OMP_NUM_THREADS=1 is added when absent and nproc > 1 (torchrun's rule); see
// OmpNotice(). PYTHONUNBUFFERED=1 is added, unless set, for a script exec'd by its python #! line
// (config.python_shebang_entrypoint), which misses the -u torchrun's `python -u` gives.
Environment BuildWorkerEnv(const LaunchConfig& config, const Environment& base_env, const RankInfo& rank,
                           const AttemptInfo& attempt);

// The one-line notice printed when OMP_NUM_THREADS is defaulted; "" when it is not.
std::string OmpNotice(const LaunchConfig& config, const Environment& base_env);
// The one-line warning printed when TORCHELASTIC_ENABLE_FILE_TIMER=1 asks for torchrun's file
// timer server, which ctrun does not run (workers get no TORCHELASTIC_TIMER_FILE); "" otherwise.
std::string FileTimerWarning(const Environment& base_env);

// Worker argv: `python -u [-m] script args` for .py / -m, `python -u -c <bootstrap> script args`
// for --run_path (agent/run_path.h), the entrypoint itself otherwise.
// `executable` is ResolveEntrypoint's answer (agent/launch_checks.h): the interpreter when the
// entrypoint runs under Python. Args go through Python's string.Template.safe_substitute, as in
// torchrun (base/py_template.h): `${local_rank}` or `$local_rank` is replaced per worker (torchrun's
// only placeholder), `$$` gives `$`, anything else stays as written; with --expand-placeholders
// also `rank`, `world_size`, `master_addr` and `master_port`, in one pass.
std::vector<std::string> BuildWorkerArgv(const LaunchConfig& config, const std::string& executable,
                                         const RankInfo& rank, const AttemptInfo& attempt);

// Whether the entrypoint runs under Python: --run_path (even with --no_python, as in torchrun), or
// -m, a path ending in .py, or a non-executable Python text file (ClassifyEntrypoint in
// agent/launch_checks.h), each without --no_python.
bool UsesPython(const LaunchConfig& config);

}  // namespace ctrun
