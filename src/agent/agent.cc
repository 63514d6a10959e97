#include "agent/agent.h"

#include <algorithm>
#include <csignal>
#include <cstdio>

#include "agent/rank_plan.h"
#include "report/run_outcome.h"
#include "report/summary_file.h"

#include "health/hang_watcher.h"
#include "placement/topology.h"  // FormatCpuList: "0, 2-4", for rank lists too
#include "report/run_summary.h"

namespace ctrun {
namespace {

// "1.5" for 1.5, "30" for 30.0: seconds as the user wrote them.
std::string FormatSecondsValue(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

// Whether the worker of `spec` writes to ctrun's own stdout or stderr, with no relay in between.
bool WritesToAgentConsole(const SpawnSpec& spec) {
  return spec.stdout_target.kind == StdioTarget::Kind::kInherit || spec.stderr_target.kind == StdioTarget::Kind::kInherit;
}

}  // namespace

Agent::Agent(const LaunchConfig& config, Environment base_env, std::string executable, Spawner& spawner,
             TimerQueue& timers, AgentHooks& hooks)
    : config_(config),
      base_env_(std::move(base_env)),
      executable_(std::move(executable)),
      spawner_(spawner),
      timers_(timers),
      hooks_(hooks),
      restart_policy_(health::RestartPolicyOptions{Seconds(config.restart_backoff), Seconds(config.restart_backoff_max),
                                                   config.heartbeat_timeout > 0, config.crash_loop_limit}) {}

void Agent::AttachRendezvous(rdzv::Rendezvous* rendezvous) {
  rdzv_ = rendezvous;
  rdzv_->SetListener(this);
}

void Agent::AttachHealth(health::Monitor* monitor) {
  health_ = monitor;
  health_->SetOnHang([this](int local_rank, const std::string& why, const std::vector<int>& also_silent) {
    OnRankHung(local_rank, why, also_silent);
  });
}

void Agent::Start() {
  restart_count_ = 0;
  if (config_.max_run_time)
    deadline_timer_ = timers_.AddTimerAfter(Seconds(*config_.max_run_time), [this] {
      deadline_timer_.reset();
      OnDeadline();
    });
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
  self.role = config_.role;
  if (Status s = hooks_.PrepareJoin(&self); !s.ok()) {
    setup_failed_ = true;
    end_message_ = s.message();
    hooks_.Log(2, s.message());
    rdzv_->Leave();
    Finish(1);
    return;
  }
  gpu_wait_.round_ready = false;  // a round completed before this join is over
  rdzv_->Join(std::move(self));
}

// Multi-node, the workers of an attempt are all gone: the join of the next round, with the wait
// for their processes to leave the GPUs beside it (started first, so no round can complete
// before it is pending). The round is not delayed: OnRoundReady holds the workers until it
// answers. A wait still pending from an earlier join of this attempt goes on (its bound is not
// restarted); one already answered Ok is not repeated.
void Agent::JoinNextRound() {
  if (!workers_.empty() && !gpu_wait_.pending && !gpu_wait_.released) WaitForGpuRelease();
  if (state_ == AgentState::kDone) return;  // it failed at once: this node has left
  JoinRendezvous();
}

void Agent::WaitForGpuRelease() {
  std::vector<pid_t> previous;
  for (const auto& w : workers_) previous.push_back(w.pid);
  const uint64_t id = ++gpu_wait_.id;
  gpu_wait_.pending = true;
  hooks_.BeforeRestart(previous, [this, id](Status s) { OnGpuWaitAnswered(id, std::move(s)); });
}

// Races: the answer may come before the round completes (OnRoundReady then starts the workers
// at once) or after (they start here, in the round that waited for it). A new round may complete
// while it is pending, after the one that waited stopped: that one's workers start on this
// answer instead. An answer after the run ended (Finish clears pending), or from an earlier wait
// (another id), starts nothing.
void Agent::OnGpuWaitAnswered(uint64_t id, Status s) {
  if (id != gpu_wait_.id || !gpu_wait_.pending) return;
  gpu_wait_.pending = false;
  if (!s.ok()) {
    LeaveForHeldGpus(s);
    return;
  }
  gpu_wait_.released = true;
  if (!gpu_wait_.round_ready || state_ != AgentState::kRendezvous) return;
  gpu_wait_.round_ready = false;
  StartAttempt();
}

// The previous attempt still holds GPUs past the wait's bound: workers started here now could
// fail at start-up (out of memory, NCCL). This node leaves the job, as a setup failure does (the
// others re-form without it if enough remain), and ends with exit 1.
void Agent::LeaveForHeldGpus(const Status& s) {
  setup_failed_ = true;
  end_message_ = s.message() + "; this node leaves the job";
  hooks_.Log(2, end_message_);
  rdzv_->Leave();
  Finish(1);
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
  events_->Emit(events::kRendezvousRound, {{"round", round.round},
                                           {"node_rank", round.node_rank},
                                           {"num_nodes", round.num_nodes},
                                           {"world_size", round.world_size},
                                           {"restart_count", round.restart_count},
                                           {"reason", round.reason}});
  hooks_.OnRound(round);  // at once: node rank 0 serves the round's store to the other nodes' workers
  if (gpu_wait_.pending) {  // OnGpuWaitAnswered starts the workers
    gpu_wait_.round_ready = true;
    hooks_.Log(0, "waiting for the previous attempt's processes to leave the GPUs before starting round " +
                      std::to_string(round.round) + "'s workers");
    return;
  }
  StartAttempt();
}

void Agent::OnRoundStopping(const std::string& why) {
  switch (state_) {
    case AgentState::kRunning:
      hooks_.Log(1, "stopping the workers: " + why);
      BeginStopping(StopReason::kRemote, SIGTERM);
      return;
    case AgentState::kRendezvous:
      // Our workers had already finished (the exit barrier), or the round stopped before they
      // started (its wait for the GPUs pending): join the next round at once.
      JoinNextRound();
      return;
    case AgentState::kStopping:
      round_stopped_ = true;  // the rendezvous is joined again once the workers are gone
      return;
    default:
      return;
  }
}

void Agent::OnJobEnd(const rdzv::JobEnd& end) {
  job_end_ = end;
  if (end.rendezvous_error) hooks_.Log(2, end.message);
  // A success that is not the plain one (a node left after the others had finished) says why.
  if (end.exit_code == 0 && end.message != rdzv::kEveryNodeSucceeded) hooks_.Log(1, "the job ended: " + end.message);
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

void Agent::FillRank(int i, RankInfo* r) const { *r = RankFor(config_, i, round_); }

// --debug-rank R in this attempt's world (on any node): the other ranks wait for R in their
// collectives, silent for as long as R sits at a breakpoint, so no rank is judged hung.
bool Agent::DebuggedRankInJob() const {
  if (!config_.debug_rank) return false;
  RankInfo r;
  FillRank(0, &r);
  return *config_.debug_rank < r.world_size;
}

void Agent::StartAttempt() {
  const int n = config_.nproc_per_node;
  // A late-exit notice armed in the exit barrier belonged to the round that ended.
  if (late_exit_timer_) timers_.CancelTimer(*late_exit_timer_);
  late_exit_timer_.reset();
  AttemptInfo info;
  info.restart_count = restart_count_;
  // attempt_<n> log dirs: single node counts restarts; multi-node names the rendezvous round, the
  // same on every node in it (a membership change starts a round without counting a restart; a
  // node that joins a running job starts at that round's number).
  const int attempt = rdzv_ ? static_cast<int>(round_->round) : restart_count_;
  if (Status s = hooks_.PrepareAttempt(attempt, &info); !s.ok()) {
    setup_failed_ = true;
    end_message_ = s.message();
    hooks_.Log(2, s.message());
    if (rdzv_) rdzv_->Leave();
    Finish(1);  // the previous attempt's failures stay: the summary names what called for this one
    return;
  }
  failures_.clear();
  workers_.clear();
  gpu_wait_.released = false;  // the next join waits for these workers' processes
  killed_ = false;
  round_stopped_ = false;
  state_ = AgentState::kRunning;
  attempt_ = attempt;
  events_->Emit(events::kAttemptStart, {{"attempt", attempt},
                                        {"restart_count", restart_count_},
                                        {"nproc", n},
                                        {"master_addr", info.master_addr},
                                        {"master_port", info.master_port}});
  // Multi-node, a membership change starts an attempt (attempt_<n>/) without counting a restart.
  const std::string restart = attempt == restart_count_ ? "" : ", restart " + std::to_string(restart_count_);
  const std::string starting = "starting " + std::to_string(n) + (n == 1 ? " worker" : " workers") + " (attempt " +
                               std::to_string(attempt) + restart + ", max_restarts=" +
                               std::to_string(config_.max_restarts) + ", MASTER_ADDR=" + info.master_addr +
                               ", MASTER_PORT=" + std::to_string(info.master_port) + ")";
  // Each worker is handed to the spawner as soon as its spec is ready: the first starts while the
  // next are prepared. The line above goes out while they start, unless a worker writes to
  // ctrun's own stdout or stderr (no relay in between), where it must come before their words.
  std::vector<Worker> planned(static_cast<size_t>(n));
  std::vector<SpawnSpec> specs(static_cast<size_t>(n));
  std::unique_ptr<SpawnBatch> batch = spawner_.BeginBatch();
  bool said_starting = false;
  for (int i = 0; i < n; ++i) {
    Worker& w = planned[static_cast<size_t>(i)];
    FillRank(i, &w.rank);
    w.error_file = static_cast<size_t>(i) < info.error_files.size() ? info.error_files[i] : "";
    SpawnSpec& spec = specs[static_cast<size_t>(i)];
    RankPlan plan = PlanRank(config_, base_env_, executable_, w.rank, info);
    spec.executable = executable_;
    spec.argv = std::move(plan.argv);
    spec.env = plan.env.Entries();
    hooks_.ConfigureStdio(i, w.rank, restart_count_, &spec);
    hooks_.ConfigureWorker(i, w.rank, restart_count_, &spec);
    if (health_) health_->PrepareWorker(attempt, i, &spec);
    if (!said_starting && WritesToAgentConsole(spec)) {
      hooks_.Log(0, starting);
      said_starting = true;
    }
    batch->Add(spec);
  }
  if (!said_starting) hooks_.Log(0, starting);
  std::vector<SpawnResult> results;
  batch->Finish(&results);
  batch.reset();
  unconfirmed_.clear();
  const SpawnError* first_error = nullptr;
  for (int i = 0; i < n; ++i) {
    SpawnResult& r = results[static_cast<size_t>(i)];
    if (!r.ok) {
      if (!first_error) first_error = &r.error;
      events_->Emit(events::kStartError, {{"rank", planned[static_cast<size_t>(i)].rank.global_rank},
                                          {"local_rank", i},
                                          {"attempt", attempt},
                                          {"message", r.error.message},
                                          {"exit_code", r.error.shell_code}});
      continue;
    }
    Worker w = planned[static_cast<size_t>(i)];
    w.pid = r.process.pid;
    events_->Emit(events::kWorkerStart,
                  {{"rank", w.rank.global_rank}, {"local_rank", i}, {"pid", w.pid}, {"attempt", attempt}});
    if (!r.process.exec_confirmed)
      hooks_.Log(1, "worker local_rank " + std::to_string(i) + " (pid " + std::to_string(w.pid) + "): exec of " +
                        specs[static_cast<size_t>(i)].argv[0] +
                        " has not finished (a hung file system?); it is watched as a started worker");
    if (r.process.unconfirmed) unconfirmed_.emplace(w.pid, std::move(*r.process.unconfirmed));
    workers_.push_back(w);
    hooks_.OnWorkerStarted(i, w.rank, r.process);
  }
  if (health_) health_->AttemptStarted(n, /*judge=*/!DebuggedRankInJob());
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

const Agent::Worker* Agent::CapturingWorker() const {
  for (const auto& w : workers_)
    if (w.capturing) return &w;
  return nullptr;
}

bool Agent::AllExited() const {
  return std::all_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.exited; });
}

std::string Agent::Label(const Worker& w) {
  return "worker rank " + std::to_string(w.rank.global_rank) + " (local_rank " + std::to_string(w.rank.local_rank) +
         ", pid " + std::to_string(w.pid) + ")";
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
  if (stopped_by_ctrun) f.stop_sent = stop_sent_;
  f.hang = w.hang;
  f.stacks = w.stacks;
  f.never_started = w.never_started;
  if (!w.hang.empty()) {  // killed by ctrun because it hung: the failure is the hang, found then
    f.stopped_by_ctrun = false;
    f.stop_sent.reset();
    f.time = w.hung_at;
  }
  failures_.push_back(std::move(f));
}

void Agent::EmitWorkerExit(const Worker& w, const char* cause) {
  nlohmann::json fields{{"rank", w.rank.global_rank},
                        {"local_rank", w.rank.local_rank},
                        {"pid", w.pid},
                        {"attempt", attempt_},
                        {"cause", cause},
                        {"status", w.status.ToString()}};
  AddExitStatusFields(w.status, &fields);
  events_->Emit(events::kWorkerExit, fields);
}

void Agent::OnChildStopped(pid_t pid, int sig) {
  Worker* w = FindWorker(pid);
  if (!w || w->exited || w->said_tty_stop || (sig != SIGTTIN && sig != SIGTTOU)) return;
  w->said_tty_stop = true;
  hooks_.Log(1, Label(*w) + " is stopped by " + SignalName(sig) +
                    ": it used ctrun's terminal as a foreground program would (a password prompt, a change of "
                    "the terminal's settings, a write under `stty tostop`), but ctrun runs each worker in a "
                    "process group of its own, in the background; it stays stopped: end the job with Ctrl-C");
}

void Agent::OnChildExit(pid_t pid, ExitStatus status) {
  Worker* w = FindWorker(pid);
  if (w && !w->exited) {
    w->exited = true;
    w->status = status;
    if (auto it = unconfirmed_.find(pid); it != unconfirmed_.end()) {
      if (std::optional<SpawnError> e = status.success() ? std::nullopt : LateExecFailure(it->second)) {
        w->never_started = e->message;
        hooks_.Log(2, Label(*w) + " never started: " + e->message);
      }
      unconfirmed_.erase(it);
    }
    hooks_.OnWorkerExited(w->rank.local_rank, pid, status);
    if (health_) health_->WorkerExited(w->rank.local_rank);
    if (state_ == AgentState::kRunning) {
      if (status.signaled() && w->capturing && w->hang.empty()) {
        // A rank silent beside the hung one, killed by a signal while its stacks were taken (the
        // capture can abort a process it interrupts): a consequence of the hang, not a failure of
        // its own. An exit code is its own doing, and a failure like any other.
        RecordFailure(*w, /*stopped_by_ctrun=*/true);
        failures_.back().stop_sent.reset();
        EmitWorkerExit(*w, "stopped");
        hooks_.Log(1, Label(*w) + " " + status.ToString() + " during its stack capture");
        return;
      }
      EmitWorkerExit(*w, status.success() ? "succeeded" : "failed");
      if (!status.success()) {
        OnFailureWhileRunning(*w);
        return;
      }
      if (AllExited()) {
        if (peer_loss_timer_) {
          EndPeerLossWait("every other worker has exited", /*waited_out=*/false);
          return;
        }
        // All leaders succeeded. Anything they left behind in their groups is swept, not waited on.
        BeginStopping(StopReason::kSuccess, SIGTERM);
        return;
      }
      if (!late_exit_timer_) StartLateExitClock();
    } else if (state_ == AgentState::kStopping && stop_reason_ != StopReason::kStartError &&
               (!status.success() || !w->hang.empty())) {  // a hung rank is a failure however it ends
      // During teardown a worker that died of the signal ctrun sent (or a shell's 128+signal
      // for it) was stopped by ctrun. Any other failure (its own exception, exit 1 from a
      // broken collective, SIGABRT) happened on its own, possibly before our signal arrived:
      // it stays a root-cause candidate, ordered by its error-file time (see run_summary.h).
      // When the user stopped the job (a signal to ctrun), whatever the workers do in reaction
      // (Python's KeyboardInterrupt exits 1) is a consequence of that signal too.
      const bool stopped = stop_reason_ == StopReason::kSignal || stop_reason_ == StopReason::kDeadline ||
                           DiedOfOurSignal(status);
      RecordFailure(*w, /*stopped_by_ctrun=*/stopped);
      EmitWorkerExit(*w, stopped ? "stopped" : "failed");
    } else {
      // Exited 0 during a teardown, or a start error's collateral: stopped by ctrun either way.
      EmitWorkerExit(*w, status.success() && stop_reason_ == StopReason::kSuccess ? "succeeded" : "stopped");
    }
  }
  if (state_ == AgentState::kStopping) CheckStopped();
}

void Agent::OnRepeatedSignal(int sig, const std::string& why) {
  if (state_ == AgentState::kDone || state_ == AgentState::kIdle) return;
  const bool other = state_ == AgentState::kStopping && stop_reason_ == StopReason::kSignal && sig != stop_signal_;
  hooks_.Log(0, "received " + SignalName(sig) + " " + why + ": the same request, not a second one" +
                    (other ? "; forwarded to the workers" : "") + " (a signal a second later kills the workers at once)");
  if (other) SignalLiveGroupsToStop(sig);
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
  if (state_ == AgentState::kBackoff && !forward_only) {
    hooks_.Log(1, "received " + SignalName(sig) + " while waiting to restart: not restarting");
    stop_reason_ = StopReason::kSignal;
    stop_signal_ = sig;
    Finish(128 + sig);
    return;
  }
  if (forward_only) {
    hooks_.Log(0, "forwarding " + SignalName(sig) + " to the workers");
    for (const auto& w : workers_)
      if (!w.group_gone) spawner_.SignalGroup(w.pid, sig);
    return;
  }
  if (state_ == AgentState::kStopping && stop_reason_ == StopReason::kSignal) {
    // Second terminating signal: the user insists. Skip the rest of the grace period.
    hooks_.Log(1, "received " + SignalName(sig) + (sig == stop_signal_ ? " again" : " after " + SignalName(stop_signal_)) +
                      ": killing the workers now");
    OnGraceExpired();
    return;
  }
  hooks_.Log(1, "received " + SignalName(sig) + ": forwarding it to the workers, then SIGKILL after " +
                    FormatSeconds(config_.shutdown_timeout));
  if (state_ == AgentState::kStopping) {
    // Already tearing down after a failure: this turns the restart into an exit, and the signal
    // still reaches the workers that are left.
    stop_reason_ = StopReason::kSignal;
    stop_signal_ = sig;
    EmitStop(stop_reason_, sig);
    SignalLiveGroupsToStop(sig);
    return;
  }
  BeginStopping(StopReason::kSignal, sig);
}

bool AgentHooks::FailureLostAPeer(const FailureRecord& f) {
  WorkerFailure w;
  w.status = f.status;
  return LostAPeer(w);
}

// A worker failed on its own while the attempt ran: stop the others, or first wait (at most
// kPeerLossWait) when all the failures so far only lost a peer. Stopping ends the wait:
// BeginStopping cancels every timer of the attempt.
void Agent::OnFailureWhileRunning(const Worker& w) {
  RecordFailure(w, /*stopped_by_ctrun=*/false);
  const std::string who = Label(w) + " " + w.status.ToString() + (w.capturing ? " during its stack capture" : "");
  const bool lost_a_peer = w.hang.empty() && hooks_.FailureLostAPeer(failures_.back());
  if (lost_a_peer && peer_loss_timer_) {  // one more rank that lost the same peer
    if (AllExited()) EndPeerLossWait("every other worker has exited", /*waited_out=*/false);
    return;
  }
  // Alone on its node, the lost peer can only be on another: the wait for the rendezvous at once.
  if (lost_a_peer && (!AllExited() || rdzv_) && !AnotherRankFailedOnItsOwn()) {
    peer_loss_pid_ = w.pid;
    if (AllExited()) {
      hooks_.Log(2, "first exit: " + who + " after losing a peer");
      EndPeerLossWait("no other worker runs here", /*waited_out=*/false);
      return;
    }
    hooks_.Log(2, "first exit: " + who + " after losing a peer; waiting up to " +
                      health::FormatSeconds(kPeerLossWait) +
                      " for that peer to end on its own before stopping the other workers");
    peer_loss_timer_ = timers_.AddTimer(timers_.Now() + kPeerLossWait, [this] {
      peer_loss_timer_.reset();
      EndPeerLossWait("no worker failed on its own within " + health::FormatSeconds(kPeerLossWait), /*waited_out=*/true);
    });
    return;
  }
  if (peer_loss_timer_) {  // the rank the wait was for
    hooks_.Log(2, who + "; stopping the other workers");
  } else {
    hooks_.Log(2, "first exit: " + who + "; stopping the other workers (the root cause is named once they are gone)");
  }
  StopForFailure(w, w.hang.empty() ? w.status.ToString() : w.hang, w.hang.empty() ? w.status.ShellCode() : kExitHung);
}

bool Agent::AnotherRankFailedOnItsOwn() const {
  std::vector<std::string> files;
  for (const auto& w : workers_)
    if (!w.exited && !w.error_file.empty()) files.push_back(w.error_file);
  return hooks_.AnErrorFileRecordsAnOwnFailure(files);
}

// The wait after a lost peer is over without a failure of another kind: stop for the first.
void Agent::EndPeerLossWait(const std::string& why, bool waited_out) {
  const Worker* first = FindWorker(peer_loss_pid_);
  if (state_ != AgentState::kRunning || !first) return;
  if (peer_loss_on_nodes_ && !waited_out) return;  // waiting for the rendezvous, not for a worker here
  if (rdzv_ && !peer_loss_on_nodes_) {
    if (peer_loss_timer_) timers_.CancelTimer(*peer_loss_timer_);
    peer_loss_on_nodes_ = true;
    const Duration wait = rdzv_->loss_reported_within();
    hooks_.Log(1, why + ": the lost peer may be on a node that died, which the rendezvous reports within " +
                      health::FormatSeconds(wait) + " (a node lost costs no restart); waiting that long before "
                      "counting " + Label(*first) + "'s failure");
    peer_loss_timer_ = timers_.AddTimer(timers_.Now() + wait, [this, wait] {
      peer_loss_timer_.reset();
      EndPeerLossWait("no node was reported lost within " + health::FormatSeconds(wait), /*waited_out=*/true);
    });
    return;
  }
  hooks_.Log(2, why + "; stopping the other workers (the root cause is named once they are gone)");
  StopForFailure(*first, first->status.ToString(), first->status.ShellCode());
}

void Agent::StopForFailure(const Worker& w, const std::string& what, int exit_code) {
  if (rdzv_) {
    rdzv::Cause c;
    c.rank = w.rank.global_rank;
    c.local_rank = w.rank.local_rank;
    c.what = what;
    c.exit_code = exit_code;
    rdzv_->ReportFailure(c);
  }
  BeginStopping(StopReason::kFailure, SIGTERM);
}

Agent::Worker* Agent::RunningLocal(int local_rank) {
  for (auto& x : workers_)
    if (x.rank.local_rank == local_rank && !x.exited) return &x;
  return nullptr;
}

// "; ranks 0 and 3 had fallen silent too": the other ranks of a hang, in the blamed rank's verdict.
std::string Agent::SilentClause(const std::vector<Worker*>& silent) {
  if (silent.empty()) return "";
  std::string out = silent.size() == 1 ? "; rank " : "; ranks ";
  for (size_t i = 0; i < silent.size(); ++i) {
    if (i > 0) out += i + 1 == silent.size() ? " and " : ", ";
    out += std::to_string(silent[i]->rank.global_rank);
  }
  return out + " had fallen silent too";
}

void Agent::OnRankHung(int local_rank, const std::string& why, const std::vector<int>& also_silent) {
  if (state_ != AgentState::kRunning) return;
  Worker* w = RunningLocal(local_rank);
  if (!w) return;
  std::vector<Worker*> silent;
  nlohmann::json silent_ranks = nlohmann::json::array();
  for (int r : also_silent)
    if (Worker* x = RunningLocal(r)) {
      silent.push_back(x);
      silent_ranks.push_back(x->rank.global_rank);
    }
  hang_verdict_ = why;
  w->hang = why + SilentClause(silent);
  for (Worker* x : silent) x->silent = true;
  w->hung_at = std::chrono::system_clock::now();
  events_->Emit(events::kHeartbeatMiss, {{"rank", w->rank.global_rank},
                                         {"local_rank", local_rank},
                                         {"pid", w->pid},
                                         {"attempt", attempt_},
                                         {"why", why},
                                         {"also_silent", silent_ranks}});
  const std::string who = Label(*w) + " ";
  if (config_.stack_timeout <= 0 || !health_) {
    hooks_.Log(2, who + w->hang + "; stopping the workers");
    StopForFailure(*w, w->hang, kExitHung);
    return;
  }
  hooks_.Log(2, who + w->hang + "; saving " + (silent.empty() ? "its stacks" : "its stacks, then theirs") +
                    " (at most " + health::FormatSeconds(Seconds(config_.stack_timeout)) +
                    (silent.empty() ? "" : " each") + "), then stopping the workers");
  // The hung rank's stacks first, alone: on a loaded machine several tracers at once can all miss
  // the bound. The silent ranks' captures follow together (OnStacksSaved).
  Capture(*w);
}

void Agent::Capture(Worker& w) {
  w.capturing = true;
  health_->CaptureStacks(w.rank.local_rank, w.pid, [this, pid = w.pid](const health::StackSummary& summary) {
    OnStacksSaved(pid, summary);
  });
}

// One rank's capture ended (saved, cut at its bound, or impossible). Once every capture of the
// hang has ended, the attempt is stopped for the hung rank.
void Agent::OnStacksSaved(pid_t pid, const health::StackSummary& summary) {
  Worker* w = FindWorker(pid);
  if (!w) return;  // another attempt by now
  w->capturing = false;
  w->stacks = summary.text;
  events_->Emit(events::kStackCapture,
                {{"rank", w->rank.global_rank}, {"pid", pid}, {"attempt", attempt_}, {"summary", summary.text}});
  for (auto& f : failures_)
    if (f.pid == pid) f.stacks = summary.text;
  // A capture that saved less than it was asked for is worth a warning: the stacks that explain
  // the hang may be the ones missing.
  hooks_.Log(summary.complete ? 0 : 1, "rank " + std::to_string(w->rank.global_rank) + ": " + summary.text);
  // The hung rank's capture ran alone; once it has ended the silent ranks' follow, together (a
  // rank whose stacks are saved, or being saved, is not taken again).
  if (state_ == AgentState::kRunning)
    for (auto& x : workers_)
      if (x.silent && !x.exited && !x.capturing && x.stacks.empty()) Capture(x);
  if (CapturingWorker()) return;  // the silent ranks' captures are still running
  if (state_ != AgentState::kRunning) {  // already stopping (another failure meanwhile), or over
    if (state_ == AgentState::kStopping) CheckStopped();  // it may have waited for this capture only
    return;
  }
  Worker* hung = nullptr;
  for (auto& x : workers_)
    if (!x.hang.empty()) hung = &x;
  if (!hung) return;
  hung = BlameOutsideCollectives(hung);
  if (hung->exited) RecordFailure(*hung, /*stopped_by_ctrun=*/false);  // it ended during the capture
  StopForFailure(*hung, hung->hang, kExitHung);
}

// The rank blamed first has its main thread waiting in the communication libraries (its saved
// native stacks) while a rank that fell silent beside it has its main thread in its own code: that
// rank is the one they wait for, and the blame moves to it. Evidence is needed on both sides: a
// capture that was cut, failed or was not made leaves the first verdict standing.
Agent::Worker* Agent::BlameOutsideCollectives(Worker* hung) {
  using health::MainThreadWait;
  if (health_->MainThreadOf(hung->rank.local_rank, hung->pid) != MainThreadWait::kInCollective) return hung;
  Worker* culprit = nullptr;
  std::vector<Worker*> others;
  for (auto& s : workers_) {
    if (!s.silent) continue;
    if (!culprit && !s.exited && health_->MainThreadOf(s.rank.local_rank, s.pid) == MainThreadWait::kElsewhere)
      culprit = &s;
    else
      others.push_back(&s);
  }
  if (!culprit) return hung;
  const std::string h = std::to_string(hung->rank.global_rank);
  const std::string c = std::to_string(culprit->rank.global_rank);
  culprit->hang = "hung: fell silent with rank " + h + ", whose main thread waits in a collective (rank " + h + ": " +
                  hang_verdict_.substr(hang_verdict_.rfind("hung: ", 0) == 0 ? 6 : 0) + ")" + SilentClause(others);
  culprit->hung_at = hung->hung_at;
  hooks_.Log(2, "blaming rank " + c + " instead of rank " + h + ": the native stacks show rank " + h +
                    "'s main thread waiting in a collective and rank " + c + "'s in its own code");
  events_->Emit(events::kHangBlame, {{"rank", culprit->rank.global_rank},
                                     {"instead_of", hung->rank.global_rank},
                                     {"attempt", attempt_},
                                     {"why", culprit->hang}});
  hung->hang.clear();
  hung->silent = true;
  return culprit;
}

void Agent::BeginStopping(StopReason reason, int sig) {
  if (health_) health_->StopWatching();
  state_ = AgentState::kStopping;
  stop_reason_ = reason;
  stop_signal_ = sig;
  stop_sent_ = std::chrono::system_clock::now();
  killed_ = sig == SIGKILL;
  EmitStop(reason, sig);
  RefreshGroups();
  SignalLiveGroupsToStop(sig);
  CancelTimers();
  if (killed_) {
    ArmFinalWait(timers_.Now() + kFinalWait);
  } else {
    ArmGrace(timers_.Now() + Seconds(config_.shutdown_timeout));
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
  ArmFinalWait(timers_.Now() + kFinalWait);
  CheckStopped();
}

// A worker that never exited is still a failure of the attempt: stopped by ctrun, or the hung
// rank (the root cause) whose verdict says that it did not die. Its status is the SIGKILL it was
// sent.
void Agent::OnFinalWaitExpired() {
  if (state_ != AgentState::kStopping) return;
  for (auto& w : workers_) {
    if (!w.exited) {
      unkillable_.push_back(w.pid);
      w.status = ExitStatus::Signaled(SIGKILL);
      if (!w.hang.empty()) w.hang += "; it did not exit after SIGKILL (stuck in the kernel, D state?)";
      RecordFailure(w, /*stopped_by_ctrun=*/true);
    }
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
  if (!AllExited()) return;
  // A hung rank's capture outlives its target (the tools exit once it is gone, within the
  // capture's bound): the attempt ends after it, so its stacks are reported with its failure.
  if (CapturingWorker()) return;
  RefreshGroups();
  for (const auto& w : workers_)
    if (!w.group_gone) return;
  FinishAttempt();
}

void Agent::SignalToStop(pid_t pgid, int sig) {
  spawner_.SignalGroup(pgid, sig);
  // A stopped process acts on nothing but SIGKILL and SIGCONT: wake it so it sees `sig` now.
  if (sig != SIGKILL && sig != SIGCONT) spawner_.SignalGroup(pgid, SIGCONT);
}

void Agent::SignalLiveGroupsToStop(int sig) {
  for (const auto& w : workers_)
    if (!w.group_gone) SignalToStop(w.pid, sig);
}

void Agent::ArmGrace(TimePoint deadline) {
  grace_deadline_ = deadline;
  grace_timer_ = timers_.AddTimer(deadline, [this] {
    grace_timer_.reset();
    OnGraceExpired();
  });
}

void Agent::ArmFinalWait(TimePoint deadline) {
  final_deadline_ = deadline;
  final_timer_ = timers_.AddTimer(deadline, [this] {
    final_timer_.reset();
    OnFinalWaitExpired();
  });
}

int Agent::SuspendWorkers() {
  int n = 0;
  for (const auto& w : workers_)
    if (!w.group_gone && spawner_.SignalGroup(w.pid, SIGTSTP)) ++n;
  return n;
}

void Agent::ResumeWorkers(Duration suspended_for) {
  for (const auto& w : workers_)
    if (!w.group_gone) spawner_.SignalGroup(w.pid, SIGCONT);
  if (suspended_for <= Duration::zero()) return;
  if (health_) health_->Resumed(suspended_for);  // standing still is not silence
  // The deadlines move with the suspension; the handlers are the ones armed before.
  if (grace_timer_) {
    timers_.CancelTimer(*grace_timer_);
    ArmGrace(grace_deadline_ + suspended_for);
  }
  if (final_timer_) {
    timers_.CancelTimer(*final_timer_);
    ArmFinalWait(final_deadline_ + suspended_for);
  }
  if (backoff_timer_) {
    timers_.CancelTimer(*backoff_timer_);
    ArmBackoff(backoff_deadline_ + suspended_for);
  }
  if (late_exit_timer_) {
    timers_.CancelTimer(*late_exit_timer_);
    ArmLateExitNotice(late_exit_deadline_ + suspended_for, late_exit_after_);
  }
}

void Agent::ArmBackoff(TimePoint deadline) {
  backoff_deadline_ = deadline;
  backoff_timer_ = timers_.AddTimer(deadline, [this] {
    backoff_timer_.reset();
    Restart();
  });
}

void Agent::CancelTimers() {
  if (peer_loss_timer_) timers_.CancelTimer(*peer_loss_timer_);
  peer_loss_timer_.reset();
  peer_loss_on_nodes_ = false;
  if (grace_timer_) timers_.CancelTimer(*grace_timer_);
  if (final_timer_) timers_.CancelTimer(*final_timer_);
  if (backoff_timer_) timers_.CancelTimer(*backoff_timer_);
  if (late_exit_timer_) timers_.CancelTimer(*late_exit_timer_);
  grace_timer_.reset();
  final_timer_.reset();
  backoff_timer_.reset();
  late_exit_timer_.reset();
}

void Agent::StartLateExitClock() {
  if (config_.late_exit_notice <= 0) return;
  const Duration after = Seconds(config_.late_exit_notice);
  ArmLateExitNotice(timers_.Now() + after, after);
}

void Agent::ArmLateExitNotice(TimePoint deadline, Duration after) {
  late_exit_deadline_ = deadline;
  late_exit_after_ = after;
  late_exit_timer_ = timers_.AddTimer(deadline, [this] {
    late_exit_timer_.reset();
    const bool said = state_ == AgentState::kRendezvous && rdzv_ ? NoticeUnfinishedNodes() : NoticeLateRanks();
    if (said) ArmLateExitNotice(late_exit_deadline_ + late_exit_after_, late_exit_after_ * 2);
  });
}

bool Agent::NoticeLateRanks() {
  if (state_ != AgentState::kRunning) return false;
  std::vector<int> finished, running_ranks;
  std::vector<const Worker*> running;
  for (const auto& w : workers_) {
    if (!w.exited) running.push_back(&w);
    else if (w.status.success()) finished.push_back(w.rank.global_rank);
  }
  if (running.empty() || finished.empty()) return false;  // armed by an exit 0 of this attempt: never empty
  std::sort(finished.begin(), finished.end());
  for (const Worker* w : running) running_ranks.push_back(w->rank.global_rank);
  events_->Emit(events::kLateExit, {{"attempt", attempt_},
                                    {"after_s", ToSeconds(late_exit_after_)},
                                    {"finished_ranks", finished},
                                    {"running_ranks", running_ranks}});
  constexpr size_t kNamed = 8;  // a line, not a page, when many ranks are left
  std::string still;
  for (size_t i = 0; i < running.size() && i < kNamed; ++i) still += (i ? ", " : "") + Label(*running[i]);
  if (running.size() > kNamed) still += " and " + std::to_string(running.size() - kNamed) + " more";
  const std::string ranks = FormatCpuList(finished, ", ");  // "0, 2-5"
  const std::string when = FormatSeconds(ToSeconds(late_exit_after_));
  hooks_.Log(1, (finished.size() == 1 ? "rank " + ranks + " exited 0 " + when + " ago"
                                      : "ranks " + ranks + " exited 0, the first " + when + " ago") +
                    "; still running: " + still);
  return true;
}

bool Agent::NoticeUnfinishedNodes() {
  const std::vector<rdzv::Rendezvous::NodeName> nodes = rdzv_->UnfinishedNodes();
  if (nodes.empty()) return false;  // out of the exit barrier (a new round, the job's end)
  std::string names;
  std::vector<int> node_ranks;
  for (const auto& n : nodes) {
    names += (names.empty() ? "" : ", ") + ("node " + std::to_string(n.node_rank) + " (" + n.host + ")");
    node_ranks.push_back(n.node_rank);
  }
  events_->Emit(events::kLateExit,
                {{"attempt", attempt_}, {"after_s", ToSeconds(late_exit_after_)}, {"running_nodes", node_ranks}});
  hooks_.Log(1, "every worker on this node exited 0 " + FormatSeconds(ToSeconds(late_exit_after_)) +
                    " ago; still running: the workers of " + names);
  return true;
}

void Agent::FinishAttempt() {
  CancelTimers();
  hooks_.OnAttemptOver();
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
    case StopReason::kDeadline:
      Finish(kExitMaxRunTime);
      return;
    case StopReason::kRemote:  // only with a rendezvous
    case StopReason::kFailure:
      hooks_.OnAttemptFailed(restart_count_, failures_);
      if (restart_count_ < config_.max_restarts) {
        const health::RestartDecision d =
            restart_policy_.OnFailedAttempt(health_ ? health_->AttemptProgress() : health::AttemptBeats{});
        if (!d.crash_loop) {
          state_ = AgentState::kBackoff;
          if (d.delay <= Duration::zero()) {
            Restart();
            return;
          }
          events_->Emit(events::kBackoff, {{"delay_s", std::chrono::duration<double>(d.delay).count()},
                                           {"restart_count", restart_count_ + 1}});
          hooks_.Log(1, "restarting in " + health::FormatSeconds(d.delay) + " (--restart-backoff)");
          ArmBackoff(timers_.Now() + d.delay);
          return;
        }
        crash_loop_ = d.why;
        hooks_.Log(2, d.why);
      } else if (config_.max_restarts > 0) {
        hooks_.Log(2, "no restarts left (max_restarts=" + std::to_string(config_.max_restarts) + ")");
      }
      {
        int code = 1;
        for (const auto& f : failures_)
          if (!f.stopped_by_ctrun) {
            code = f.hang.empty() ? f.status.ShellCode() : kExitHung;
            break;
          }
        Finish(code == 0 ? 1 : code);
      }
      return;
  }
}

void Agent::Restart() {
  ++restart_count_;
  events_->Emit(events::kRestart, {{"restart_count", restart_count_}, {"max_restarts", config_.max_restarts}});
  hooks_.Log(1, "restarting all workers (restart " + std::to_string(restart_count_) + " of " +
                    std::to_string(config_.max_restarts) + ")");
  RestartWhenReady();
}

// The previous attempt's processes are gone from the GPUs (bounded wait in the hooks) before the
// next attempt starts; a signal or the deadline meanwhile ends the run.
void Agent::RestartWhenReady() {
  std::vector<pid_t> previous;
  for (const auto& w : workers_) previous.push_back(w.pid);
  restart_pending_ = true;
  hooks_.BeforeRestart(previous, [this](Status s) {
    if (!restart_pending_) return;  // a signal or the deadline ended the run meanwhile
    restart_pending_ = false;
    if (!s.ok()) {
      setup_failed_ = true;  // exit 1, this message as the outcome (the failure stays in the summary)
      end_message_ = s.message();
      hooks_.Log(2, s.message());
      Finish(1);
      return;
    }
    StartAttempt();
  });
}

// Every worker of the round is gone. The rendezvous decides what comes next: a signal ends this
// agent; an agreed outcome (or a rendezvous error) that arrived meanwhile ends it with that code;
// success waits in the exit barrier, unless the round stopped during the success's sweep;
// anything else joins the next round (or learns there that the job has ended).
void Agent::FinishMultiNodeAttempt() {
  if (stop_reason_ == StopReason::kSignal) {
    Finish(128 + stop_signal_);
    return;
  }
  if (stop_reason_ == StopReason::kDeadline) {
    Finish(kExitMaxRunTime);
    return;
  }
  if (job_end_) {
    Finish(job_end_->exit_code);
    return;
  }
  if (stop_reason_ == StopReason::kSuccess && !round_stopped_) {
    state_ = AgentState::kRendezvous;
    hooks_.Log(0, "all workers on this node succeeded; waiting for the other nodes");
    rdzv_->ReportSucceeded();
    if (state_ == AgentState::kRendezvous) StartLateExitClock();  // the job did not end at once
    return;
  }
  JoinNextRound();
}

void Agent::EmitStop(StopReason reason, int sig) {
  const char* name = "failure";
  switch (reason) {
    case StopReason::kFailure: name = "failure"; break;
    case StopReason::kSignal: name = "signal"; break;
    case StopReason::kSuccess: name = "success"; break;
    case StopReason::kStartError: name = "start_error"; break;
    case StopReason::kRemote: name = "remote"; break;
    case StopReason::kDeadline: name = "max_run_time"; break;
  }
  events_->Emit(events::kStop, {{"reason", name}, {"signal", sig}, {"signal_name", SignalName(sig)}});
}

// The job deadline: the usual stop (SIGTERM, grace, SIGKILL) ends the run with kExitMaxRunTime,
// whatever the workers do meanwhile. Multi-node, a fatal cause with that code closes the job for
// every agent (the first deadline to fire wins), and this agent leaves without waiting for them.
// A deadline during the sweep after every worker here succeeded changes nothing on a single
// node: the job is over, only what the workers left behind is being stopped.
void Agent::OnDeadline() {
  if (state_ == AgentState::kIdle || state_ == AgentState::kDone) return;
  if (!rdzv_ && state_ == AgentState::kStopping && stop_reason_ == StopReason::kSuccess) return;
  deadline_reached_ = true;
  if (state_ == AgentState::kRunning || state_ == AgentState::kStopping)
    for (const auto& w : workers_)
      if (!w.exited) running_at_deadline_.push_back(w.rank.global_rank);
  std::sort(running_at_deadline_.begin(), running_at_deadline_.end());
  std::string ranks;
  for (int r : running_at_deadline_) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  const std::string limit = FormatSecondsValue(*config_.max_run_time);
  end_message_ = "reached --max-run-time (" + limit + " s)" +
                 (ranks.empty() ? "; no worker was running" : "; ranks still running: " + ranks);
  hooks_.Log(2, end_message_ + (ranks.empty() ? "" : "; stopping them"));
  events_->Emit(events::kMaxRunTime, {{"max_run_time_s", *config_.max_run_time}, {"running_ranks", running_at_deadline_}});
  if (rdzv_) {
    rdzv::Cause c;
    c.what = "reached --max-run-time (" + limit + " s)";
    c.exit_code = kExitMaxRunTime;
    c.fatal = true;
    rdzv_->ReportFailure(c);
    rdzv_->Leave();
  }
  switch (state_) {
    case AgentState::kRunning:
      BeginStopping(StopReason::kDeadline, SIGTERM);
      return;
    case AgentState::kStopping:
      // Already stopping (a failure, a remote stop): no restart follows; the signals were sent.
      stop_reason_ = StopReason::kDeadline;
      EmitStop(stop_reason_, stop_signal_);
      return;
    default:  // waiting for a round or in the exit barrier: no worker of ours is running
      stop_reason_ = StopReason::kDeadline;
      Finish(kExitMaxRunTime);
      return;
  }
}

void Agent::Finish(int code) {
  CancelTimers();
  if (deadline_timer_) timers_.CancelTimer(*deadline_timer_);
  deadline_timer_.reset();
  exit_code_ = code;
  restart_pending_ = false;  // a BeforeRestart answer that comes after this starts nothing
  gpu_wait_.pending = false;   // the same, multi-node
  gpu_wait_.round_ready = false;
  state_ = AgentState::kDone;
}

}  // namespace ctrun
