// Agent: the elastic agent's state machine.
//
//   single node:  Idle -> Running -> Stopping -> { Running (restart) | Done }
//   multi-node:   Idle -> Rendezvous -> Running -> Stopping -> { Rendezvous | Done }
//
// With a Rendezvous attached (AttachRendezvous) the agent never decides a restart or the exit
// code itself: it reports its workers' failure or success to the rendezvous, stops its workers
// when the rendezvous says a round is over (a failure on any node, a node joining or lost), joins
// the next round once they are gone, and ends with the outcome every agent agreed on
// (RendezvousListener::OnJobEnd). Without one it is the single-node agent it always was.
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
#include <csignal>
#include <optional>
#include <string>
#include <vector>

#include "agent/worker_env.h"
#include "base/status.h"
#include "config/launch_config.h"
#include "process/exit_status.h"
#include "process/spawner.h"
#include "rendezvous/rendezvous.h"
#include "sys/event_loop.h"

namespace ctrun {

struct FailureRecord;

class AgentHooks {
 public:
  virtual ~AgentHooks() = default;
  // Before each attempt's workers start: fills master address/port, store mode and error files.
  // An error ends the run (no restart).
  virtual Status PrepareAttempt(int attempt, AttemptInfo* info) = 0;
  // Multi-node, before each Join: fills this node's address and the port of its workers' store
  // for the coming round (it serves it if it becomes node rank 0). An error ends the run.
  virtual Status PrepareJoin(rdzv::NodeDesc* /*self*/) { return Status::Ok(); }
  // Multi-node, when a round is complete, before PrepareAttempt of its workers.
  virtual void OnRound(const rdzv::RoundInfo& /*round*/) {}
  // Decides fd 1/2 of a worker (pipes for the relay, files, or the console).
  virtual void ConfigureStdio(int /*local_rank*/, const RankInfo& /*rank*/, int /*attempt*/, SpawnSpec* /*spec*/) {}
  // A worker started: take its pidfd and pipes (wire them into the loop / relay / watchdog).
  virtual void OnWorkerStarted(int /*local_rank*/, const RankInfo& /*rank*/, SpawnedProcess& /*proc*/) {}
  // A worker's leader was reaped (its output may still be in flight: drain it now).
  virtual void OnWorkerExited(int /*local_rank*/, pid_t /*pid*/) {}
  // No process is left in this worker's process group.
  virtual void OnGroupGone(pid_t /*pgid*/) {}
  // An attempt failed and all its workers are gone (before the restart or the end): name the root
  // cause. The real hooks order the failures by their error files' times, as the summary does;
  // the order of exits cannot tell the rank that crashed from one that died of a closed connection.
  virtual void OnAttemptFailed(int /*restart_count*/, const std::vector<FailureRecord>& /*failures*/) {}
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

enum class AgentState { kIdle, kRendezvous, kRunning, kStopping, kDone };

class Agent final : public rdzv::RendezvousListener {
 public:
  // Bound on the wait after SIGKILL before a survivor is reported as unkillable.
  static constexpr std::chrono::seconds kFinalWait{5};

  // base_env: the agent's environment, read once; executable: the file every worker execs
  // (ResolveEntrypoint in agent/launch_checks.h: the interpreter for .py / -m).
  Agent(const LaunchConfig& config, Environment base_env, std::string executable, Spawner& spawner,
        TimerQueue& timers, AgentHooks& hooks);

  // Multi-node: the rendezvous that decides rounds, restarts and the outcome (before Start()).
  void AttachRendezvous(rdzv::Rendezvous* rendezvous);
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
  // Multi-node: how the job ended (set when done() after an agreed outcome or a rendezvous error).
  const std::optional<rdzv::JobEnd>& job_end() const { return job_end_; }
  bool multi_node() const { return rdzv_ != nullptr; }

  // rdzv::RendezvousListener
  void OnRoundReady(const rdzv::RoundInfo& round) override;
  void OnRoundStopping(const std::string& why) override;
  void OnJobEnd(const rdzv::JobEnd& end) override;
  void OnRendezvousLog(int level, const std::string& msg) override { hooks_.Log(level, msg); }

 private:
  // kRemote: the rendezvous ended the round (another node failed, membership changed, job over).
  enum class StopReason { kFailure, kSignal, kSuccess, kStartError, kRemote };
  struct Worker {
    RankInfo rank;
    pid_t pid = -1;
    bool exited = false;
    bool group_gone = false;
    ExitStatus status = ExitStatus::Exited(0);
    std::string error_file;
  };

  void StartAttempt();
  void JoinRendezvous();
  void FinishMultiNodeAttempt();
  void FillRank(int local_rank, RankInfo* rank) const;
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
  const Environment base_env_;
  const std::string executable_;
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
  rdzv::Rendezvous* rdzv_ = nullptr;
  std::optional<rdzv::RoundInfo> round_;  // multi-node: the round being run
  int attempts_started_ = 0;              // multi-node: numbers attempt_<n> log dirs
  std::optional<rdzv::JobEnd> job_end_;
};

}  // namespace ctrun
