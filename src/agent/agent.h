// Agent: the single-node elastic agent's state machine (architecture-sketch.md "Agent states").
//
//   Idle -> Running -> Stopping -> { Running (restart) | Done }
//
// It owns no fds and never blocks: the real wiring (agent/runner.cc) feeds it reaped children
// (OnChildExit) and signals (OnSignal) from the event loop; timers come from a TimerQueue; processes
// are started and signalled through a Spawner; output/store/log-dir work goes through AgentHooks.
// So the whole policy (who failed first, SIGTERM -> grace -> SIGKILL -> bounded final wait,
// restart counting, exit code) is tested with fakes, without forking.
//
// Stopping a group means: signal every worker process group of the attempt that still has a
// member (leader or any descendant), arm the grace timer, SIGKILL what is left when it fires, then
// wait at most kFinalWait more; a process that survives SIGKILL (D-state) is reported, never
// waited on forever.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "agent/worker_env.h"
#include "base/status.h"
#include "config/launch_config.h"
#include "process/exit_status.h"
#include "process/spawner.h"
#include "sys/event_loop.h"

namespace ctrun {

class AgentHooks {
 public:
  virtual ~AgentHooks() = default;
  // Before each attempt's workers start: fills master address/port, store mode, error files,
  // extra env. An error ends the run (no restart).
  virtual Status PrepareAttempt(int attempt, AttemptInfo* info) = 0;
  // Decides fd 1/2 of a worker (pipes for the relay, files, or the console).
  virtual void ConfigureStdio(int /*local_rank*/, const RankInfo& /*rank*/, int /*attempt*/, SpawnSpec* /*spec*/) {}
  // A worker started: take its pidfd and pipes (wire them into the loop / relay / watchdog).
  virtual void OnWorkerStarted(int /*local_rank*/, const RankInfo& /*rank*/, SpawnedProcess& /*proc*/) {}
  // A worker's leader was reaped (its output may still be in flight: drain it now).
  virtual void OnWorkerExited(int /*local_rank*/, pid_t /*pid*/) {}
  // No process is left in this worker's process group.
  virtual void OnGroupGone(pid_t /*pgid*/) {}
  // Last lines of a worker's stderr, for the failure summary.
  virtual std::string StderrTail(int /*local_rank*/) { return ""; }
  // Info/warning lines for the user (the real hooks log them through spdlog).
  virtual void Log(int /*level: 0 info, 1 warn, 2 error*/, const std::string& /*msg*/) {}
};

// One worker that ended badly in the final attempt (or was stopped by ctrun).
struct FailureRecord {
  int local_rank = 0;
  RankInfo rank;
  pid_t pid = -1;
  ExitStatus status = ExitStatus::Exited(0);
  std::chrono::system_clock::time_point time;
  std::string error_file;
  bool stopped_by_ctrun = false;
};

enum class AgentState { kIdle, kRunning, kStopping, kDone };

class Agent {
 public:
  // Bound on the wait after SIGKILL before a survivor is reported as unkillable.
  static constexpr std::chrono::seconds kFinalWait{5};

  Agent(const LaunchConfig& config, std::vector<std::string> base_env, std::string python_exec,
        Spawner& spawner, TimerQueue& timers, AgentHooks& hooks);

  void Start();
  // Any reaped child: a worker leader, a reparented descendant, or something unknown.
  void OnChildExit(pid_t pid, ExitStatus status);
  // A signal delivered to the agent (from the signalfd).
  void OnSignal(int sig);

  AgentState state() const { return state_; }
  bool done() const { return state_ == AgentState::kDone; }
  // Valid when done(): 0, the root cause's shell code, 128+signal, 126/127, or 1.
  int exit_code() const { return exit_code_; }
  int restart_count() const { return restart_count_; }
  // Failures of the last attempt, in detection order (own failures first, then ctrun-stopped).
  const std::vector<FailureRecord>& failures() const { return failures_; }
  // The signal that ended the run (a terminating signal ctrun received), or 0.
  int ended_by_signal() const { return done() && stop_reason_ == StopReason::kSignal ? stop_signal_ : 0; }
  // Set when the run ended for a reason other than worker failures (exec error, signal, ...).
  const std::string& end_message() const { return end_message_; }
  // Pids that survived SIGKILL past kFinalWait (D-state), reported at the end.
  const std::vector<pid_t>& unkillable() const { return unkillable_; }
  std::vector<pid_t> live_worker_pids() const;

 private:
  enum class StopReason { kFailure, kSignal, kSuccess, kStartError };
  struct Worker {
    RankInfo rank;
    pid_t pid = -1;
    bool exited = false;
    bool group_gone = false;
    ExitStatus status = ExitStatus::Exited(0);
    std::string error_file;
  };

  void StartAttempt();
  void BeginStopping(StopReason reason, int sig);
  void OnGraceExpired();
  void OnFinalWaitExpired();
  void CheckStopped();
  void RefreshGroups();
  void FinishAttempt();
  void Finish(int code);
  void RecordFailure(const Worker& w, bool stopped_by_ctrun);
  bool DiedOfOurSignal(const ExitStatus& status) const;
  Worker* FindWorker(pid_t pid);
  void CancelTimers();

  const LaunchConfig config_;
  const std::vector<std::string> base_env_;
  const std::string python_exec_;
  Spawner& spawner_;
  TimerQueue& timers_;
  AgentHooks& hooks_;

  AgentState state_ = AgentState::kIdle;
  StopReason stop_reason_ = StopReason::kFailure;
  int stop_signal_ = SIGTERM;
  int restart_count_ = 0;
  int exit_code_ = 0;
  int start_error_code_ = 0;
  std::vector<Worker> workers_;
  std::vector<FailureRecord> failures_;
  std::vector<pid_t> unkillable_;
  std::string end_message_;
  std::optional<TimerQueue::TimerId> grace_timer_;
  std::optional<TimerQueue::TimerId> final_timer_;
  bool killed_ = false;  // SIGKILL already sent in this stop
};

}  // namespace ctrun
