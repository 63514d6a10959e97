#include "agent/agent.h"

#include <algorithm>
#include <csignal>

namespace ctrun {

Agent::Agent(const LaunchConfig& config, Environment base_env, std::string executable, Spawner& spawner,
             TimerQueue& timers, AgentHooks& hooks)
    : config_(config),
      base_env_(std::move(base_env)),
      executable_(std::move(executable)),
      spawner_(spawner),
      timers_(timers),
      hooks_(hooks) {}

void Agent::AttachRendezvous(rdzv::Rendezvous* rendezvous) {
  rdzv_ = rendezvous;
  rdzv_->SetListener(this);
}

void Agent::Start() {
  restart_count_ = 0;
  if (rdzv_) {
    JoinRendezvous();
    return;
  }
  StartAttempt();
}

void Agent::JoinRendezvous() {
  state_ = AgentState::kRendezvous;
  rdzv::NodeDesc self;
  self.nproc = config_.nproc_per_node;
  self.declared_rank = config_.rdzv.backend == "static" ? config_.node_rank : -1;
  if (Status s = hooks_.PrepareJoin(&self); !s.ok()) {
    end_message_ = s.message();
    hooks_.Log(2, s.message());
    rdzv_->Leave();
    Finish(1);
    return;
  }
  rdzv_->Join(std::move(self));
}

void Agent::OnRoundReady(const rdzv::RoundInfo& round) {
  if (state_ != AgentState::kRendezvous) return;
  round_ = round;
  restart_count_ = round.restart_count;
  std::string nodes;
  for (const auto& n : round.nodes) nodes += (nodes.empty() ? "" : ", ") + n.host;
  hooks_.Log(0, "rendezvous round " + std::to_string(round.round) + " complete: node rank " +
                    std::to_string(round.node_rank) + " of " + std::to_string(round.num_nodes) + " (" + nodes +
                    "), world size " + std::to_string(round.world_size));
  hooks_.OnRound(round);
  StartAttempt();
}

void Agent::OnRoundStopping(const std::string& why) {
  switch (state_) {
    case AgentState::kRunning:
      hooks_.Log(1, "stopping the workers: " + why);
      BeginStopping(StopReason::kRemote, SIGTERM);
      return;
    case AgentState::kRendezvous:
      JoinRendezvous();  // our workers had already finished: join the next round at once
      return;
    default:
      return;  // already stopping: the rendezvous is joined again once the workers are gone
  }
}

void Agent::OnJobEnd(const rdzv::JobEnd& end) {
  job_end_ = end;
  if (end.rendezvous_error) hooks_.Log(2, end.message);
  switch (state_) {
    case AgentState::kRunning:
      BeginStopping(StopReason::kRemote, SIGTERM);
      return;
    case AgentState::kStopping:
      return;  // FinishAttempt ends the run with job_end_
    case AgentState::kDone:
      return;
    default:
      Finish(end.exit_code);
  }
}

void Agent::FillRank(int i, RankInfo* r) const {
  const int n = config_.nproc_per_node;
  r->local_rank = i;
  r->local_world_size = n;
  if (round_) {
    r->global_rank = round_->base_rank + i;
    r->group_rank = round_->node_rank;
    r->group_world_size = round_->num_nodes;
    r->world_size = round_->world_size;
  } else {
    // Single node: group 0 of 1; ranks are contiguous and equal to local ranks.
    r->global_rank = config_.node_rank * n + i;
    r->group_rank = config_.node_rank;
    r->group_world_size = config_.max_nodes;
    r->world_size = config_.max_nodes * n;
  }
  // One role per job: role ranks are the global ranks.
  r->role_rank = r->global_rank;
  r->role_world_size = r->world_size;
}

void Agent::StartAttempt() {
  failures_.clear();
  workers_.clear();
  killed_ = false;
  const int n = config_.nproc_per_node;
  AttemptInfo info;
  info.restart_count = restart_count_;
  // attempt_<n> log dirs: single node counts restarts; multi-node counts every round this node ran
  // (a membership change starts a round without counting a restart).
  const int attempt = rdzv_ ? attempts_started_++ : restart_count_;
  if (Status s = hooks_.PrepareAttempt(attempt, &info); !s.ok()) {
    end_message_ = s.message();
    hooks_.Log(2, s.message());
    if (rdzv_) rdzv_->Leave();
    Finish(1);
    return;
  }
  state_ = AgentState::kRunning;
  hooks_.Log(0, "starting " + std::to_string(n) + (n == 1 ? " worker" : " workers") + " (attempt " +
                    std::to_string(restart_count_) + ", max_restarts=" + std::to_string(config_.max_restarts) +
                    ", MASTER_ADDR=" + info.master_addr + ", MASTER_PORT=" + std::to_string(info.master_port) + ")");
  // Everything is prepared before anything is started; then all workers are started together.
  std::vector<Worker> planned(static_cast<size_t>(n));
  std::vector<SpawnSpec> specs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    Worker& w = planned[static_cast<size_t>(i)];
    FillRank(i, &w.rank);
    w.error_file = static_cast<size_t>(i) < info.error_files.size() ? info.error_files[i] : "";
    SpawnSpec& spec = specs[static_cast<size_t>(i)];
    spec.executable = executable_;
    spec.argv = BuildWorkerArgv(config_, executable_, w.rank, info);
    spec.env = BuildWorkerEnv(config_, base_env_, w.rank, info).Entries();
    hooks_.ConfigureStdio(i, w.rank, restart_count_, &spec);
  }
  std::vector<SpawnResult> results;
  spawner_.SpawnMany(specs, &results);
  const SpawnError* first_error = nullptr;
  for (int i = 0; i < n; ++i) {
    SpawnResult& r = results[static_cast<size_t>(i)];
    if (!r.ok) {
      if (!first_error) first_error = &r.error;
      continue;
    }
    Worker w = planned[static_cast<size_t>(i)];
    w.pid = r.process.pid;
    if (!r.process.exec_confirmed)
      hooks_.Log(1, "worker local_rank " + std::to_string(i) + " (pid " + std::to_string(w.pid) + "): exec of " +
                        specs[static_cast<size_t>(i)].argv[0] +
                        " has not finished (a hung file system?); it is watched as a started worker");
    workers_.push_back(w);
    hooks_.OnWorkerStarted(i, w.rank, r.process);
  }
  if (first_error) {
    // No restart loop on a missing or non-executable entrypoint: the next try would fail alike.
    // The workers that did start are killed; they are not failures of their own.
    end_message_ = first_error->message;
    start_error_code_ = first_error->shell_code;
    hooks_.Log(2, first_error->message);
    if (rdzv_) {
      rdzv::Cause c;
      c.what = first_error->message;
      c.exit_code = first_error->shell_code;
      c.fatal = true;
      rdzv_->ReportFailure(c);
    }
    BeginStopping(StopReason::kStartError, SIGKILL);
  }
}

Agent::Worker* Agent::FindWorker(pid_t pid) {
  for (auto& w : workers_)
    if (w.pid == pid) return &w;
  return nullptr;
}

std::vector<pid_t> Agent::live_worker_pids() const {
  std::vector<pid_t> out;
  for (const auto& w : workers_)
    if (!w.exited) out.push_back(w.pid);
  return out;
}

bool Agent::DiedOfOurSignal(const ExitStatus& status) const {
  const int sig = status.signaled() ? status.signal() : (status.exit_code() > 128 ? status.exit_code() - 128 : 0);
  return sig == SIGKILL || sig == SIGTERM || sig == stop_signal_;
}

void Agent::RecordFailure(const Worker& w, bool stopped_by_ctrun) {
  FailureRecord f;
  f.local_rank = w.rank.local_rank;
  f.rank = w.rank;
  f.pid = w.pid;
  f.status = w.status;
  f.time = std::chrono::system_clock::now();
  f.error_file = w.error_file;
  f.stopped_by_ctrun = stopped_by_ctrun;
  failures_.push_back(std::move(f));
}

void Agent::OnChildExit(pid_t pid, ExitStatus status) {
  Worker* w = FindWorker(pid);
  if (w && !w->exited) {
    w->exited = true;
    w->status = status;
    hooks_.OnWorkerExited(w->rank.local_rank, pid);
    if (state_ == AgentState::kRunning) {
      if (!status.success()) {
        hooks_.Log(2, "first exit: worker rank " + std::to_string(w->rank.global_rank) + " (local_rank " +
                          std::to_string(w->rank.local_rank) + ", pid " + std::to_string(pid) + ") " +
                          status.ToString() + "; stopping the other workers (the root cause is named once "
                          "they are gone)");
        RecordFailure(*w, /*stopped_by_ctrun=*/false);
        if (rdzv_) {
          rdzv::Cause c;
          c.rank = w->rank.global_rank;
          c.local_rank = w->rank.local_rank;
          c.what = status.ToString();
          c.exit_code = status.ShellCode();
          rdzv_->ReportFailure(c);
        }
        BeginStopping(StopReason::kFailure, SIGTERM);
        return;
      }
      if (std::all_of(workers_.begin(), workers_.end(), [](const Worker& x) { return x.exited; })) {
        // All leaders succeeded. Anything they left behind in their groups is swept, not waited on.
        BeginStopping(StopReason::kSuccess, SIGTERM);
        return;
      }
    } else if (state_ == AgentState::kStopping && stop_reason_ != StopReason::kStartError && !status.success()) {
      // During teardown a worker that died of the signal ctrun sent (or a shell's 128+signal
      // for it) was stopped by ctrun. Any other failure (its own exception, exit 1 from a
      // broken collective, SIGABRT) happened on its own, possibly before our signal arrived:
      // it stays a root-cause candidate, ordered by its error-file time (see run_summary.h).
      // When the user stopped the job (a signal to ctrun), whatever the workers do in reaction
      // (Python's KeyboardInterrupt exits 1) is a consequence of that signal too.
      RecordFailure(*w, /*stopped_by_ctrun=*/stop_reason_ == StopReason::kSignal || DiedOfOurSignal(status));
    }
  }
  if (state_ == AgentState::kStopping) CheckStopped();
}

void Agent::OnSignal(int sig) {
  if (state_ == AgentState::kDone || state_ == AgentState::kIdle) return;
  const bool forward_only = std::find(config_.forward_only_signals.begin(), config_.forward_only_signals.end(),
                                      sig) != config_.forward_only_signals.end();
  if (!forward_only && rdzv_) {
    // Leave without closing the job: the other nodes go on without this one if enough remain.
    rdzv_->Leave();
    if (state_ == AgentState::kRendezvous) {
      hooks_.Log(1, "received " + SignalName(sig) + " while waiting for the rendezvous: leaving");
      stop_reason_ = StopReason::kSignal;
      stop_signal_ = sig;
      Finish(128 + sig);
      return;
    }
  }
  if (forward_only) {
    hooks_.Log(0, "forwarding " + SignalName(sig) + " to the workers");
    for (const auto& w : workers_)
      if (!w.group_gone) spawner_.SignalGroup(w.pid, sig);
    return;
  }
  if (state_ == AgentState::kStopping && stop_reason_ == StopReason::kSignal) {
    // Second terminating signal: the user insists. Skip the rest of the grace period.
    hooks_.Log(1, "received " + SignalName(sig) + " again: killing the workers now");
    OnGraceExpired();
    return;
  }
  hooks_.Log(1, "received " + SignalName(sig) + ": forwarding it to the workers, then SIGKILL after " +
                    std::to_string(config_.shutdown_timeout) + " s");
  if (state_ == AgentState::kStopping) {
    // Already tearing down after a failure: this turns the restart into an exit, and the signal
    // still reaches the workers that are left.
    stop_reason_ = StopReason::kSignal;
    stop_signal_ = sig;
    for (const auto& w : workers_)
      if (!w.group_gone) spawner_.SignalGroup(w.pid, sig);
    return;
  }
  BeginStopping(StopReason::kSignal, sig);
}

void Agent::BeginStopping(StopReason reason, int sig) {
  state_ = AgentState::kStopping;
  stop_reason_ = reason;
  stop_signal_ = sig;
  killed_ = sig == SIGKILL;
  RefreshGroups();
  for (const auto& w : workers_)
    if (!w.group_gone) spawner_.SignalGroup(w.pid, sig);
  CancelTimers();
  if (killed_) {
    final_timer_ = timers_.AddTimerAfter(kFinalWait, [this] {
      final_timer_.reset();
      OnFinalWaitExpired();
    });
  } else {
    grace_timer_ = timers_.AddTimerAfter(Seconds(config_.shutdown_timeout), [this] {
      grace_timer_.reset();
      OnGraceExpired();
    });
  }
  CheckStopped();
}

void Agent::OnGraceExpired() {
  if (state_ != AgentState::kStopping) return;
  CancelTimers();
  RefreshGroups();
  int n = 0;
  for (const auto& w : workers_) {
    if (w.group_gone) continue;
    spawner_.SignalGroup(w.pid, SIGKILL);
    ++n;
  }
  if (n > 0 && !killed_)
    hooks_.Log(1, "grace period over: sent SIGKILL to " + std::to_string(n) + " worker process group(s)");
  killed_ = true;
  final_timer_ = timers_.AddTimerAfter(kFinalWait, [this] {
    final_timer_.reset();
    OnFinalWaitExpired();
  });
  CheckStopped();
}

void Agent::OnFinalWaitExpired() {
  if (state_ != AgentState::kStopping) return;
  for (auto& w : workers_) {
    if (!w.exited) unkillable_.push_back(w.pid);
    if (!w.group_gone) {
      hooks_.Log(2, "worker process group " + std::to_string(w.pid) +
                        " survived SIGKILL (a process stuck in the kernel, D state?); giving up on it");
      w.group_gone = true;
      w.exited = true;
    }
  }
  FinishAttempt();
}

void Agent::RefreshGroups() {
  for (auto& w : workers_) {
    if (w.group_gone) continue;
    if (w.exited && !spawner_.GroupAlive(w.pid)) {
      w.group_gone = true;
      hooks_.OnGroupGone(w.pid);
    }
  }
}

void Agent::CheckStopped() {
  // Cheap test first: while a leader is running the attempt cannot be over, and probing every
  // group (a killpg per worker) on every reaped child would cost O(n^2) syscalls in a teardown.
  for (const auto& w : workers_)
    if (!w.exited) return;
  RefreshGroups();
  for (const auto& w : workers_)
    if (!w.group_gone) return;
  FinishAttempt();
}

void Agent::CancelTimers() {
  if (grace_timer_) timers_.CancelTimer(*grace_timer_);
  if (final_timer_) timers_.CancelTimer(*final_timer_);
  grace_timer_.reset();
  final_timer_.reset();
}

void Agent::FinishAttempt() {
  CancelTimers();
  if (rdzv_) {
    FinishMultiNodeAttempt();
    return;
  }
  switch (stop_reason_) {
    case StopReason::kSuccess:
      Finish(0);
      return;
    case StopReason::kSignal:
      Finish(128 + stop_signal_);
      return;
    case StopReason::kStartError:
      Finish(start_error_code_);
      return;
    case StopReason::kRemote:  // only with a rendezvous
    case StopReason::kFailure:
      hooks_.OnAttemptFailed(restart_count_, failures_);
      if (restart_count_ < config_.max_restarts) {
        ++restart_count_;
        hooks_.Log(1, "restarting all workers (restart " + std::to_string(restart_count_) + " of " +
                          std::to_string(config_.max_restarts) + ")");
        StartAttempt();
        return;
      }
      if (config_.max_restarts > 0) hooks_.Log(2, "no restarts left (max_restarts=" + std::to_string(config_.max_restarts) + ")");
      {
        int code = 1;
        for (const auto& f : failures_)
          if (!f.stopped_by_ctrun) {
            code = f.status.ShellCode();
            break;
          }
        Finish(code == 0 ? 1 : code);
      }
      return;
  }
}

// Every worker of the round is gone. The rendezvous decides what comes next: a signal ends this
// agent; an agreed outcome (or a rendezvous error) that arrived meanwhile ends it with that code;
// success waits in the exit barrier; anything else joins the next round.
void Agent::FinishMultiNodeAttempt() {
  if (stop_reason_ == StopReason::kSignal) {
    Finish(128 + stop_signal_);
    return;
  }
  if (job_end_) {
    Finish(job_end_->exit_code);
    return;
  }
  if (stop_reason_ == StopReason::kSuccess) {
    state_ = AgentState::kRendezvous;
    hooks_.Log(0, "all workers on this node succeeded; waiting for the other nodes");
    rdzv_->ReportSucceeded();
    return;
  }
  JoinRendezvous();
}

void Agent::Finish(int code) {
  CancelTimers();
  exit_code_ = code;
  state_ = AgentState::kDone;
}

}  // namespace ctrun
