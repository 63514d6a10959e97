#include "report/summary_file.h"

#include "report/error_file.h"
#include "report/events.h"

namespace ctrun {
namespace {

template <typename Json>
void AddExitStatus(const ExitStatus& status, Json* out) {
  Json& j = *out;
  if (status.signaled()) {
    j["exit_code"] = nullptr;
    j["signal"] = status.signal();
    j["signal_name"] = SignalName(status.signal());
  } else {
    j["exit_code"] = status.exit_code();
    j["signal"] = nullptr;
    j["signal_name"] = nullptr;
  }
  j["core_dumped"] = status.core_dumped();
}

template <typename T>
nlohmann::ordered_json OrNull(const std::optional<T>& v) {
  return v ? nlohmann::ordered_json(*v) : nlohmann::ordered_json(nullptr);
}

nlohmann::ordered_json RankJson(const RankOutcome& r) {
  nlohmann::ordered_json j;
  j["rank"] = r.global_rank;
  j["local_rank"] = r.local_rank;
  j["pid"] = r.pid;
  j["state"] = r.state;
  if (r.status) {
    AddExitStatus(*r.status, &j);
  } else {
    j["exit_code"] = nullptr;
    j["signal"] = nullptr;
    j["signal_name"] = nullptr;
    j["core_dumped"] = false;
  }
  j["duration_s"] = r.duration_s;
  return j;
}

}  // namespace

const char* OutcomeKindName(OutcomeKind kind) {
  switch (kind) {
    case OutcomeKind::kSuccess: return "success";
    case OutcomeKind::kWorkerFailure: return "worker_failure";
    case OutcomeKind::kStartError: return "start_error";
    case OutcomeKind::kSignal: return "signal";
    case OutcomeKind::kMaxRunTime: return "max_run_time";
    case OutcomeKind::kHung: return "hung";
    case OutcomeKind::kUsageError: return "usage_error";
    case OutcomeKind::kSetupError: return "setup_error";
    case OutcomeKind::kRendezvousError: return "rendezvous_error";
    case OutcomeKind::kDryRun: return "dry_run";
  }
  return "unknown";
}

void AddExitStatusFields(const ExitStatus& status, nlohmann::ordered_json* out) { AddExitStatus(status, out); }
void AddExitStatusFields(const ExitStatus& status, nlohmann::json* out) { AddExitStatus(status, out); }

nlohmann::ordered_json SummaryJson(const RunOutcome& o, const RunIdentity& id) {
  nlohmann::ordered_json j;
  j["schema"] = kSummarySchema;
  j["ctrun_version"] = id.version;
  j["run_id"] = id.run_id;
  j["hostname"] = id.hostname;
  j["node_rank"] = o.node_rank.value_or(id.node_rank);
  j["outcome"] = OutcomeKindName(o.kind);
  j["exit_code"] = o.exit_code;
  // Whose code ctrun exits with: a worker's (its own code or 128+signal) or ctrun's own.
  j["exit_code_from"] = o.kind == OutcomeKind::kWorkerFailure ? "worker" : "ctrun";
  j["root_cause"] = o.root_cause.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(o.root_cause);
  j["root_cause_rank"] = OrNull(o.root_cause_rank);
  j["attempts"] = o.attempts;
  j["restarts"] = o.restarts;
  j["start"] = FormatWallTime(o.start);
  j["end"] = FormatWallTime(o.end);
  j["duration_s"] = std::chrono::duration<double>(o.end - o.start).count();
  j["log_dir"] = o.log_dir.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(o.log_dir);
  j["running_at_deadline"] = o.running_at_deadline;
  j["ranks"] = nlohmann::ordered_json::array();
  for (const RankOutcome& r : o.ranks) j["ranks"].push_back(RankJson(r));
  return j;
}

Status WriteSummaryFile(const std::string& path, const RunOutcome& outcome, const RunIdentity& identity) {
  const std::string text =
      SummaryJson(outcome, identity).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (Status s = WriteFileAtomically(path, text); !s.ok())
    return Status::Error("cannot write the summary file " + path + ": " + s.message());
  return Status::Ok();
}

}  // namespace ctrun
