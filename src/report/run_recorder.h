// RunRecorder: an EventSink that keeps what the summary needs from the run's own events (attempts,
// restarts, each worker of the last attempt with its pid, ending and duration, the ranks still
// running at the deadline). The summary file is thus built from the same stream as the events
// file, so the two cannot disagree.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <vector>

#include "report/events.h"
#include "report/run_outcome.h"

namespace ctrun {

class RunRecorder final : public EventSink {
 public:
  using Clock = std::chrono::steady_clock;
  void Emit(std::string_view event, const nlohmann::json& fields) override;
  // Sets out's attempts, restarts, ranks, running_at_deadline and (multi-node) node_rank; a
  // worker never reaped counts
  // as running until `end`.
  void Fill(RunOutcome* out, Clock::time_point end = Clock::now()) const;

 private:
  struct Worker {
    RankOutcome outcome;
    Clock::time_point started;
    std::optional<Clock::time_point> ended;
  };
  int attempts_ = 0;
  int restarts_ = 0;
  std::optional<int> node_rank_;  // from the last rendezvous round
  std::map<int, Worker> workers_;  // by global rank, the last attempt only
  std::vector<int> running_at_deadline_;
};

}  // namespace ctrun
