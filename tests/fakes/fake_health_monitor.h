// FakeHealthMonitor: a health::Monitor whose hangs, steps and stack captures the test decides.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "health/monitor.h"

namespace ctrun::testing {

class FakeHealthMonitor final : public health::Monitor {
 public:
  void SetOnHang(OnHang on_hang) override { on_hang_ = std::move(on_hang); }
  void PrepareWorker(int attempt, int local_rank, SpawnSpec* spec) override {
    prepared.push_back({attempt, local_rank});
    spec->env.push_back("CTRUN_HEARTBEAT_FD=3");
    spec->env.push_back("CTRUN_HEARTBEAT_ID=0:0");  // as the real monitor, with a placeholder identity
  }
  void AttemptStarted(int nranks, bool judge) override {
    ++attempts;
    watching = judge;
    started_ranks = nranks;
    max_step = next_attempt_steps.empty() ? std::nullopt : next_attempt_steps.front();
    if (!next_attempt_steps.empty()) next_attempt_steps.erase(next_attempt_steps.begin());
  }
  void WorkerExited(int local_rank) override { exited.push_back(local_rank); }
  void StopWatching() override { watching = false; }
  void Resumed(Duration suspended_for) override { resumed.push_back(suspended_for); }
  health::AttemptBeats AttemptProgress() override { return {max_step, max_step.has_value() || beat_without_step}; }
  void CaptureStacks(int local_rank, pid_t pgid, OnStacks done) override {
    captures.push_back({local_rank, pgid});
    pending_captures.push_back(std::move(done));
  }

  health::MainThreadWait MainThreadOf(int local_rank, pid_t) override {
    auto it = main_threads.find(local_rank);
    return it == main_threads.end() ? health::MainThreadWait::kUnknown : it->second;
  }

  // Test controls.
  void Hang(int local_rank, const std::string& why, const std::vector<int>& also_silent = {}) {
    on_hang_(local_rank, why, also_silent);
  }
  // Ends the oldest capture still running.
  void FinishCapture(const std::string& summary, bool complete = true) {
    auto done = std::move(pending_captures.front());
    pending_captures.erase(pending_captures.begin());
    done(health::StackSummary{summary, complete});
  }

  struct Prepared {
    int attempt;
    int local_rank;
  };
  struct Capture {
    int local_rank;
    pid_t pgid;
  };
  std::vector<Prepared> prepared;
  std::vector<int> exited;
  std::vector<Capture> captures;
  std::vector<OnStacks> pending_captures;
  std::map<int, health::MainThreadWait> main_threads;  // by local rank; kUnknown when absent
  int attempts = 0;
  int started_ranks = 0;
  bool watching = false;
  std::vector<Duration> resumed;  // Resumed calls, in order
  std::optional<uint64_t> max_step;
  bool beat_without_step = false;  // AttemptProgress: beats came, none with a comparable step
  std::vector<std::optional<uint64_t>> next_attempt_steps;  // max step of each coming attempt

 private:
  OnHang on_hang_;
};

}  // namespace ctrun::testing
