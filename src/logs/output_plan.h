// OutputPlan: for one attempt, decides what every worker's fd 1 and fd 2 become (the StdioTarget
// the agent puts in SpawnSpec) and, for piped streams, the OutputRelay's sinks. Pure: no I/O.
//
// Per local rank and stream ("redirect" = -r OR -t for that stream, "shown" = the rank passes
// --local-ranks-filter and --ranks-filter, "files" = log dir is not /dev/null):
//   tee, shown                -> Pipe; relay writes the file (if files) and prefixed console lines
//   redirect (or tee, hidden) -> File(<rank dir>/std{out,err}.log), written by the worker
//                                directly (no relay); DevNull when files are off
//   neither, hidden           -> DevNull
//   neither, shown            -> Pipe with prefixed console lines (ctrun default: lines of
//                                different ranks never mix), except Inherit (zero overhead, the
//                                worker keeps the TTY) when nproc == 1 and no --log-prefix,
//                                or when --log-prefix inherit (torchrun's behaviour)
// Whenever stderr would go to DevNull it is piped instead with no sinks, so the failure summary
// still has its tail (OutputRelay::StderrTail).
// error_file is always set (TORCHELASTIC_ERROR_FILE): <rank dir>/error.json, or /dev/null.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"
#include "config/launch_config.h"
#include "logs/log_dir.h"
#include "logs/output_relay.h"
#include "logs/prefix.h"
#include "process/spawn_spec.h"

namespace ctrun::logs {

struct StreamPlan {
  StdioTarget target;    // goes into SpawnSpec::stdout_target / stderr_target
  bool console = false;  // relay copies lines to ctrun's console (target is kPipe)
  std::string tee_file;  // relay copies raw bytes to this file (target is kPipe); "" none
  std::string log_file;  // this stream's log file however written (direct or tee); "" none
  bool relayed() const { return target.kind == StdioTarget::Kind::kPipe; }
};

struct WorkerOutputPlan {
  int local_rank = 0;
  int global_rank = 0;
  StreamPlan out;
  StreamPlan err;
  std::string error_file;  // TORCHELASTIC_ERROR_FILE
  std::string prefix;      // plain console prefix ("" none)
};

struct PlanInputs {
  int nproc = 1;
  int world_size = 1;
  std::vector<int> global_ranks;   // by local rank; empty: node_rank * nproc + local_rank
  int node_rank = 0;
  bool multi_node = false;         // nnodes > 1: the default prefix shows the host
  std::string host;                // short host name
  const AttemptPaths* paths = nullptr;  // LogDir::PrepareAttempt of this attempt (required)
  const char* env_template = nullptr;   // getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE")
};

// Errors: bad -r/-t/filter/--log-prefix values (message names the flag), inconsistent inputs.
StatusOr<std::vector<WorkerOutputPlan>> PlanOutput(const LaunchConfig& config, const PlanInputs& in);

// Validates the log flags of a config without planning (for the CLI, before any side effect).
Status ValidateLogFlags(const LaunchConfig& config, const char* env_template);

// Opens a tee file: O_WRONLY|O_CREAT|O_TRUNC|O_CLOEXEC, 0644.
StatusOr<UniqueFd> OpenLogFile(const std::string& path);
// The relay sinks of one piped stream of a plan (opens the tee file, if any).
StatusOr<Sinks> MakeSinks(const WorkerOutputPlan& plan, Stream stream);

}  // namespace ctrun::logs
