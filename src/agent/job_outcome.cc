#include "agent/job_outcome.h"

#include "rendezvous/rendezvous.h"

namespace ctrun {
namespace {

bool IsDeadlineCause(const rdzv::Cause& c) { return c.rank < 0 && c.fatal && c.exit_code == kExitMaxRunTime; }

// Multi-node: the agreed outcome (or this agent's own rendezvous failure).
void DecideMultiNode(const Agent& agent, const std::vector<WorkerFailure>& failures, RunOutcome* o) {
  o->exit_code = agent.exit_code();
  const auto& end = agent.job_end();
  if (agent.setup_failed()) {
    o->kind = OutcomeKind::kSetupError;
    o->root_cause = agent.end_message();
  } else if (end && end->rendezvous_error) {
    o->kind = OutcomeKind::kRendezvousError;
    o->root_cause = end->message;
  } else if (o->exit_code == 0) {
    o->kind = OutcomeKind::kSuccess;
  } else if (end && end->cause) {
    const rdzv::Cause& c = *end->cause;
    o->kind = IsDeadlineCause(c) ? OutcomeKind::kMaxRunTime
              : c.rank < 0 && c.fatal ? OutcomeKind::kStartError
                                      : OutcomeKind::kWorkerFailure;
    if (c.rank >= 0) o->root_cause_rank = c.rank;
    o->root_cause = c.Describe();
    if (end->cause_is_local)  // the same rank, told with what this node knows of it (its error file)
      if (auto root = RootCauseOf(failures, o->root_cause_rank)) o->root_cause = DescribeFailure(failures[*root]);
  } else {
    o->kind = o->exit_code == rdzv::kExitRendezvous ? OutcomeKind::kRendezvousError : OutcomeKind::kWorkerFailure;
    o->root_cause = end ? end->message : agent.end_message();
  }
}

}  // namespace

std::string DescribeFailure(const WorkerFailure& f) {
  std::string s = "rank " + std::to_string(f.global_rank) + " (local_rank " + std::to_string(f.local_rank) +
                  ", pid " + std::to_string(f.pid) + ") " + f.status.ToString();
  if (f.error_data && !f.error_data->message.empty()) s += ": " + f.error_data->message.substr(0, f.error_data->message.find('\n'));
  if (f.oom_killed) s += " (likely killed by the kernel OOM killer)";
  if (!f.hang.empty()) s += " (" + f.hang + ")";
  if (!f.never_started.empty()) s += ": " + f.never_started;
  return s;
}

RunOutcome EarlyOutcome(OutcomeKind kind, const std::string& message) {
  RunOutcome o;
  o.kind = kind;
  switch (kind) {
    case OutcomeKind::kUsageError: o.exit_code = kExitUsage; break;
    case OutcomeKind::kSetupError: o.exit_code = kExitSetupError; break;
    case OutcomeKind::kRendezvousError: o.exit_code = rdzv::kExitRendezvous; break;
    default: o.exit_code = 0; break;
  }
  o.root_cause = message;
  return o;
}

RunOutcome DecideJobOutcome(const Agent& agent, const std::vector<WorkerFailure>& failures) {
  RunOutcome o;
  if (const int sig = agent.ended_by_signal(); sig != 0) {
    o.kind = OutcomeKind::kSignal;
    o.exit_code = agent.exit_code();
    o.root_cause = "ctrun received signal " + std::to_string(sig) + " (" + SignalName(sig) + ")";
    return o;
  }
  if (agent.deadline_reached()) {
    o.kind = OutcomeKind::kMaxRunTime;
    o.exit_code = kExitMaxRunTime;
    o.root_cause = agent.end_message();
    return o;
  }
  if (agent.multi_node()) {
    DecideMultiNode(agent, failures, &o);
    return o;
  }
  if (agent.setup_failed() || agent.ended_by_start_error()) {
    o.kind = agent.setup_failed() ? OutcomeKind::kSetupError : OutcomeKind::kStartError;
    o.exit_code = agent.exit_code();
    o.root_cause = agent.end_message();
    return o;
  }
  if (failures.empty()) {
    o.exit_code = agent.exit_code();
    o.kind = o.exit_code == 0 ? OutcomeKind::kSuccess : OutcomeKind::kWorkerFailure;
    if (o.exit_code != 0) o.root_cause = agent.end_message();
    return o;
  }
  o.kind = OutcomeKind::kWorkerFailure;
  o.exit_code = JobExitCode(failures);
  if (auto root = ChooseRootCause(failures)) {
    o.root_cause = DescribeFailure(failures[*root]);
    o.root_cause_rank = failures[*root].global_rank;
    if (!failures[*root].hang.empty()) o.kind = OutcomeKind::kHung;  // 124 is ctrun's verdict
  } else {
    o.root_cause = "every failed worker was stopped by ctrun";
  }
  return o;
}

}  // namespace ctrun
