// RunOutcome: how one ctrun invocation ended, as a value: what --summary-file writes, what the
// GitHub annotation and the run_end event say, and the code ctrun exits with. It is decided in one
// place (agent/job_outcome.h) and only read afterwards.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "process/exit_status.h"

namespace ctrun {

// ctrun's own exit codes (README "Exit codes"); a worker's failure gives the worker's code.
inline constexpr int kExitSetupError = 1;   // the run could not be set up
inline constexpr int kExitUsage = 2;        // bad command line or input; nothing was started
inline constexpr int kExitMaxRunTime = 124;  // --max-run-time reached (like timeout(1))

// Why the run ended. The exit code alone cannot say: 2 is both a usage error and a worker's
// exit(2); 124 both the deadline and a worker's own 124.
enum class OutcomeKind {
  kSuccess,          // every worker succeeded (exit 0)
  kWorkerFailure,    // a worker failed and no restart was left: its code or 128+signal
  kStartError,       // a worker could not be executed (126/127), no restart
  kSignal,           // ctrun got a terminating signal: 128+signal
  kMaxRunTime,       // --max-run-time reached: 124
  kHung,             // the root cause is a rank ctrun found hung (no heartbeat/output): 124
  kUsageError,       // 2, nothing started
  kSetupError,       // 1: log dir, store port, signalfd, ...
  kRendezvousError,  // multi-node: this agent's rendezvous failed: 3
  kDryRun,           // --dry-run printed the plan: 0
};
// "success", "worker_failure", "start_error", "signal", "max_run_time", "hung", "usage_error",
// "setup_error", "rendezvous_error", "dry_run".
const char* OutcomeKindName(OutcomeKind kind);

// One worker of the last attempt this node ran.
struct RankOutcome {
  int global_rank = 0;
  int local_rank = 0;
  pid_t pid = -1;
  // "succeeded", "failed" (on its own), "stopped" (by ctrun: a signal it sent, or during the
  // teardown that ctrun started), "running" (never reaped: survived SIGKILL).
  std::string state = "running";
  std::optional<ExitStatus> status;  // set unless state is "running"
  double duration_s = 0;             // from its start to its exit (or to the end of the run)
};

struct RunOutcome {
  OutcomeKind kind = OutcomeKind::kSuccess;
  int exit_code = 0;
  std::string root_cause;       // one line; "" on success
  std::optional<int> root_cause_rank;  // global rank of the root-cause worker, when it was one
  int attempts = 0;             // attempts (rounds, multi-node) this node started workers for
  int restarts = 0;             // job-wide restarts (TORCHELASTIC_RESTART_COUNT of the last attempt)
  std::vector<RankOutcome> ranks;          // the last attempt's workers, by global rank
  std::vector<int> running_at_deadline;    // --max-run-time: global ranks still running then
  std::string log_dir;                     // "" when none was created
  std::optional<int> node_rank;            // multi-node: this node's rank in the last round
  std::chrono::system_clock::time_point start;  // when ctrun started
  std::chrono::system_clock::time_point end;
};

// Facts about the invocation itself, for the summary and events files.
struct RunIdentity {
  std::string run_id;
  std::string hostname;
  std::string version;
  int node_rank = 0;  // as given; RunOutcome::node_rank (the last round's) wins when set
};

}  // namespace ctrun
