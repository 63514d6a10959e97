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
// Health (health/monitor.h, attached with AttachHealth): a rank that misses a heartbeat or output
// deadline is that attempt's failure. Its stacks, and those of the ranks that had fallen silent
// with it (also_silent, see health/hang_watcher.h), are captured first (bounded, asynchronous; the
// state stays Running meanwhile, so a worker that fails on its own during the capture is handled
// as usual, while a silent rank killed by a signal during its capture is not a failure of its own),
// then the attempt is stopped like any failure; the hung rank is the root cause, with its verdict
// ("hung: no heartbeat for 92 s (last beat at step 1200); rank 0 had fallen silent too") and the
// stacks' location (the hung rank's captured first, the silent ranks' after it). When the native
// stacks show the main thread of the rank blamed first waiting in a collective and a silent rank's
// in its own code, the blame moves to that rank: the first rank to fall silent in a collective hang
// is as often one that waits for the culprit.
// Single node, a failed attempt with restarts left waits the RestartPolicy's back-off (state
// Backoff; a terminating signal then ends the run at once) or, in a crash loop, ends the run with
// the last attempt's root cause and crash_loop() set.
//
// Stopping a group means: signal every worker process group of the attempt that still has a
// member (leader or any descendant), arm the grace timer, SIGKILL what is left when it fires, then
// wait at most kFinalWait more; a process that survives SIGKILL (D-state) is reported, never
// waited on forever. Every signal sent to stop a group (SIGTERM, a forwarded SIGINT, ...) is
// followed by SIGCONT: a stopped worker (Ctrl-Z, a debugger, SIGTTIN) acts on it at once
// instead of sitting out the grace period.
//
// Multi-node, the wait for the GPUs' release (AgentHooks::BeforeRestart) runs beside the
// rendezvous: it starts with the join that follows an attempt whose workers are all gone (after a
// failure, a remote stop, or a success whose exit barrier a round stop broke; never before the
// first round, nor while in the exit barrier), and the round's workers start once both the round
// is complete and the wait has answered Ok, whichever comes last. An error answer (the GPUs still
// held past the wait's bound) makes this node leave the job (Rendezvous::Leave, exit 1): the
// others go on without it if enough remain.
//
// Late exits (--late-exit-notice T): when a rank of the attempt exits 0 while others still run,
// and some are still running T later, they are named in one warning line, again at 2T, 4T and so
// on (time the job was running: a suspension moves the deadline, as below). Peers that finished
// can no longer take part in a collective, so a rank still running then is most often stuck in its
// end (a process group's teardown, a thread that never ends) and would otherwise hold the job
// without a word. It only tells: the job goes on. Multi-node, a node whose workers all succeeded
// waits in the exit barrier: T after that, and at 2T, 4T..., it names the nodes whose workers are
// still running (Rendezvous::UnfinishedNodes).
//
// Job control (Ctrl-Z): SuspendWorkers sends SIGTSTP to every worker group with members;
// ResumeWorkers sends SIGCONT and moves the grace / final-wait / back-off deadlines by the time the
// job was suspended, so a teardown's grace period and a restart's back-off count only time the job
// could run.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "agent/worker_env.h"
#include "base/status.h"
#include "config/launch_config.h"
#include "health/monitor.h"
#include "health/restart_policy.h"
#include "process/exit_status.h"
#include "process/spawner.h"
#include "rendezvous/rendezvous.h"
#include "report/events.h"
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
  // Decides fd 0/1/2 of a worker (pipes for the relay, files, or the console) and what contains
  // it: its cgroup, the watchdog it registers with before exec.
  virtual void ConfigureStdio(int /*local_rank*/, const RankInfo& /*rank*/, int /*attempt*/, SpawnSpec* /*spec*/) {}
  // After ConfigureStdio: the rest of the worker's placement (CPU affinity, a debugger).
  virtual void ConfigureWorker(int /*local_rank*/, const RankInfo& /*rank*/, int /*attempt*/, SpawnSpec* /*spec*/) {}
  // After an attempt's workers are gone, before the next attempt's start: calls ready(Ok) when
  // it may go ahead, now or later from the event loop (GPUs released), or ready(error) to end the
  // run instead. worker_pids: the previous attempt's workers. Single node, after a failed
  // attempt (before the restart); multi-node, from the join of the next round on, beside the
  // rendezvous (an error there makes this node leave the job). An answer that comes after the run
  // ended (a signal, the deadline, the job's end) starts nothing.
  virtual void BeforeRestart(const std::vector<pid_t>& /*worker_pids*/, std::function<void(Status)> ready) {
    ready(Status::Ok());
  }
  // A worker started: take its pidfd and pipes (wire them into the loop / relay / watchdog).
  virtual void OnWorkerStarted(int /*local_rank*/, const RankInfo& /*rank*/, SpawnedProcess& /*proc*/) {}
  // A worker's leader was reaped (its output may still be in flight: drain it now).
  virtual void OnWorkerExited(int /*local_rank*/, pid_t /*pid*/, const ExitStatus& /*status*/) {}
  // No process is left in this worker's process group.
  virtual void OnGroupGone(pid_t /*pgid*/) {}
  // Every worker of the attempt is gone (or given up on): remove whatever they left behind outside
  // their process groups (escaped descendants, the attempt's cgroup), before a restart or the end.
  virtual void OnAttemptOver() {}
  // An attempt failed and all its workers are gone (before the restart or the end): name the root
  // cause. The real hooks order the failures by their error files' times, as the summary does;
  // the order of exits cannot tell the rank that crashed from one that died of a closed connection.
  virtual void OnAttemptFailed(int /*restart_count*/, const std::vector<FailureRecord>& /*failures*/) {}
  // Whether a failure is the consequence of a peer going away (SIGPIPE, a "Connection closed by
  // peer" error file): the real hooks read its error file. Called once per failure while running.
  virtual bool FailureLostAPeer(const FailureRecord& f);
  // Whether one of these error files (of workers still running) already records a failure of its
  // own, not a lost peer: that worker is then the root cause however it ends (it failed before
  // ctrun's stop), so there is no peer to wait for. The real hooks read them.
  virtual bool AnErrorFileRecordsAnOwnFailure(const std::vector<std::string>& /*error_files*/) { return false; }
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
  // With stopped_by_ctrun: when ctrun sent its stop signal (see WorkerFailure::stop_sent).
  std::optional<std::chrono::system_clock::time_point> stop_sent;
  std::string hang;    // "hung: no heartbeat for ..." when ctrun found the rank hung
  std::string stacks;  // where its stacks went (or why they did not), with hang
  std::string never_started;  // its exec failed after ctrun stopped waiting for it
};

// kRendezvous (multi-node): waiting for a round or in the exit barrier, or with the round
// complete, waiting for the previous attempt's processes to leave the GPUs before its workers start.
// kBackoff: between two attempts of a single-node job, every worker of the failed one gone:
// the --restart-backoff delay, then the wait for the GPUs' release (BeforeRestart). A signal or
// the deadline there ends the run; a late exit (a worker given up on in D state) changes nothing.
enum class AgentState { kIdle, kRendezvous, kRunning, kStopping, kBackoff, kDone };

class Agent final : public rdzv::RendezvousListener {
 public:
  // Bound on the wait after SIGKILL before a survivor is reported as unkillable.
  static constexpr std::chrono::seconds kFinalWait{5};
  // When the first failure of an attempt only lost a peer (AgentHooks::FailureLostAPeer), the peer that
  // went away is usually still dying: a C++ rank closes its sockets while unwinding, before its
  // error file is written. The others keep running this long at most, so that peer ends on its
  // own and is named the root cause instead of being stopped by ctrun; the wait ends at the first
  // failure that did not lose a peer, or when every worker has exited. There is no wait when a
  // running worker's error file already records its own failure (AnErrorFileRecordsAnOwnFailure).
  // Multi-node, when no worker of this node failed on its own by then either, the peer may have
  // been on a node that died: its loss reaches the rendezvous only at its liveness deadline
  // (Rendezvous::loss_reported_within). Reported now, the failure would cost a restart (or, with
  // none left, end a job that enough nodes could finish) and blame a healthy rank; so the wait goes
  // on that long, ended by the rendezvous (a node lost or left: a membership change; another
  // node's failure) or by a failure here of another kind. Without either, the failure counts then.
  static constexpr std::chrono::milliseconds kPeerLossWait{1000};

  // base_env: the agent's environment, read once; executable: the file every worker execs
  // (ResolveEntrypoint in agent/launch_checks.h: the interpreter for .py / -m).
  Agent(const LaunchConfig& config, Environment base_env, std::string executable, Spawner& spawner,
        TimerQueue& timers, AgentHooks& hooks);

  // Multi-node: the rendezvous that decides rounds, restarts and the outcome (before Start()).
  void AttachRendezvous(rdzv::Rendezvous* rendezvous);
  // Where attempts, worker starts and exits, stops, restarts and rounds are reported (before
  // Start(); a null sink by default). Not owned.
  void SetEventSink(EventSink* sink) { events_ = sink ? sink : &NullEvents(); }
  // Hang detection and stack capture (before Start()); without it no rank is ever found hung.
  void AttachHealth(health::Monitor* monitor);
  void Start();
  // Any reaped child: a worker leader, a reparented descendant, or something unknown.
  void OnChildExit(pid_t pid, ExitStatus status);
  // A child stopped by `sig`. A worker stopped by SIGTTIN or SIGTTOU touched the terminal from
  // its own (background) process group and stays stopped: said once per worker, with why.
  void OnChildStopped(pid_t pid, int sig);
  // A signal delivered to the agent (from the signalfd).
  void OnSignal(int sig);
  // A stopping signal that repeats the last one as the same request (RepeatedSignalFilter): said
  // at info level, never an escalation; another signal than the one that started the stop (a
  // wrapper that turns ^C into SIGTERM) still reaches the workers that are left, as under torchrun.
  // `why` names where the copy came from.
  void OnRepeatedSignal(int sig, const std::string& why);
  // Job control (see above). Returns the number of groups signalled.
  int SuspendWorkers();
  void ResumeWorkers(Duration suspended_for);

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
  // --max-run-time fired (the run then ends with kExitMaxRunTime), and the global ranks that were
  // still running at that moment.
  bool deadline_reached() const { return deadline_reached_; }
  const std::vector<int>& running_at_deadline() const { return running_at_deadline_; }
  // The run ended because a worker could not be started (exit_code() is 126/127).
  bool ended_by_start_error() const { return done() && stop_reason_ == StopReason::kStartError; }
  // The run ended because an attempt or a join could not be prepared (exit_code() is 1).
  bool setup_failed() const { return setup_failed_; }
  // Set when the crash-loop guard ended the run: "crash loop: 3 attempts in a row failed ...".
  const std::string& crash_loop() const { return crash_loop_; }
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
  // kDeadline: --max-run-time fired.
  enum class StopReason { kFailure, kSignal, kSuccess, kStartError, kRemote, kDeadline };
  struct Worker {
    RankInfo rank;
    pid_t pid = -1;
    bool exited = false;
    bool group_gone = false;
    ExitStatus status = ExitStatus::Exited(0);
    std::string error_file;
    std::string hang;  // set when found hung
    std::string never_started;  // why its exec failed, found after ctrun stopped waiting for it
    bool capturing = false;  // its stacks are being saved (the attempt ends after the capture)
    bool silent = false;     // fell silent beside the hung rank (its stacks are saved too)
    bool said_tty_stop = false;  // its stop by SIGTTIN/SIGTTOU was logged
    std::string stacks;
    std::chrono::system_clock::time_point hung_at;
  };

  void StartAttempt();
  void JoinRendezvous();
  void JoinNextRound();
  void WaitForGpuRelease();
  void OnGpuWaitAnswered(uint64_t id, Status s);
  void LeaveForHeldGpus(const Status& s);
  void FinishMultiNodeAttempt();
  void FillRank(int local_rank, RankInfo* rank) const;
  bool DebuggedRankInJob() const;
  void BeginStopping(StopReason reason, int sig);
  void OnGraceExpired();
  void OnFinalWaitExpired();
  void CheckStopped();
  void RefreshGroups();
  void FinishAttempt();
  void RestartWhenReady();
  void Finish(int code);
  void RecordFailure(const Worker& w, bool stopped_by_ctrun);
  bool DiedOfOurSignal(const ExitStatus& status) const;
  Worker* FindWorker(pid_t pid);
  const Worker* CapturingWorker() const;  // a rank whose stacks are being saved, if any
  Worker* RunningLocal(int local_rank);     // the attempt's worker of local_rank, unless it exited
  static std::string SilentClause(const std::vector<Worker*>& silent);
  Worker* BlameOutsideCollectives(Worker* hung);
  void Capture(Worker& w);
  bool AllExited() const;                 // every leader of the attempt was reaped
  static std::string Label(const Worker& w);  // "worker rank 3 (local_rank 1, pid 4242)"
  void CancelTimers();
  void OnDeadline();
  void EmitWorkerExit(const Worker& w, const char* cause);
  void EmitStop(StopReason reason, int sig);
  void SignalToStop(pid_t pgid, int sig);
  // SignalToStop for every worker group that is not gone.
  void SignalLiveGroupsToStop(int sig);
  void ArmGrace(TimePoint deadline);
  void ArmBackoff(TimePoint deadline);
  void ArmFinalWait(TimePoint deadline);
  // --late-exit-notice (see the top of this file). StartLateExitClock arms the first notice, T from
  // now; `after` is the running time the notice at `deadline` reports. A notice that said something
  // arms the next one at twice that time.
  void StartLateExitClock();
  void ArmLateExitNotice(TimePoint deadline, Duration after);
  bool NoticeLateRanks();        // this attempt's ranks still running after an exit 0
  bool NoticeUnfinishedNodes();  // in the exit barrier: the other nodes still running
  void OnRankHung(int local_rank, const std::string& why, const std::vector<int>& also_silent);
  void OnStacksSaved(pid_t pid, const health::StackSummary& summary);
  void StopForFailure(const Worker& w, const std::string& what, int exit_code);
  void OnFailureWhileRunning(const Worker& w);
  // `waited_out`: the wait's timer fired (not "every worker has exited", which ends only the
  // wait for a peer on this node).
  void EndPeerLossWait(const std::string& why, bool waited_out);
  bool AnotherRankFailedOnItsOwn() const;
  void Restart();

  const LaunchConfig config_;
  const Environment base_env_;
  const std::string executable_;
  Spawner& spawner_;
  TimerQueue& timers_;
  AgentHooks& hooks_;

  AgentState state_ = AgentState::kIdle;
  StopReason stop_reason_ = StopReason::kFailure;
  int stop_signal_ = SIGTERM;
  std::chrono::system_clock::time_point stop_sent_;  // when BeginStopping signalled the workers
  std::string hang_verdict_;  // the watcher's words for the attempt's hang, without the silent ranks
  int restart_count_ = 0;
  int exit_code_ = 0;
  int start_error_code_ = 0;
  std::vector<Worker> workers_;
  // The attempt's workers whose exec was not confirmed when they were started, by pid.
  std::map<pid_t, UnconfirmedExec> unconfirmed_;
  std::vector<FailureRecord> failures_;
  std::vector<pid_t> unkillable_;
  std::string end_message_;
  std::optional<TimerQueue::TimerId> grace_timer_;
  std::optional<TimerQueue::TimerId> final_timer_;
  TimePoint grace_deadline_{};
  TimePoint final_deadline_{};
  bool killed_ = false;  // SIGKILL already sent in this stop
  bool restart_pending_ = false;  // waiting for BeforeRestart's ready
  rdzv::Rendezvous* rdzv_ = nullptr;
  std::optional<rdzv::RoundInfo> round_;  // multi-node: the round being run
  // The round stopped while this attempt was already stopping (a success's sweep included): the
  // attempt's end joins the next round instead of reporting a success the round cannot take.
  bool round_stopped_ = false;
  // Multi-node: the wait for the processes of the attempt in workers_ to leave the GPUs (see the
  // top of this file). One wait per attempt: a join again while it is pending (the round stopped
  // before it started its workers) keeps it, and none follows its Ok until another attempt starts.
  struct GpuWait {
    uint64_t id = 0;           // the latest wait started; an answer that carries another id is stale
    bool pending = false;      // started and not answered (cleared by Finish: a later answer is dropped)
    bool released = false;     // answered Ok for the attempt in workers_
    bool round_ready = false;  // the round completed while pending: its workers start on Ok
  };
  GpuWait gpu_wait_;
  std::optional<rdzv::JobEnd> job_end_;
  EventSink* events_ = &NullEvents();
  int attempt_ = 0;  // the attempt_<n> number of the attempt running
  std::optional<TimerQueue::TimerId> deadline_timer_;
  bool deadline_reached_ = false;
  std::vector<int> running_at_deadline_;
  bool setup_failed_ = false;
  health::Monitor* health_ = nullptr;
  health::RestartPolicy restart_policy_;
  std::optional<TimerQueue::TimerId> backoff_timer_;
  TimePoint backoff_deadline_{};
  // Armed by the attempt's first exit 0 while other ranks run; cancelled when the attempt stops.
  std::optional<TimerQueue::TimerId> late_exit_timer_;
  TimePoint late_exit_deadline_{};
  Duration late_exit_after_{};
  std::string crash_loop_;
  // Set while the attempt waits (kPeerLossWait) after a failure that lost a peer; peer_loss_pid_
  // is that first failure.
  std::optional<TimerQueue::TimerId> peer_loss_timer_;
  pid_t peer_loss_pid_ = -1;
  bool peer_loss_on_nodes_ = false;  // the wait goes on for the rendezvous (multi-node)
};

}  // namespace ctrun
