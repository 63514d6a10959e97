#include "agent/runner.h"

#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>

#include "agent/agent.h"
#include "base/unique_fd.h"
#include "process/reaper.h"
#include "process/spawner.h"
#include "process/watchdog.h"
#include "logs/log_dir.h"
#include "logs/output_plan.h"
#include "logs/output_relay.h"
#include "rendezvous/backend.h"
#include "report/run_summary.h"
#include "sys/event_loop.h"
#include "sys/posix_util.h"
#include "sys/signals.h"
#include "store/store_server.h"
#include "warm/warm_spawner.h"

namespace ctrun {
namespace {

// A free TCP port on addr, found by binding port 0. Racy by nature (torchrun does the same when
// workers host the store); the agent store avoids the race by keeping its socket bound.
int FindFreePort() {
  UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return 0;
  socklen_t len = sizeof a;
  ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

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
  return w;
}

class RealHooks final : public AgentHooks {
 public:
  RealHooks(const LaunchConfig& config, const RunContext& context, EventLoop& loop, Watchdog* watchdog,
            logs::LogDir& log_dir, logs::OutputRelay& relay)
      : config_(config), context_(context), loop_(loop), watchdog_(watchdog), log_dir_(log_dir), relay_(relay) {}

  void set_drain(std::function<void()> drain) { drain_ = std::move(drain); }

  Status PrepareAttempt(int attempt, AttemptInfo* info) override {
    if (Status s = PrepareStore(info); !s.ok()) return s;
    if (Status s = PrepareOutput(attempt, info); !s.ok()) return s;
    oom_before_ = ReadOomKillSample();
    return Status::Ok();
  }

  void ConfigureStdio(int local_rank, const RankInfo&, int, SpawnSpec* spec) override {
    const auto& plan = plans_[static_cast<size_t>(local_rank)];
    spec->stdout_target = plan.out.target;
    spec->stderr_target = plan.err.target;
  }

  void OnWorkerStarted(int local_rank, const RankInfo&, SpawnedProcess& proc) override {
    if (watchdog_) watchdog_->AddGroup(proc.pid);
    const auto& plan = plans_[static_cast<size_t>(local_rank)];
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

  void OnWorkerExited(int, pid_t pid) override {
    auto it = pidfds_.find(pid);
    if (it != pidfds_.end()) {
      loop_.RemoveFd(it->second.get());
      pidfds_.erase(it);
    }
  }

  void OnGroupGone(pid_t pgid) override {
    if (watchdog_) watchdog_->RemoveGroup(pgid);
  }

  // The live line that names the root cause, chosen as the summary chooses it (error-file times).
  void OnAttemptFailed(int restart_count, const std::vector<FailureRecord>& records) override {
    std::vector<WorkerFailure> failures;
    for (const auto& r : records) failures.push_back(ToWorkerFailure(r));
    LoadErrorFiles(&failures);
    const auto root = ChooseRootCause(failures);
    if (!root) return;
    const WorkerFailure& f = failures[*root];
    std::string what = f.error_data && !f.error_data->message.empty() ? f.error_data->message : "";
    what = what.substr(0, what.find('\n'));
    if (what.size() > 200) what = what.substr(0, 200) + "...";
    spdlog::error("attempt {} failed; root cause: worker rank {} (local_rank {}, pid {}) {}{}", restart_count,
                  f.global_rank, f.local_rank, f.pid, f.status.ToString(), what.empty() ? "" : ": " + what);
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
  Status PrepareStore(AttemptInfo* info) {
    if (round_) {
      info->master_addr = round_->master_addr;
      info->master_port = round_->master_port;
      info->use_agent_store = config_.agent_store;
      return Status::Ok();
    }
    info->master_addr = config_.standalone ? "127.0.0.1" : config_.master_addr;
    const int wanted_port = config_.standalone ? 0 : config_.master_port.value_or(29500);
    if (!config_.agent_store) {
      info->use_agent_store = false;
      info->master_port = wanted_port != 0 ? wanted_port : FindFreePort();
      if (info->master_port == 0) return Status::Error("cannot find a free port on 127.0.0.1");
      return Status::Ok();
    }
    if (!store_) {
      store::ServerOptions opts;
      opts.bind_host = config_.standalone ? "127.0.0.1" : config_.master_addr;
      opts.port = wanted_port;
      auto server = store::StoreServer::Start(loop_, opts);
      if (!server.ok())
        return Status::Error("cannot host the workers' store on " + opts.bind_host + ":" + std::to_string(wanted_port) +
                             ": " + server.message() +
                             (wanted_port ? " (is another job using this port? pick another --master_port)" : ""));
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
    in.host = context_.hostname.substr(0, context_.hostname.find('.'));
    if (round_)  // nodes may differ in nproc: ranks come from the round, not node_rank * nproc
      for (int i = 0; i < config_.nproc_per_node; ++i) in.global_ranks.push_back(round_->base_rank + i);
    in.paths = &paths_;
    auto plans = logs::PlanOutput(config_, context_.output_flags, in);
    if (!plans.ok()) return plans.status();
    plans_ = std::move(plans.value());
    info->error_files.clear();
    for (const auto& p : plans_) info->error_files.push_back(p.error_file);
    return Status::Ok();
  }

  void RelayStream(const logs::WorkerOutputPlan& plan, int local_rank, logs::Stream stream,
                   const logs::StreamPlan& sp, UniqueFd pipe) {
    if (!sp.relayed() || !pipe) return;
    auto sinks = logs::MakeSinks(plan, stream);
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
  std::function<void()> drain_;
  std::map<pid_t, UniqueFd> pidfds_;
  std::optional<OomKillSample> oom_before_;
  std::unique_ptr<store::StoreServer> store_;
  std::unique_ptr<store::StoreServer> next_store_;  // multi-node: advertised in the pending join
  std::optional<rdzv::RoundInfo> round_;
  std::string node_addr_;
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

std::string EntrypointName(const LaunchConfig& config) {
  return std::filesystem::path(config.entrypoint).filename().string();
}

// The one place that decides ctrun's exit code: a signal to ctrun, 128+signal; multi-node, the
// outcome the agents agreed on (or this agent's rendezvous error); single node, the root cause
// chosen with the error files' timestamps; otherwise what the agent ended with.
int DecideExitCode(const Agent& agent, const std::vector<WorkerFailure>& failures) {
  if (agent.ended_by_signal() != 0 || agent.multi_node() || failures.empty()) return agent.exit_code();
  return JobExitCode(failures);
}

std::vector<WorkerFailure> CollectFailures(const Agent& agent, RealHooks& hooks,
                                           const std::optional<OomKillSample>& oom_after) {
  std::vector<WorkerFailure> failures;
  for (const auto& f : agent.failures()) {
    WorkerFailure w = ToWorkerFailure(f);
    w.oom_killed = LikelyOomKilled(f.status, f.stopped_by_ctrun, hooks.oom_before(), oom_after);
    w.stderr_tail = hooks.StderrTail(f.local_rank);
    failures.push_back(std::move(w));
  }
  LoadErrorFiles(&failures);
  std::sort(failures.begin(), failures.end(),
            [](const WorkerFailure& a, const WorkerFailure& b) { return a.global_rank < b.global_rank; });
  return failures;
}

SummaryOptions MakeSummaryOptions(const Agent& agent, const RealHooks& hooks,
                                  const std::optional<OomKillSample>& oom_after) {
  SummaryOptions opts;
  opts.oom_before = hooks.oom_before();
  opts.oom_after = oom_after;
  if (const int sig = agent.ended_by_signal(); sig != 0) {
    opts.stop_reason = "ctrun received signal " + std::to_string(sig) + " (" + SignalName(sig) + ")";
  } else if (agent.job_end() && agent.job_end()->rendezvous_error) {
    opts.stop_reason = "the rendezvous failed: " + agent.job_end()->message;
  } else if (agent.job_end() && agent.job_end()->cause && !agent.job_end()->cause_is_local) {
    opts.remote_root_cause = agent.job_end()->cause->Describe();
    opts.stop_reason = "stopped because " + opts.remote_root_cause;
  }
  return opts;
}

// The end of the run for the user: the failure summary (torchrun's layout), the agent's own error
// file, the multi-node outcome. Returns ctrun's exit code.
int Report(const LaunchConfig& config, const RunContext& context, const Agent& agent, RealHooks& hooks) {
  // One reading of the OOM counter serves the per-worker verdicts and the summary's note.
  const std::optional<OomKillSample> oom_after = ReadOomKillSample();
  const std::vector<WorkerFailure> failures = CollectFailures(agent, hooks, oom_after);
  if (!failures.empty()) {
    const SummaryOptions opts = MakeSummaryOptions(agent, hooks, oom_after);
    std::string text = FormatFailureSummary(EntrypointName(config), failures, context.hostname, opts);
    std::fflush(stdout);
    std::fputs(text.c_str(), stderr);
    if (const std::string* path = context.env.Get("TORCHELASTIC_ERROR_FILE"))
      if (Status s = WriteAgentErrorFile(*path, failures, opts); !s.ok())
        spdlog::warn("cannot write the agent's error file: {}", s.message());
  }
  if (agent.multi_node() && agent.job_end() && agent.ended_by_signal() == 0) {
    const rdzv::JobEnd& end = *agent.job_end();
    if (end.cause && !end.cause_is_local && failures.empty())
      spdlog::error("the job failed on another node: {}", end.cause->Describe());
    else if (!end.rendezvous_error && end.exit_code != 0 && !end.cause)
      spdlog::error("{}", end.message);
  }
  return DecideExitCode(agent, failures);
}

warm::WarmOptions MakeWarmOptions(const LaunchConfig& config) {
  warm::WarmOptions o;
  o.preload = config.warm_preload;
  if (!config.numa_binding.empty()) o.cold_reason = "per-worker NUMA binding is requested";
  o.log = [](int level, const std::string& msg) {
    if (level >= 1) spdlog::warn("{}", msg);
    else if (level == 0) spdlog::info("{}", msg);
    else spdlog::debug("{}", msg);
  };
  return o;
}

}  // namespace

int RunJob(const LaunchConfig& config, const RunContext& context) {
  std::vector<int> handled = config.signals_to_handle;
  for (int s : config.forward_only_signals) handled.push_back(s);
  if (Status s = BlockAgentSignals(handled); !s.ok()) {
    spdlog::error("{}", s.message());
    return 1;
  }
  std::vector<int> fd_signals = handled;
  fd_signals.push_back(SIGCHLD);
  auto sigfd = SignalFd::Create(fd_signals);
  if (!sigfd.ok()) {
    spdlog::error("{}", sigfd.message());
    return 1;
  }
  RaiseFdLimit();
  if (Status s = BecomeChildSubreaper(); !s.ok()) spdlog::warn("{} (grandchildren may outlive ctrun)", s.message());
  std::optional<Watchdog> watchdog;
  if (auto w = Watchdog::Start(); w.ok()) {
    watchdog.emplace(std::move(w.value()));
  } else {
    spdlog::warn("cannot start the watchdog: {}", w.message());
  }

  auto log_dir = logs::LogDir::Create(config.log_dir, config.run_id);
  if (!log_dir.ok()) {
    spdlog::error("cannot create the log directory: {}", log_dir.message());
    return 1;
  }
  EventLoop loop;
  logs::ConsoleOptions console;
  console.route_diagnostics = true;
  // Declared after the loop: destroyed before it (it unregisters its fds).
  logs::OutputRelay relay(loop, console);
  PosixSpawner cold_spawner;
  std::optional<warm::WarmSpawner> warm_spawner;
  if (config.warm) warm_spawner.emplace(cold_spawner, MakeWarmOptions(config));
  Spawner& spawner = warm_spawner ? static_cast<Spawner&>(*warm_spawner) : cold_spawner;
  RealHooks hooks(config, context, loop, watchdog ? &*watchdog : nullptr, *log_dir, relay);
  Agent agent(config, context.env, context.executable, spawner, loop, hooks);
  rdzv::Backend backend;
  if (config.rdzv.multi_node) {
    auto b = rdzv::MakeBackend(config, loop, context.hostname);
    if (!b.ok()) {
      spdlog::error("{}", b.message());
      return rdzv::kExitRendezvous;
    }
    backend = std::move(b.value());
    hooks.set_node_addr(backend.node_addr);
    agent.AttachRendezvous(backend.rendezvous.get());
  }

  const pid_t watchdog_pid = watchdog ? watchdog->pid() : -1;
  auto drain = [&] {
    DrainExitedChildren([&](pid_t pid, ExitStatus st) {
      if (pid == watchdog_pid) {
        spdlog::warn("the watchdog exited unexpectedly ({})", st.ToString());
        return;
      }
      agent.OnChildExit(pid, st);
    });
  };
  hooks.set_drain(drain);
  // Without the signalfd in the loop no exit and no signal would ever reach the agent: ctrun
  // could not stop. Nothing has started yet, so the run ends here.
  if (Status s = loop.AddFd(sigfd->fd(), EPOLLIN,
                            [&](uint32_t) {
                              for (int sig : sigfd->ReadPending()) {
                                if (sig == SIGCHLD) drain();
                                else agent.OnSignal(sig);
                              }
                            });
      !s.ok()) {
    spdlog::error("cannot watch signals and child exits: {}", s.message());
    return 1;
  }

  agent.Start();
  while (!agent.done()) loop.RunOnce();
  if (backend.rendezvous) FinishRendezvous(loop, &backend);

  // Every worker is gone; whatever is still in their pipes (or held open by an escaped
  // descendant) is read now, bounded, so the last words of a crashing rank are never lost.
  relay.FlushAll(loop.Now() + std::chrono::seconds(2));

  const int code = Report(config, context, agent, hooks);
  // Exec and set-up failures were logged by the agent when they happened.
  for (pid_t p : agent.unkillable()) spdlog::error("pid {} could not be killed (uninterruptible sleep?)", p);
  if (code == 0) spdlog::info("all workers finished successfully");
  // The lines just logged went through the relay's console writer: drain it before it goes.
  relay.FlushAll(loop.Now() + std::chrono::seconds(1));

  // Clean watchdog shutdown: 'Q', close, reap (it exits at once).
  if (watchdog) {
    watchdog.reset();
    int st;
    RetryOnEintr([&] { return ::waitpid(watchdog_pid, &st, 0); });
  }
  return code;
}

}  // namespace ctrun
