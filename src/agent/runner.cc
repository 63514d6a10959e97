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
#include "report/run_summary.h"
#include "sys/event_loop.h"
#include "sys/posix_util.h"
#include "sys/signals.h"
#include "store/store_server.h"

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

class RealHooks final : public AgentHooks {
 public:
  RealHooks(const LaunchConfig& config, EventLoop& loop, Watchdog* watchdog)
      : config_(config), loop_(loop), watchdog_(watchdog) {}

  void set_drain(std::function<void()> drain) { drain_ = std::move(drain); }

  Status PrepareAttempt(int attempt, AttemptInfo* info) override {
    if (Status s = PrepareStore(info); !s.ok()) return s;
    Status s = PrepareErrorFiles(attempt, info);
    if (!s.ok()) return s;
    oom_before_ = ReadOomKillSample();
    return Status::Ok();
  }

  void OnWorkerStarted(int, const RankInfo&, SpawnedProcess& proc) override {
    if (watchdog_) watchdog_->AddGroup(proc.pid);
    if (proc.pidfd) {
      int fd = proc.pidfd.get();
      // Readable when the worker exits: the drain reaps it (and anything else that exited).
      loop_.AddFd(fd, EPOLLIN, [this](uint32_t) { drain_(); });
      pidfds_[proc.pid] = std::move(proc.pidfd);
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

  void Log(int level, const std::string& msg) override {
    if (level == 0) spdlog::info("{}", msg);
    else if (level == 1) spdlog::warn("{}", msg);
    else spdlog::error("{}", msg);
  }

  const std::optional<OomKillSample>& oom_before() const { return oom_before_; }

 private:
  // MASTER_ADDR/MASTER_PORT for the attempt. With the agent store (default) ctrun hosts the
  // workers' TCPStore itself: bound once before the first attempt, so no worker ever races for
  // the port, and emptied between attempts (torch >= 2.1 uses no per-attempt key prefix).
  // Standalone binds a free loopback port; otherwise --master_addr:--master_port, like torchrun's
  // static backend. Without it (--no-agent-store), worker rank 0 hosts the store, as in torch 1.13.
  Status PrepareStore(AttemptInfo* info) {
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

  Status PrepareErrorFiles(int attempt, AttemptInfo* info) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (base_dir_.empty()) {
      std::string tmpl = (fs::temp_directory_path(ec) / "torchelastic_XXXXXX").string();
      std::vector<char> buf(tmpl.begin(), tmpl.end());
      buf.push_back('\0');
      if (!::mkdtemp(buf.data())) return Status::Errno("mkdtemp " + tmpl, errno);
      base_dir_ = buf.data();
    }
    fs::path dir = fs::path(base_dir_) / ("attempt_" + std::to_string(attempt));
    fs::remove_all(dir, ec);
    info->error_files.clear();
    for (int i = 0; i < config_.nproc_per_node; ++i) {
      fs::create_directories(dir / std::to_string(i), ec);
      if (ec) return Status::Error("cannot create " + (dir / std::to_string(i)).string() + ": " + ec.message());
      info->error_files.push_back((dir / std::to_string(i) / "error.json").string());
    }
    return Status::Ok();
  }

  const LaunchConfig& config_;
  EventLoop& loop_;
  Watchdog* watchdog_;
  std::function<void()> drain_;
  std::map<pid_t, UniqueFd> pidfds_;
  std::string base_dir_;
  std::optional<OomKillSample> oom_before_;
  std::unique_ptr<store::StoreServer> store_;
};

std::string EntrypointName(const LaunchConfig& config) {
  return std::filesystem::path(config.entrypoint).filename().string();
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
  if (Status s = BecomeChildSubreaper(); !s.ok()) spdlog::warn("{} (grandchildren may outlive ctrun)", s.message());
  std::optional<Watchdog> watchdog;
  if (auto w = Watchdog::Start(); w.ok()) {
    watchdog.emplace(std::move(w.value()));
  } else {
    spdlog::warn("cannot start the watchdog: {}", w.message());
  }

  EventLoop loop;
  PosixSpawner spawner;
  RealHooks hooks(config, loop, watchdog ? &*watchdog : nullptr);
  Agent agent(config, context.environ, context.python_exec, spawner, loop, hooks);

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
  loop.AddFd(sigfd->fd(), EPOLLIN, [&](uint32_t) {
    for (int sig : sigfd->ReadPending()) {
      if (sig == SIGCHLD) drain();
      else agent.OnSignal(sig);
    }
  });

  agent.Start();
  while (!agent.done()) loop.RunOnce();

  // ---- report ----
  int code = agent.exit_code();
  if (!agent.failures().empty()) {
    std::vector<WorkerFailure> failures;
    auto oom_after = ReadOomKillSample();
    for (const auto& f : agent.failures()) {
      WorkerFailure w;
      w.global_rank = f.rank.global_rank;
      w.local_rank = f.local_rank;
      w.role_rank = f.rank.role_rank;
      w.pid = f.pid;
      w.status = f.status;
      w.time = f.time;
      w.error_file = f.error_file;
      w.stopped_by_ctrun = f.stopped_by_ctrun;
      w.oom_killed = LikelyOomKilled(f.status, f.stopped_by_ctrun, hooks.oom_before(), oom_after);
      w.stderr_tail = hooks.StderrTail(f.local_rank);
      failures.push_back(std::move(w));
    }
    LoadErrorFiles(&failures);
    std::sort(failures.begin(), failures.end(),
              [](const WorkerFailure& a, const WorkerFailure& b) { return a.global_rank < b.global_rank; });
    SummaryOptions opts;
    opts.oom_before = hooks.oom_before();
    opts.oom_after = oom_after;
    if (code >= 128 && code - 128 < NSIG && agent.failures().size() &&
        std::all_of(agent.failures().begin(), agent.failures().end(), [](const FailureRecord& f) { return f.stopped_by_ctrun; }))
      opts.stop_reason = "ctrun received signal " + std::to_string(code - 128) + " (" + SignalName(code - 128) + ")";
    bool signal_exit = !opts.stop_reason.empty();
    std::string text = FormatFailureSummary(EntrypointName(config), failures, context.hostname, opts);
    std::fflush(stdout);
    std::fputs(text.c_str(), stderr);
    if (!signal_exit) code = JobExitCode(failures);
    for (const auto& kv : context.environ)
      if (kv.rfind("TORCHELASTIC_ERROR_FILE=", 0) == 0)
        if (Status s = WriteAgentErrorFile(kv.substr(24), failures, opts); !s.ok())
          spdlog::warn("cannot write the agent's error file: {}", s.message());
  } else if (!agent.end_message().empty() && code != 0) {
    // Already logged by the agent (exec failure, prepare failure).
  }
  for (pid_t p : agent.unkillable()) spdlog::error("pid {} could not be killed (uninterruptible sleep?)", p);
  if (code != 0 && !agent.failures().empty()) {
    // nothing more
  } else if (code == 0) {
    spdlog::info("all workers finished successfully");
  }

  // Clean watchdog shutdown: 'Q', close, reap (it exits at once).
  if (watchdog) {
    watchdog.reset();
    int st;
    RetryOnEintr([&] { return ::waitpid(watchdog_pid, &st, 0); });
  }
  return code;
}

}  // namespace ctrun
