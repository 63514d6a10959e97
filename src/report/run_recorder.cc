#include "report/run_recorder.h"

namespace ctrun {
namespace {

int IntField(const nlohmann::json& j, const char* key, int fallback = 0) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<int>() : fallback;
}

}  // namespace

void RunRecorder::Emit(std::string_view event, const nlohmann::json& fields) {
  if (event == events::kAttemptStart) {
    ++attempts_;
    restarts_ = IntField(fields, "restart_count", restarts_);
    workers_.clear();
  } else if (event == events::kWorkerStart) {
    Worker w;
    w.outcome.global_rank = IntField(fields, "rank");
    w.outcome.local_rank = IntField(fields, "local_rank");
    w.outcome.pid = IntField(fields, "pid", -1);
    w.started = Clock::now();
    workers_[w.outcome.global_rank] = w;
  } else if (event == events::kWorkerExit) {
    auto it = workers_.find(IntField(fields, "rank", -1));
    if (it == workers_.end()) return;
    Worker& w = it->second;
    w.ended = Clock::now();
    auto cause = fields.find("cause");
    w.outcome.state = cause != fields.end() && cause->is_string() ? cause->get<std::string>() : "failed";
    const int sig = IntField(fields, "signal");
    auto core = fields.find("core_dumped");
    w.outcome.status = sig > 0 ? ExitStatus::Signaled(sig, core != fields.end() && core->is_boolean() && core->get<bool>())
                               : ExitStatus::Exited(IntField(fields, "exit_code"));
  } else if (event == events::kRendezvousRound) {
    node_rank_ = IntField(fields, "node_rank");
  } else if (event == events::kMaxRunTime) {
    auto it = fields.find("running_ranks");
    if (it != fields.end() && it->is_array()) running_at_deadline_ = it->get<std::vector<int>>();
  }
}

void RunRecorder::Fill(RunOutcome* out, Clock::time_point end) const {
  out->attempts = attempts_;
  out->restarts = restarts_;
  out->running_at_deadline = running_at_deadline_;
  if (node_rank_) out->node_rank = node_rank_;
  out->ranks.clear();
  for (const auto& [rank, w] : workers_) {
    RankOutcome r = w.outcome;
    r.duration_s = std::chrono::duration<double>(w.ended.value_or(end) - w.started).count();
    out->ranks.push_back(std::move(r));
  }
}

}  // namespace ctrun
