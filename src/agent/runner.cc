#include "agent/runner.h"

#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>

#include "agent/agent.h"
#include "agent/death_cleanup.h"
#include "agent/job_outcome.h"
#include "agent/job_terminal.h"
#include "agent/launch_checks.h"
#include "agent/store_bind_error.h"
#include "agent/worker_env.h"
#include "health/health_monitor.h"
#include "base/shebang.h"
#include "base/unique_fd.h"
#include "process/descendants.h"
#include "gpu/gpu_release.h"
#include "placement/placement.h"
#include "process/reaper.h"
#include "process/spawner.h"
#include "process/watchdog.h"
#include "logs/log_dir.h"
#include "logs/output_plan.h"
#include "logs/output_relay.h"
#include "rendezvous/backend.h"
#include "report/run_recorder.h"
#include "report/run_summary.h"
#include "sys/cgroup.h"
#include "sys/event_loop.h"
#include "sys/fqdn.h"
#include "sys/free_port.h"
#include "sys/high_fd.h"
#include "sys/posix_util.h"
#include "sys/signals.h"
#include "store/store_server.h"
#include "warm/warm_spawner.h"

namespace ctrun {
namespace {

// The summary's view of the agent's failure records (error files not loaded yet).
WorkerFailure ToWorkerFailure(const FailureRecord& f) {
  WorkerFailure w;
  w.global_rank = f.rank.global_rank;
  w.local_rank = f.local_rank;
  w.role_rank = f.rank.role_rank;
  w.pid = f.pid;
  w.status = f.status;
  w.time = f.time;
  w.error_file = f.error_file;
  w.stopped_by_ctrun = f.stopped_by_ctrun;
  w.stop_sent = f.stop_sent;
  w.hang = f.hang;
  w.stacks = f.stacks;
  w.never_started = f.never_started;
  return w;
}

class RealHooks final : public AgentHooks {
 public:
  RealHooks(const LaunchConfig& config, const RunContext& context, EventLoop& loop, Watchdog* watchdog,
            logs::LogDir& log_dir, logs::OutputRelay& relay, std::unique_ptr<WorkerCgroups> cgroups)
      : config_(config),
        context_(context),
        loop_(loop),
        watchdog_(watchdog),
        log_dir_(log_dir),
        relay_(relay),
        cgroups_(std::move(cgroups)),
        placement_(context.placement) {
    if (placement_.debug_rank && placement_.debug_port == 0) placement_.debug_port = FindFreePort();
    if (context.gpu_driver && !context.gpu_indices.empty())
      gpu_release_ = std::make_unique<GpuReleaseWaiter>(*context.gpu_driver, context.gpu_indices, loop, ReadProcState,
                                                        GpuReleaseWaiter::Options{});
  }

  void set_drain(std::function<void()> drain) { drain_ = std::move(drain); }
  void set_terminal(JobTerminal* terminal) { terminal_ = terminal; }
  // A fresh base that will hold no log file goes whole after a success: a rank's empty directory
  // may go as soon as the rank has finished cleanly (logs::LogDir::ReleaseRank).
  void set_release_rank_dirs(bool on) { release_rank_dirs_ = on; }
  // --warm: the server and its waiting children outlive attempts; the sweep spares them.
  void set_warm(warm::WarmSpawner* warm) { warm_ = warm; }

  Status PrepareAttempt(int attempt, AttemptInfo* info) override {
    if (Status s = PrepareStore(info); !s.ok()) return s;
    if (Status s = PrepareOutput(attempt, info); !s.ok()) return s;
    oom_before_ = ReadOomKillSample();
    if (cgroups_) {
      if (Status s = cgroups_->PrepareAttempt(config_.nproc_per_node); !s.ok()) {
        spdlog::warn("cannot prepare the workers' cgroups ({}); leftovers are found through /proc instead",
                     s.message());
        cgroups_.reset();
      }
    }
    return Status::Ok();
  }

  void ConfigureStdio(int local_rank, const RankInfo&, int, SpawnSpec* spec) override {
    const auto& plan = plans_[static_cast<size_t>(local_rank)];
    spec->stdin_target = plan.in;
    spec->stdout_target = plan.out.target;
    spec->stderr_target = plan.err.target;
    if (cgroups_) {
      spec->cgroup_procs_fd = cgroups_->procs_fd(local_rank);
      spec->cgroup_dir_fd = cgroups_->dir_fd(local_rank);
    }
    if (watchdog_) spec->watchdog_fd = watchdog_->fd();
  }

  // What the attempt left behind outside the workers' process groups dies here: with a cgroup
  // sub-tree, whatever is still in it (one read of cgroup.events when nothing is); then, with or
  // without one, every remaining descendant of ctrun but the watchdog, the warm server (with its
  // waiting children) and what ctrun inherited (the rest are orphans of this attempt: every
  // worker leader is gone, and ctrun, their subreaper, adopted them; one may have left the
  // cgroup), found through /proc, which costs a scan of every process where the kernel has no
  // /proc/<pid>/task/<tid>/children. Bounded: 2 s each.
  void OnAttemptOver() override {
    rank_oom_kills_.clear();
    int leftover = 0;
    if (cgroups_) {
      WorkerCgroups::AttemptEnd end = cgroups_->EndAttempt(std::chrono::seconds(2));
      leftover += end.leftover;
      if (!end.emptied) spdlog::error("processes in {} survived SIGKILL (D state?); giving up on them", cgroups_->dir());
      for (size_t r = 0; r < end.memory_events_after.size(); ++r) {
        std::optional<uint64_t> before, after;
        if (end.memory_events_before[r]) before = ParseOomKillCounter(*end.memory_events_before[r]);
        if (end.memory_events_after[r]) after = ParseOomKillCounter(*end.memory_events_after[r]);
        rank_oom_kills_.push_back(before && after ? std::optional<uint64_t>(*after - *before) : std::nullopt);
      }
    }
    {  // with a cgroup too: a descendant can move itself out of it (setsid, then its own cgroup)
      std::vector<pid_t> keep = inherited_;
      if (watchdog_) keep.push_back(watchdog_->pid());
      if (warm_)
        for (pid_t p : warm_->SparedPids()) keep.push_back(p);
      const SweepResult swept = KillDescendants(keep, std::chrono::seconds(2));
      leftover += static_cast<int>(swept.killed.size());
      for (pid_t p : swept.survivors) spdlog::error("pid {} survived SIGKILL (D state?); giving up on it", p);
    }
    if (leftover > 0)
      spdlog::warn("killed {} process(es) the workers left running outside their process groups", leftover);
  }

  // Exact OOM verdict for a rank from its cgroup's memory.events (kills during the attempt);
  // nullopt when there is no per-rank memory accounting.
  std::optional<uint64_t> RankOomKills(int local_rank) const {
    if (local_rank < 0 || static_cast<size_t>(local_rank) >= rank_oom_kills_.size()) return std::nullopt;
    return rank_oom_kills_[static_cast<size_t>(local_rank)];
  }

  const std::string& log_run_dir() const { return log_dir_.run_dir(); }

  // Before the first worker: what ctrun already has below it (children of a shell that exec'd
  // it) is not the workers' and is never swept.
  void NoteInherited() {
    if (!cgroups_ && !ProcIsOurs())
      spdlog::warn("/proc shows another PID namespace than ctrun's (a PID namespace without its own /proc: "
                   "unshare --pid --fork without --mount-proc): processes the workers leave outside their "
                   "process groups cannot be found and are not killed");
    inherited_ = ListDescendants(::getpid());
    if (watchdog_) std::erase(inherited_, watchdog_->pid());
  }

  void ConfigureWorker(int local_rank, const RankInfo& rank, int attempt, SpawnSpec* spec) override {
    if (config_.report_bindings && attempt == 0)
      spdlog::info("binding: {}", FormatBinding(placement_, local_rank, rank));
    if (std::string notice = ApplyPlacement(placement_, local_rank, rank, spec); !notice.empty())
      spdlog::warn("{}", notice);
  }

  void BeforeRestart(const std::vector<pid_t>& worker_pids, std::function<void(Status)> ready) override {
    if (!gpu_release_) return ready(Status::Ok());
    const TimePoint start = loop_.Now();
    gpu_release_->Wait(worker_pids, [this, start, ready = std::move(ready)](Status s) {
      if (s.ok())
        spdlog::info("no process of the previous attempt is left on the GPUs (checked for {} ms)",
                     std::chrono::duration_cast<std::chrono::milliseconds>(loop_.Now() - start).count());
      ready(std::move(s));
    });
  }

  void OnWorkerStarted(int local_rank, const RankInfo& rank, SpawnedProcess& proc) override {
    if (UnderDebugger(placement_, rank) && placement_.gdbserver.empty())
      spdlog::warn("rank {} is stopped before exec, pid {}: attach with gdb -p {}, then continue", rank.global_rank,
                   proc.pid, proc.pid);
    const auto& plan = plans_[static_cast<size_t>(local_rank)];
    if (terminal_) terminal_->OnWorkerStarted(local_rank, plan, proc);  // before the relay takes the pty
    RelayStream(plan, local_rank, logs::Stream::kStdout, plan.out, std::move(proc.stdout_pipe));
    RelayStream(plan, local_rank, logs::Stream::kStderr, plan.err, std::move(proc.stderr_pipe));
    if (proc.pidfd) {
      int fd = proc.pidfd.get();
      // Readable when the worker exits: the drain reaps it (and anything else that exited).
      // Without it the exit is still seen, through SIGCHLD on the signalfd.
      if (Status s = loop_.AddFd(fd, EPOLLIN, [this](uint32_t) { drain_(); }); s.ok())
        pidfds_[proc.pid] = std::move(proc.pidfd);
      else
        spdlog::warn("worker pid {}: cannot watch its pidfd: {}; its exit is seen through SIGCHLD", proc.pid,
                     s.message());
    }
  }

  void OnWorkerExited(int local_rank, pid_t pid, const ExitStatus& status) override {
    auto it = pidfds_.find(pid);
    if (it != pidfds_.end()) {
      loop_.RemoveFd(it->second.get());
      pidfds_.erase(it);
    }
    // Its last lines are in its pipes already: shown before the agent says anything of its exit.
    relay_.CatchUp(local_rank);
    if (release_rank_dirs_ && status.success()) log_dir_.ReleaseRank(paths_.attempt, local_rank);
  }

  void OnGroupGone(pid_t pgid) override {
    if (watchdog_) watchdog_->RemoveGroup(pgid);
    if (terminal_) terminal_->OnGroupGone(pgid);
  }

  bool FailureLostAPeer(const FailureRecord& record) override {
    return LostAPeer(FailureFacts(record));
  }

  bool AnErrorFileRecordsAnOwnFailure(const std::vector<std::string>& error_files) override {
    for (const std::string& path : error_files) {
      WorkerFailure f;
      f.error_file = path;
      LoadErrorFile(&f);
      if (f.error_data && !LostAPeer(f)) return true;
    }
    return false;
  }

  // The live line that names the root cause, chosen as the summary chooses it (error-file times).
  void OnAttemptFailed(int restart_count, const std::vector<FailureRecord>& records) override {
    std::vector<WorkerFailure> failures;
    for (const auto& r : records) failures.push_back(FailureFacts(r));
    const auto root = ChooseRootCause(failures);
    if (!root) return;
    const WorkerFailure& f = failures[*root];
    std::string what = f.error_data && !f.error_data->message.empty() ? f.error_data->message : "";
    if (what.empty()) what = f.never_started;
    what = what.substr(0, what.find('\n'));
    if (what.size() > 200) what = what.substr(0, 200) + "...";
    // A rank that recorded its failure and was still exiting when ctrun's stop reached it: its
    // status is ctrun's signal, not what it did.
    const std::string how = !f.hang.empty()          ? f.hang
                            : FailedBeforeStop(f) ? "failed on its own and was then " + f.status.ToString() +
                                                        " as ctrun stopped the attempt"
                                                  : f.status.ToString();
    spdlog::error("attempt {} failed; root cause: worker rank {} (local_rank {}, pid {}) {}{}", restart_count,
                  f.global_rank, f.local_rank, f.pid, how,
                  what.empty() ? "" : ": " + what);
  }

  // What the root-cause choice reads of a failure, while the run goes on and for the summary: its
  // error file, and its stderr tail (which tells a lost peer when there is no error file).
  WorkerFailure FailureFacts(const FailureRecord& record) {
    WorkerFailure f = ToWorkerFailure(record);
    LoadErrorFile(&f);
    f.stderr_tail = StderrTail(record.local_rank);
    return f;
  }

  std::string StderrTail(int local_rank) override {
    if (static_cast<size_t>(local_rank) >= plans_.size()) return "";
    const auto& t = plans_[static_cast<size_t>(local_rank)].err.target;
    return relay_.StderrTail(local_rank, t.kind == StdioTarget::Kind::kFile ? t.path : "");
  }

  void Log(int level, const std::string& msg) override {
    if (level == 0) spdlog::info("{}", msg);
    else if (level == 1) spdlog::warn("{}", msg);
    else spdlog::error("{}", msg);
  }

  const std::optional<OomKillSample>& oom_before() const { return oom_before_; }
  // MASTER_PORT of the last attempt when ctrun hosted the workers' store there; 0 otherwise.
  int agent_store_port() const { return agent_store_port_; }

  // The current attempt's directory of a rank ("" when logs go nowhere).
  std::string RankDir(int local_rank) const {
    if (!paths_.files_enabled() || static_cast<size_t>(local_rank) >= paths_.ranks.size()) return "";
    return paths_.ranks[static_cast<size_t>(local_rank)].dir;
  }

  // Multi-node: this node's address as the others reach it (set once before the first join).
  void set_node_addr(std::string addr) { node_addr_ = std::move(addr); }

  // A fresh workers' store for every round this node joins: if the node becomes rank 0 it serves
  // it (its port travels in the join record, so no extra round trip), otherwise it is dropped.
  // Old workers' connections die with the previous round's store, so no key of an old attempt can
  // reach a new one, and no other node's keys are ever cleared.
  Status PrepareJoin(rdzv::NodeDesc* self) override {
    self->host = context_.hostname.substr(0, context_.hostname.find('.'));
    self->addr = node_addr_;
    next_store_.reset();
    const bool v6 = node_addr_.find(':') != std::string::npos;
    if (!config_.agent_store) {
      self->store_port = FindFreePort();
      return self->store_port ? Status::Ok() : Status::Error("cannot find a free port for the workers' store");
    }
    store::ServerOptions opts;
    opts.bind_host = v6 ? "::" : "0.0.0.0";
    opts.port = 0;
    auto server = store::StoreServer::Start(loop_, opts);
    if (!server.ok()) return Status::Error("cannot open the workers' store: " + server.message());
    next_store_ = std::move(server.value());
    self->store_port = next_store_->port();
    return Status::Ok();
  }

  void OnRound(const rdzv::RoundInfo& round) override {
    round_ = round;
    store_.reset();
    if (round.node_rank == 0) store_ = std::move(next_store_);
    next_store_.reset();
  }

 private:
  // MASTER_ADDR/MASTER_PORT for the attempt. With the agent store (default) ctrun hosts the
  // workers' TCPStore itself: bound once before the first attempt, so no worker ever races for
  // the port, and emptied between attempts (torch >= 2.1 uses no per-attempt key prefix).
  // Standalone binds a free loopback port; otherwise --master_addr:--master_port, like torchrun's
  // static backend. Without it (--no-agent-store), worker rank 0 hosts the store, as in torch 1.13.
  // (and notes the port when it is the agent store's, for the failure summary's hint).
  Status PrepareStore(AttemptInfo* info) {
    Status s = ChooseStore(info);
    agent_store_port_ = s.ok() && info->use_agent_store ? info->master_port : 0;
    return s;
  }

  Status ChooseStore(AttemptInfo* info) {
    if (round_) {
      info->master_addr = round_->master_addr;
      info->master_port = round_->master_port;
      info->use_agent_store = config_.agent_store;
      return Status::Ok();
    }
    const StoreBindContext where = SingleNodeStoreAddress(config_);
    info->master_addr = where.host;
    const int wanted_port = where.port;
    if (!config_.agent_store) {
      info->use_agent_store = false;
      info->master_port = wanted_port != 0 ? wanted_port : FindFreePort();
      if (info->master_port == 0) return Status::Error("cannot find a free port on 127.0.0.1");
      return Status::Ok();
    }
    if (!store_) {
      store::ServerOptions opts;
      opts.bind_host = where.host;
      opts.port = wanted_port;
      auto server = store::StoreServer::Start(loop_, opts);
      if (!server.ok()) return Status::Error(ExplainStoreBindFailure(where, server.message()));
      store_ = std::move(server.value());
      spdlog::debug("agent store listening on {}:{}", opts.bind_host, store_->port());
    } else {
      store_->Clear();
    }
    info->use_agent_store = true;
    info->master_port = store_->port();
    return Status::Ok();
  }

  // The attempt's log directory (attempt_<n>, recreated) and every worker's output plan: what
  // fd 1/2 become, what the relay copies where, and TORCHELASTIC_ERROR_FILE.
  Status PrepareOutput(int attempt, AttemptInfo* info) {
    auto paths = log_dir_.PrepareAttempt(attempt, config_.nproc_per_node);
    if (!paths.ok()) return paths.status();
    paths_ = std::move(paths.value());
    logs::PlanInputs in;
    in.nproc = config_.nproc_per_node;
    in.world_size = round_ ? round_->world_size : config_.max_nodes * config_.nproc_per_node;
    in.node_rank = round_ ? round_->node_rank : config_.node_rank;
    in.multi_node = config_.max_nodes > 1 || (round_ && round_->num_nodes > 1);
    in.relay_lone_stderr = config_.rdzv.multi_node;
    in.host = context_.hostname.substr(0, context_.hostname.find('.'));
    if (round_)  // nodes may differ in nproc: ranks come from the round, not node_rank * nproc
      for (int i = 0; i < config_.nproc_per_node; ++i) in.global_ranks.push_back(round_->base_rank + i);
    in.paths = &paths_;
    if (terminal_) {
      terminal_->OnNewAttempt();
      terminal_->FillPlanInputs(&in);
    }
    auto plans = logs::PlanOutput(config_, context_.output_flags, in);
    if (!plans.ok()) return plans.status();
    plans_ = std::move(plans.value());
    auto duplicates = logs::OpenDuplicateFiles(context_.output_flags, paths_);
    if (!duplicates.ok()) return duplicates.status();
    duplicates_ = std::move(duplicates.value());
    info->error_files.clear();
    for (const auto& p : plans_) info->error_files.push_back(p.error_file);
    // The next attempt's directories are made while this one starts and runs, when there can be
    // one: a restart then only renames them into place (logs/log_dir.h).
    if (config_.rdzv.multi_node || attempt < config_.max_restarts) log_dir_.MakeAhead(attempt + 1, config_.nproc_per_node);
    return Status::Ok();
  }

  void RelayStream(const logs::WorkerOutputPlan& plan, int local_rank, logs::Stream stream,
                   const logs::StreamPlan& sp, UniqueFd pipe) {
    if (!sp.relayed() || !pipe) return;
    auto sinks = logs::MakeSinks(plan, stream, duplicates_);
    if (!sinks.ok()) {
      spdlog::warn("rank {}: {}; its output goes nowhere", plan.global_rank, sinks.message());
      sinks = logs::Sinks{};
    }
    if (Status s = relay_.AddStream(local_rank, stream, std::move(pipe), std::move(sinks.value())); !s.ok())
      spdlog::warn("rank {}: cannot relay its output: {}", plan.global_rank, s.message());
  }

  const LaunchConfig& config_;
  const RunContext& context_;
  EventLoop& loop_;
  Watchdog* watchdog_;
  logs::LogDir& log_dir_;
  logs::OutputRelay& relay_;
  logs::AttemptPaths paths_;
  std::vector<logs::WorkerOutputPlan> plans_;
  logs::DuplicateFiles duplicates_;
  JobTerminal* terminal_ = nullptr;
  warm::WarmSpawner* warm_ = nullptr;
  std::function<void()> drain_;
  std::map<pid_t, UniqueFd> pidfds_;
  std::optional<OomKillSample> oom_before_;
  int agent_store_port_ = 0;
  bool release_rank_dirs_ = false;
  std::unique_ptr<store::StoreServer> store_;
  std::unique_ptr<store::StoreServer> next_store_;  // multi-node: advertised in the pending join
  std::optional<rdzv::RoundInfo> round_;
  std::string node_addr_;
  std::unique_ptr<WorkerCgroups> cgroups_;           // null: no cgroup v2 sub-tree (fallback)
  std::vector<pid_t> inherited_;  // ctrun's descendants before any worker: never swept

  std::vector<std::optional<uint64_t>> rank_oom_kills_;  // of the attempt that just ended
  PlacementPlan placement_;  // the context's, with the debug port chosen
  std::unique_ptr<GpuReleaseWaiter> gpu_release_;
};

// After the run: this agent's last transitions (a Leave after a signal) reach the log, and a
// rendezvous host keeps serving until the other agents have read the outcome and disconnected.
// Both bounded (2 s): the others read the outcome within a round trip of it being written, and a
// lost node's connection may never close.
void FinishRendezvous(EventLoop& loop, rdzv::Backend* backend) {
  const TimePoint drain_until = loop.Now() + std::chrono::seconds(2);
  while (!backend->rendezvous->idle() && loop.Now() < drain_until) loop.RunOnce(std::chrono::milliseconds(50));
  backend->rendezvous.reset();
  if (!backend->hosted_store) return;
  const TimePoint linger_until = loop.Now() + std::chrono::seconds(2);
  while (backend->hosted_store->num_connections() > 0 && loop.Now() < linger_until)
    loop.RunOnce(std::chrono::milliseconds(50));
  backend->hosted_store.reset();
}

// The summary's title, as torchrun names the entrypoint: the script, module or program as given
// on the command line, not its file name alone. A Python interpreter given with --no_python
// (`--no_python /usr/bin/python3 train.py`) is named by its first argument that is not an option,
// as torchrun does for its own interpreter. --run_path: torchrun's worker function.
std::string EntrypointName(const LaunchConfig& config) {
  if (config.run_path) return "run_script_path";
  if (!config.no_python || !IsPythonProgram(config.entrypoint)) return config.entrypoint;
  for (const std::string& a : config.args)
    if (!a.empty() && a[0] != '-') return a;
  return config.entrypoint;
}

std::vector<WorkerFailure> CollectFailures(const Agent& agent, RealHooks& hooks,
                                           const std::optional<OomKillSample>& oom_after) {
  std::vector<WorkerFailure> failures;
  for (const auto& f : agent.failures()) {
    WorkerFailure w = hooks.FailureFacts(f);
    if (const std::optional<uint64_t> kills = hooks.RankOomKills(f.local_rank))
      w.oom_killed = !f.stopped_by_ctrun && f.status.signaled() && f.status.signal() == SIGKILL && *kills > 0;
    else
      w.oom_killed = LikelyOomKilled(f.status, f.stopped_by_ctrun, hooks.oom_before(), oom_after);
    failures.push_back(std::move(w));
  }
  std::sort(failures.begin(), failures.end(),
            [](const WorkerFailure& a, const WorkerFailure& b) { return a.global_rank < b.global_rank; });
  return failures;
}

// A multi-node job can close with success (its last running nodes finished) while this node
// stops its workers for a new round: every failure here is then ctrun's stop, and no failure of
// the job. The summary would say FAILED.
bool StoppedWhenTheJobSucceeded(const Agent& agent, const std::vector<WorkerFailure>& failures) {
  const auto& end = agent.job_end();
  return agent.multi_node() && agent.ended_by_signal() == 0 && end && end->exit_code == 0 && !end->rendezvous_error &&
         !failures.empty() && std::all_of(failures.begin(), failures.end(), StoppedByCtrun);
}

SummaryOptions MakeSummaryOptions(const Agent& agent, const RealHooks& hooks,
                                  const std::optional<OomKillSample>& oom_after) {
  SummaryOptions opts;
  opts.single_node = !agent.multi_node();
  opts.oom_before = hooks.oom_before();
  opts.agent_store_port = hooks.agent_store_port();
  opts.oom_after = oom_after;
  if (const int sig = agent.ended_by_signal(); sig != 0) {
    opts.stop_reason = "ctrun received signal " + std::to_string(sig) + " (" + SignalName(sig) + ")";
  } else if (agent.deadline_reached()) {
    opts.stop_reason = agent.end_message();
  } else if (agent.job_end() && agent.job_end()->rendezvous_error) {
    opts.stop_reason = "the rendezvous failed: " + agent.job_end()->message;
  } else if (agent.job_end() && agent.job_end()->cause && !agent.job_end()->cause_is_local) {
    opts.remote_root_cause = agent.job_end()->cause->Describe();
    opts.stop_reason = "stopped because " + opts.remote_root_cause;
  } else if (agent.job_end() && agent.job_end()->cause && agent.job_end()->cause->rank >= 0) {
    opts.agreed_root_rank = agent.job_end()->cause->rank;  // on this node
  }
  return opts;
}

// The end of the run for the user: the failure summary (torchrun's layout), the agent's own error
// file, the multi-node outcome. Returns how the run ended (job_outcome.h decides). The summary
// goes to `console` (ctrun's stderr writer), behind every worker line already queued there, never
// inside one.
RunOutcome Report(const LaunchConfig& config, const RunContext& context, const Agent& agent, RealHooks& hooks,
                  logs::ConsoleWriter& console) {
  // One reading of the OOM counter serves the per-worker verdicts and the summary's note.
  const std::optional<OomKillSample> oom_after = ReadOomKillSample();
  const std::vector<WorkerFailure> failures = CollectFailures(agent, hooks, oom_after);
  if (StoppedWhenTheJobSucceeded(agent, failures)) {
    spdlog::info("the job succeeded on the other nodes while this node was stopping its {} worker(s) for a new "
                 "round; they did not fail",
                 failures.size());
  } else if (!failures.empty()) {
    SummaryOptions opts = MakeSummaryOptions(agent, hooks, oom_after);
    if (UsesPython(config)) {
      opts.python_interpreter = context.executable;
    } else if (std::string py = ShebangPython(context.executable, context.env.Get("PATH")); !py.empty()) {
      opts.python_interpreter = py;
      opts.python_from = InterpreterFrom::kShebang;
    }
    // torchrun's host field is socket.getfqdn() ("localhost" where the host name maps to it).
    std::string text = FormatFailureSummary(EntrypointName(config), failures, Fqdn(context.hostname), opts);
    std::fflush(stdout);
    console.WriteDiagnostic(text);
    if (const std::string* path = context.env.Get("TORCHELASTIC_ERROR_FILE"))
      if (Status s = WriteAgentErrorFile(*path, failures, opts); !s.ok())
        spdlog::warn("cannot write the agent's error file: {}", s.message());
  }
  if (!agent.crash_loop().empty()) spdlog::error("{}", agent.crash_loop());
  if (agent.multi_node() && agent.job_end() && agent.ended_by_signal() == 0) {
    const rdzv::JobEnd& end = *agent.job_end();
    // end.cause is the last round's failure: a job that then succeeded on a restart has one too.
    if (end.exit_code != 0 && end.cause && !end.cause_is_local && failures.empty())
      spdlog::error("the job failed on another node: {}", end.cause->Describe());
    else if (!end.rendezvous_error && end.exit_code != 0 && !end.cause)
      spdlog::error("{}", end.message);
  }
  return DecideJobOutcome(agent, failures);
}

// A run that ends before any worker: logged, then reported with the kind's exit code.
RunOutcome SetUpFailed(OutcomeKind kind, const std::string& message) {
  spdlog::error("{}", message);
  return EarlyOutcome(kind, message);
}

// Ctrl-Z (SIGTSTP to ctrun, the terminal's foreground job): the whole job stops. The workers'
// groups get SIGTSTP, ctrun's console output drains (bounded), then ctrun stops itself with
// SIGSTOP (SIGTSTP is blocked for the signalfd). The shell's `fg` (or any SIGCONT) continues
// ctrun right here: the workers get SIGCONT and the agent's pending deadlines move by the time
// the job stood still.
void SuspendJob(EventLoop& loop, Agent& agent, logs::OutputRelay& relay) {
  const int groups = agent.SuspendWorkers();
  spdlog::info("suspending the job: SIGTSTP to {} worker process group(s); 'fg' resumes it", groups);
  relay.stdout_console().Drain(loop.Now() + std::chrono::milliseconds(200));
  relay.stderr_console().Drain(loop.Now() + std::chrono::milliseconds(200));
  const TimePoint stopped_at = loop.Now();
  ::kill(::getpid(), SIGSTOP);  // returns once ctrun is continued
  const Duration suspended_for = loop.Now() - stopped_at;
  agent.ResumeWorkers(suspended_for);
  spdlog::info("resuming the job after {:.1f} s: SIGCONT to the worker process groups", ToSeconds(suspended_for));
}

bool Lists(const std::vector<int>& signals, int sig) { return std::find(signals.begin(), signals.end(), sig) != signals.end(); }

// A signal that stops the job (--signals-to-handle, not forward-only).
bool IsStoppingSignal(const LaunchConfig& config, int sig) {
  return Lists(config.signals_to_handle, sig) && !Lists(config.forward_only_signals, sig);
}

// The signals of the terminal and job control: ctrun's own (read on the signalfd) unless the
// user named them in --signals-to-handle / --forward-signals.
bool IsJobControlSignal(const LaunchConfig& config, int sig) {
  if (sig != SIGTSTP && sig != SIGCONT && sig != SIGWINCH) return false;
  return !Lists(config.signals_to_handle, sig) && !Lists(config.forward_only_signals, sig);
}

// Hang detection, when a heartbeat or output timeout is set; null otherwise.
std::unique_ptr<health::HealthMonitor> MakeHealthMonitor(const LaunchConfig& config, const RunContext& context,
                                                         EventLoop& loop, const RealHooks& hooks,
                                                         logs::OutputRelay& relay) {
  health::HangWatchOptions o;
  o.heartbeat = Seconds(config.heartbeat_timeout);
  o.first_heartbeat = Seconds(config.heartbeat_first_timeout);
  o.output = Seconds(config.output_timeout);
  if (!o.any()) return nullptr;
  auto monitor = std::make_unique<health::HealthMonitor>(
      loop, o, health::FindStackTools(context.env.Get("PATH"), context.env.Entries()), Seconds(config.stack_timeout),
      [&hooks](int local_rank) { return hooks.RankDir(local_rank); });
  if (o.output > Duration::zero()) relay.SetOnOutput([m = monitor.get()](int local_rank) { m->OnOutput(local_rank); });
  return monitor;
}

warm::WarmOptions MakeWarmOptions(const LaunchConfig& config) {
  warm::WarmOptions o;
  o.preload = config.warm_preload;
  if (!config.numa_binding.empty()) o.cold_reason = "per-worker NUMA binding is requested";
  o.max_attempts = config.rdzv.multi_node ? -1 : config.max_restarts + 1;
  o.log = [](int level, const std::string& msg) {
    if (level >= 1) spdlog::warn("{}", msg);
    else if (level == 0) spdlog::info("{}", msg);
    else spdlog::debug("{}", msg);
  };
  return o;
}

}  // namespace

RunOutcome RunJob(const LaunchConfig& config, const RunContext& context) {
  std::vector<int> handled = config.signals_to_handle;
  for (int s : config.forward_only_signals) handled.push_back(s);
  for (int s : {SIGTSTP, SIGCONT, SIGWINCH}) handled.push_back(s);
  // SIGTTIN blocked (not read): a read of the terminal from the background fails with EIO
  // instead of stopping ctrun alone (agent/stdin_forwarder.h). Workers get the original mask.
  std::vector<int> blocked = handled;
  blocked.push_back(SIGTTIN);
  if (Status s = BlockAgentSignals(blocked); !s.ok()) return SetUpFailed(OutcomeKind::kSetupError, s.message());
  std::vector<int> fd_signals = handled;
  fd_signals.push_back(SIGCHLD);
  auto sigfd = SignalFd::Create(fd_signals);
  if (!sigfd.ok()) return SetUpFailed(OutcomeKind::kSetupError, sigfd.message());
  RaiseFdLimit();
  // Before any thread of ctrun's own: see sys/high_fd.h.
  if (!ReserveHighFds()) spdlog::debug("no room above fd {}: every child copies ctrun's whole fd table", kHighFdLine);
  if (Status s = BecomeChildSubreaper(); !s.ok()) spdlog::warn("{} (grandchildren may outlive ctrun)", s.message());
  std::unique_ptr<WorkerCgroups> cgroups;
  if (const std::string* off = context.env.Get("CTRUN_NO_CGROUP"); off && *off == "1") {
    spdlog::debug("CTRUN_NO_CGROUP=1: no cgroup for the workers; leftovers are found through /proc");
  } else if (auto cg = WorkerCgroups::Create(); cg.ok()) {
    cgroups = std::move(cg.value());
    spdlog::debug("workers run in cgroup {}{}", cgroups->dir(), cgroups->per_rank_memory() ? " (per-rank memory.events)" : "");
  } else {
    spdlog::debug("no cgroup for the workers ({}); leftovers are found through /proc", cg.message());
  }
  auto log_dir = logs::LogDir::Create(config.log_dir, config.run_id);
  if (!log_dir.ok())
    return SetUpFailed(OutcomeKind::kSetupError, "cannot create the log directory: " + log_dir.message());
  if (!log_dir->notice().empty()) spdlog::warn("{}", log_dir->notice());
  // After the cgroup and the run directory: a SIGKILLed ctrun's watchdog empties and removes the
  // one, and removes the next attempt's directories made ahead (never used) from the other.
  std::optional<Watchdog> watchdog;
  const std::string cleanup_cgroup = cgroups ? cgroups->dir() : "";
  WatchdogCleanup cleanup{{cleanup_cgroup, log_dir->files_enabled() ? log_dir->run_dir() : ""}, &RunAgentDeathCleanup};
  if (auto w = Watchdog::Start(LocateWatchdogHelper(context.env.Get("CTRUN_WATCHDOG_HELPER")), std::move(cleanup));
      w.ok()) {
    watchdog.emplace(std::move(w.value()));
    if (!watchdog->why_forked().empty()) spdlog::debug("the watchdog is a fork of ctrun: {}", watchdog->why_forked());
  } else {
    spdlog::warn("cannot start the watchdog: {}", w.message());
  }
  // torchrun's default base (/tmp/torchelastic_XXXXXX) is never shown; ctrun names it when it
  // holds log files, and removes it at the end of a successful run that wrote none.
  const bool log_files = log_dir->files_enabled() && context.output_flags.WritesLogFiles();
  if (log_files && log_dir->temporary_base())
    spdlog::info("worker log files: {} (no --log_dir given: a new directory, kept after the run)", log_dir->run_dir());
  EventLoop loop;
  logs::ConsoleOptions console;
  console.route_diagnostics = true;
  // Declared after the loop: destroyed before it (it unregisters its fds).
  logs::OutputRelay relay(loop, console);
  PosixSpawner cold_spawner;
  std::optional<warm::WarmSpawner> warm_spawner;
  if (config.warm) warm_spawner.emplace(cold_spawner, MakeWarmOptions(config));
  Spawner& spawner = warm_spawner ? static_cast<Spawner&>(*warm_spawner) : cold_spawner;
  JobTerminal terminal(config.tty, loop, spawner);
  RealHooks hooks(config, context, loop, watchdog ? &*watchdog : nullptr, *log_dir, relay, std::move(cgroups));
  hooks.NoteInherited();
  hooks.set_release_rank_dirs(log_dir->temporary_base() && !log_files);
  hooks.set_terminal(&terminal);
  if (warm_spawner) hooks.set_warm(&*warm_spawner);
  Agent agent(config, context.env, context.executable, spawner, loop, hooks);
  // The summary's per-rank facts come from the same events the events file gets.
  RunRecorder recorder;
  TeeEventSink event_tee({context.events, &recorder});
  agent.SetEventSink(&event_tee);
  // Declared after the loop and the relay: destroyed before them.
  std::unique_ptr<health::HealthMonitor> health = MakeHealthMonitor(config, context, loop, hooks, relay);
  if (health) agent.AttachHealth(health.get());
  rdzv::Backend backend;
  if (config.rdzv.multi_node) {
    if (Status st = rdzv::MakeBackend(config, loop, context.hostname, &backend); !st.ok())
      return SetUpFailed(OutcomeKind::kRendezvousError, st.message());
    hooks.set_node_addr(backend.node_addr);
    agent.AttachRendezvous(backend.rendezvous.get());
  }

  const pid_t watchdog_pid = watchdog ? watchdog->pid() : -1;
  bool watchdog_reaped = false;
  auto drain = [&] {
    DrainExitedChildren([&](pid_t pid, ExitStatus st) {
      if (pid == watchdog_pid) {
        watchdog_reaped = true;
        if (watchdog)
          spdlog::warn("the watchdog (pid {}) exited unexpectedly ({}): if ctrun is now SIGKILLed, the workers' "
                       "children outlive it",
                       pid, st.ToString());
        return;
      }
      agent.OnChildExit(pid, st);
    });
    DrainStoppedChildren([&](pid_t pid, int sig) { agent.OnChildStopped(pid, sig); });
  };
  hooks.set_drain(drain);
  RepeatedSignalFilter repeats(std::chrono::seconds(1), ::getppid());
  // Without the signalfd in the loop no exit and no signal would ever reach the agent: ctrun
  // could not stop. Nothing has started yet, so the run ends here.
  if (Status s = loop.AddFd(sigfd->fd(), EPOLLIN,
                            [&](uint32_t) {
                              for (const ReadSignal& read : sigfd->ReadPending()) {
                                const int sig = read.signo;
                                if (sig == SIGCHLD) drain();
                                else if (IsStoppingSignal(config, sig) &&
                                         repeats.IsRepeat(read, std::chrono::steady_clock::now()))
                                  agent.OnRepeatedSignal(sig, repeats.FromParent(read)
                                                                  ? "from ctrun's parent (pid " + std::to_string(read.sender) + ") at once"
                                                                  : "from pid " + std::to_string(read.sender) + " again at once");
                                else if (!IsJobControlSignal(config, sig)) agent.OnSignal(sig);
                                else if (sig == SIGWINCH) terminal.OnWindowChanged();
                                else if (sig == SIGCONT) terminal.OnContinued();
                                else if (!agent.done()) SuspendJob(loop, agent, relay);
                              }
                            });
      !s.ok())
    return SetUpFailed(OutcomeKind::kSetupError, "cannot watch signals and child exits: " + s.message());

  agent.Start();
  // The empty cgroups of earlier ctruns killed together with their watchdogs: removed once this
  // job's first workers are on their way, off the path to their start.
  if (!cleanup_cgroup.empty()) RemoveStaleWorkerCgroups(cleanup_cgroup);
  while (!agent.done()) loop.RunOnce();
  // Every worker group is gone: the watchdog has nothing left to guard. Its clean shutdown ('Q',
  // close) goes now, so that its wake-up and exit overlap the rest of the teardown instead of
  // being waited for at the very end (~0.9 ms of a launch of 8 on the development VM).
  watchdog.reset();
  if (backend.rendezvous) FinishRendezvous(loop, &backend);

  // Every worker is gone; whatever is still in their pipes (or held open by an escaped
  // descendant) is read now, bounded, so the last words of a crashing rank are never lost, and
  // all of it reaches the console before the summary, however slow its reader. A stopping signal
  // (--signals-to-handle) cuts that wait short: readable on this signalfd of its own, which
  // SIGCHLD does not wake. Without one the wait is for the reader alone, as a worker's would be.
  // A run that a signal stopped already got the one it waits for: its console wait is bounded
  // (2 s) too, or a reader that stalls would keep ctrun past a SIGTERM meant to end it.
  auto stop_signals = SignalFd::Create(config.signals_to_handle);
  const int stop_fd = stop_signals.ok() ? stop_signals->fd() : -1;
  const bool signalled = agent.ended_by_signal() != 0;
  const TimePoint flush_deadline = loop.Now() + std::chrono::seconds(2);
  relay.FlushAll(flush_deadline, stop_fd, signalled ? flush_deadline : TimePoint::max());

  RunOutcome outcome = Report(config, context, agent, hooks, relay.stderr_console());
  recorder.Fill(&outcome);
  const int code = outcome.exit_code;
  // A fresh base is kept when it holds log files, or when the run failed after an attempt ran (or
  // with a file in it): the summary names error files and saved stacks there, and its attempt
  // directories show what ran. A successful run's base, or that of a run that failed before any
  // worker (a rendezvous that never completed), holds nothing anyone will read: removed.
  // Looked at once, and only where it decides something: a failed run's fresh base without log files.
  // A base about to be removed that holds a file after all (an earlier attempt's error file, or
  // anything a worker wrote there) is kept: ctrun removes directories, never a file.
  const bool error_files = log_dir->temporary_base() && !log_files && code != 0 && logs::HoldsAFile(log_dir->run_dir());
  bool keep_base = log_files || (code != 0 && (outcome.attempts > 0 || error_files));
  bool holds_files = false;
  if (log_dir->temporary_base() && !keep_base) {
    StatusOr<bool> removed = log_dir->RemoveTemporaryBase();
    if (!removed.ok()) spdlog::warn("{}", removed.message());
    keep_base = holds_files = removed.ok() && !*removed;
  }
  if (holds_files) {
    const std::string example = logs::FirstFileUnder(log_dir->run_dir());
    spdlog::info("this run's log directory is kept: it holds files{}: {}", example.empty() ? "" : " (" + example + ", ...)",
                 log_dir->run_dir());
  } else if (keep_base || !log_dir->temporary_base()) {
    // A kept run directory holds only attempts that ran, and every directory of them.
    if (Status s = log_dir->RestoreReleased(); !s.ok()) spdlog::warn("{}", s.message());
    if (Status s = log_dir->DropAhead(); !s.ok()) spdlog::warn("{}", s.message());
    if (log_dir->temporary_base())
      spdlog::info("{} {}", log_files     ? "worker log files are in"
                            : error_files ? "error files of this run are in"
                                          : "no worker wrote an error file; this run's log directory is kept:",
                   log_dir->run_dir());
  }
  if (log_dir->files_enabled() && (keep_base || !log_dir->temporary_base())) outcome.log_dir = log_dir->run_dir();
  // Exec and set-up failures were logged by the agent when they happened.
  for (pid_t p : agent.unkillable()) spdlog::error("pid {} could not be killed (uninterruptible sleep?)", p);
  if (code == 0 && agent.failures().empty())
    spdlog::info(outcome.attempts > 0 ? "all workers finished successfully"
                                      : "the job succeeded while this node waited to join it; no worker ran here");
  // The lines just logged went through the relay's console writer: drain it before it goes.
  // What never reached the console is said (on stderr, when that one still works).
  const TimePoint last_deadline = loop.Now() + std::chrono::seconds(1);
  if (const size_t lost = relay.FlushAll(last_deadline, stop_fd, signalled ? last_deadline : TimePoint::max()); lost > 0) {
    spdlog::warn("{} bytes of output could not be written to the console: its reader went away, or a signal cut "
                 "the final wait for it short",
                 lost);
    relay.stderr_console().Drain(loop.Now() + std::chrono::seconds(1));  // bounded, even after a signal
  }

  // The watchdog was told to go when the agent was done; reaped here unless the drain did.
  if (watchdog_pid > 0 && !watchdog_reaped) {
    int st;
    RetryOnEintr([&] { return ::waitpid(watchdog_pid, &st, 0); });
  }
  return outcome;
}

}  // namespace ctrun
