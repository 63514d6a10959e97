#include "warm/warm_spawner.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "base/environment.h"
#include "ctrun/heartbeat.h"
#include "ctrun/warm_main.h"
#include "process/stdio_plumbing.h"
#include "process/watchdog.h"
#include "sys/fd_passing.h"
#include "sys/pidfd.h"
#include "sys/posix_util.h"
#include "sys/signals.h"
#include "warm/native_opt_in.h"

namespace ctrun::warm {
namespace {

using nlohmann::json;

// The -c line: runs the script that follows it under a file name tracebacks can skip.
constexpr const char* kBootstrap = "import sys;exec(compile(sys.argv.pop(1),'<ctrun-warm>','exec'))";
constexpr int kServerFd = 3;
constexpr size_t kMaxMessage = 1 << 16;  // the server's messages are a few hundred bytes
// A worker's spec: the most a waiting child reads (warm_main.cc, warm_server.py), and the send
// buffer a spec up to that size needs above the default.
constexpr size_t kMaxSpec = 1 << 22;
constexpr size_t kDefaultSendBuffer = 128 << 10;

int MillisLeft(TimePoint deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(std::min<long long>(left.count(), 1 << 30));
}

bool Exited(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return RetryOnEintr([&] { return ::poll(&p, 1, 0); }) != 0;
}

// The server's process: its own group, PDEATHSIG, defaults for signals, the control socket as fd 3
// and nothing else beyond 0-2. Async-signal-safe calls only after fork.
StatusOr<pid_t> ForkServer(const std::string& path, const std::vector<std::string>& args,
                           const std::vector<std::string>& env, int sock) {
  std::vector<char*> argv, envp;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const sigset_t& mask = OriginalSignalMask();
  const sigset_t ignored = IgnoredSignals();
  struct rlimit nofile;
  const bool restore_nofile = OriginalFdLimit(&nofile);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return Status::Error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);
    if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != parent) ::_exit(127);
    CloexecFrom3();
    if (sock == kServerFd) ::fcntl(kServerFd, F_SETFD, 0);
    else if (::dup2(sock, kServerFd) < 0) ::_exit(127);
    ResetChildSignals(ignored, mask);
    if (restore_nofile) ::setrlimit(RLIMIT_NOFILE, &nofile);
    ::execve(path.c_str(), argv.data(), envp.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);
  return pid;
}

void KillAndReap(pid_t pid, const UniqueFd& pidfd) {
  if (pidfd) (void)PidfdSignal(pidfd, SIGKILL);
  else if (pid > 0) ::kill(pid, SIGKILL);
  if (pidfd) {
    pollfd p{pidfd.get(), POLLIN, 0};
    RetryOnEintr([&] { return ::poll(&p, 1, 1000); });  // bounded: SIGKILL of a sleeping process
  }
  int st;
  ::waitpid(pid, &st, WNOHANG);  // may already have been reaped by the agent's drain: ECHILD
}

// The server's third argument (warm_server.py's TARGET): the script, "-m:<module>", or for a -c
// launch "-c:<the argument after the code>" (--run_path's script, what @script preloading reads).
std::string ServerTarget(const WarmLaunch& launch) {
  if (launch.module) return "-m:" + launch.target;
  if (launch.code) return "-c:" + launch.target;
  return launch.target;
}

}  // namespace

WarmSpawner::WarmSpawner(Spawner& cold, WarmOptions options) : cold_(cold), options_(std::move(options)) {
  if (!options_.log) options_.log = [](int, const std::string&) {};
  // The server's children reach ctrun through the subreaper: without it ctrun could not reap them.
  int subreaper = 0;
  if (options_.cold_reason.empty() && (::prctl(PR_GET_CHILD_SUBREAPER, &subreaper) != 0 || !subreaper))
    options_.cold_reason = "ctrun is not a child subreaper, so it could not reap forked workers";
  if (!options_.cold_reason.empty()) Disable(options_.cold_reason);
}

WarmSpawner::~WarmSpawner() {
  // Waiting children exit on EOF of their socket; SIGKILL makes it immediate and reapable now.
  for (auto& c : pool_) {
    c.sock.reset();
    KillAndReap(c.pid, c.pidfd);
  }
  StopServer();
}

void WarmSpawner::Warn(const std::string& reason) {
  if (warned_.insert(reason).second) options_.log(1, "--warm: " + reason);
}

void WarmSpawner::Disable(const std::string& reason) {
  Warn(reason + "; workers start cold");
  disabled_ = true;
  for (auto& c : pool_) KillAndReap(c.pid, c.pidfd);
  pool_.clear();
  StopServer();
}

void WarmSpawner::StopServer() {
  if (!server_) return;
  server_->ctl.reset();  // the server exits on EOF
  KillAndReap(server_->pid, server_->pidfd);
  server_.reset();
}

bool WarmSpawner::Spawn(const SpawnSpec& spec, SpawnedProcess* out, SpawnError* error) {
  std::vector<SpawnResult> results;
  SpawnMany({spec}, &results);
  if (results[0].ok) *out = std::move(results[0].process);
  else *error = std::move(results[0].error);
  return results[0].ok;
}

void WarmSpawner::SpawnMany(const std::vector<SpawnSpec>& specs, std::vector<SpawnResult>* results) {
  last_warm_ = 0;
  ++attempts_;
  results->clear();
  results->resize(specs.size());
  std::vector<bool> warm(specs.size(), false);
  if (!disabled_ && !specs.empty()) {
    if (std::string why = Prepare(specs); !why.empty()) {
      if (!disabled_) Warn(why + "; this attempt starts cold");  // else Disable said it for the job
    } else {
      for (size_t i = 0; i < specs.size(); ++i) {
        for (Handed h = Handed::kNextChild; !pool_.empty() && h == Handed::kNextChild;) {
          Child c = std::move(pool_.front());
          pool_.erase(pool_.begin());
          h = Hand(c, specs[i], &(*results)[i].process);
          warm[i] = h == Handed::kWarm;
        }
      }
      // The next attempt's children, forked while this one runs, when there can be one.
      const bool another = options_.max_attempts < 0 || attempts_ < options_.max_attempts;
      if (another && server_ && Send(json{{"op", "fork"}, {"n", specs.size()}}.dump()).ok())
        server_->pending += specs.size();
    }
  }
  std::vector<SpawnSpec> cold_specs;
  std::vector<size_t> cold_index;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (warm[i]) {
      (*results)[i].ok = true;
      ++last_warm_;
    } else {
      cold_specs.push_back(specs[i]);
      cold_index.push_back(i);
    }
  }
  if (!disabled_ && last_warm_ > 0 && !cold_specs.empty())
    Warn(std::to_string(cold_specs.size()) + " worker(s) of this attempt started cold (waiting children were gone)");
  if (cold_specs.empty()) return;
  std::vector<SpawnResult> cold_results;
  cold_.SpawnMany(cold_specs, &cold_results);
  for (size_t k = 0; k < cold_index.size(); ++k) (*results)[cold_index[k]] = std::move(cold_results[k]);
}

std::string WarmSpawner::Prepare(const std::vector<SpawnSpec>& specs) {
  std::optional<WarmLaunch> launch = ParsePythonLaunch(specs[0]);
  if (!launch && OptsIntoWarm(ExecutableOf(specs[0]))) launch = NativeLaunch(specs[0]);
  if (!launch) return NotWarmEntrypoint(specs[0]);
  std::error_code ec;
  const std::string cwd = std::filesystem::current_path(ec).string();
  for (const auto& s : specs)
    if (std::string why = NotUtf8(s, cwd); !why.empty()) return why;
  const TimePoint deadline = std::chrono::steady_clock::now() + options_.fork_wait;
  if (server_) {
    // One round trip: preloaded files unchanged on disk, still one thread, no CUDA.
    auto reply = Send(json{{"op", "check"}}.dump()).ok() ? Await("check", deadline)
                                                         : StatusOr<Message>(Status::Error("the warm server is gone"));
    if (!reply.ok()) {
      Warn(reply.message() + "; restarting it");
      for (auto& c : pool_) KillAndReap(c.pid, c.pidfd);
      pool_.clear();
      StopServer();
    } else {
      json j = json::parse(reply.value().text, nullptr, false);
      const std::string stale = j.is_object() ? j.value("stale", "") : "";
      const std::string problem = j.is_object() ? j.value("problem", "") : "";
      if (!problem.empty()) {
        Disable(problem);
        return problem;
      }
      if (!stale.empty()) {
        options_.log(1, "--warm: " + stale + " changed on disk; restarting the warm server");
        for (auto& c : pool_) KillAndReap(c.pid, c.pidfd);
        pool_.clear();
        StopServer();
      }
    }
  }
  if (server_) {
    for (const auto& s : specs)
      if (std::string why = WarmMismatch(server_->identity, s); !why.empty()) return why;
  } else {
    const ServerIdentity identity = IdentityOf(*launch, CommonEnv(specs));
    for (const auto& s : specs)
      if (std::string why = WarmMismatch(identity, s); !why.empty()) return why;
    if (Status st = StartServer(specs, *launch); !st.ok()) {
      Disable(st.message());
      return st.message();
    }
  }
  if (Status st = FillPool(specs.size(), std::chrono::steady_clock::now() + options_.fork_wait); !st.ok()) {
    Disable(st.message());
    return st.message();
  }
  return "";
}

Status WarmSpawner::StartServer(const std::vector<SpawnSpec>& specs, const WarmLaunch& launch) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
    return Status::Error(std::string("cannot start the warm server: socketpair: ") + std::strerror(errno));
  UniqueFd ours(sv[0]), theirs(sv[1]);
  std::vector<std::string> args;
  const std::vector<std::string> env = CommonEnv(specs);
  // The workers' heartbeat fd number is the server's control socket (kServerFd): the server has
  // no heartbeat channel, and a worker library that asked for one before main would take the
  // control socket for it (made non-blocking, beats written into it). Each worker's own
  // CTRUN_HEARTBEAT_FD and CTRUN_HEARTBEAT_ID come in its spec's env, its socket with the spec
  // (SCM_RIGHTS: the same file, so the ID still matches at fd 3 of the forked worker).
  std::vector<std::string> server_env = env;
  EraseEntries(&server_env, worker::kHeartbeatFdVariable);
  EraseEntries(&server_env, worker::kHeartbeatIdVariable);
  if (launch.native) {
    // The binary as the first worker, told to serve (include/ctrun/warm_main.h).
    args = specs[0].argv;
    server_env.insert(server_env.begin(), std::string(worker::kWarmServerVariable) + "=" +
                                              std::to_string(kServerFd) + ":" + std::to_string(::getpid()));
  } else {
    args = {launch.program};
    args.insert(args.end(), launch.flags.begin(), launch.flags.end());
    args.insert(args.end(), {"-c", kBootstrap, kWarmServerSource, std::to_string(kServerFd),
                             json(options_.preload).dump(), ServerTarget(launch)});
  }
  const auto started = std::chrono::steady_clock::now();
  auto pid = ForkServer(launch.program, args, server_env, theirs.get());
  if (!pid.ok()) return Status::Error("cannot start the warm server: " + pid.message());
  theirs.reset();
  Server s;
  s.pid = pid.value();
  s.pidfd = PidfdOpen(s.pid);
  s.ctl = std::move(ours);
  s.identity = IdentityOf(launch, env);
  server_ = std::move(s);
  auto ready = Await("ready", started + options_.start_wait);
  if (!ready.ok()) {
    StopServer();
    return Status::Error("the warm server did not start: " + ready.message());
  }
  json j = json::parse(ready.value().text, nullptr, false);
  const std::string problem = j.is_object() ? j.value("problem", "") : "";
  if (!problem.empty()) {
    StopServer();
    return Status::Error(problem);
  }
  options_.log(0, "--warm: worker server pid " + std::to_string(server_->pid) +
                      (launch.native ? " (" + launch.program + ", CTRUN_MAIN) loaded"
                                     : " preloaded " + json(options_.preload).dump()) +
                      " in " +
                      std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                         std::chrono::steady_clock::now() - started)
                                         .count()) +
                      " ms");
  return Status::Ok();
}

Status WarmSpawner::Send(const std::string& text) {
  if (!server_ || !server_->ctl) return Status::Error("the warm server is gone");
  if (!SendWithFds(server_->ctl.get(), text, {})) return Status::Error("the warm server is gone");
  return Status::Ok();
}

StatusOr<WarmSpawner::Message> WarmSpawner::ReadOne(TimePoint deadline) {
  if (!server_ || !server_->ctl) return Status::Error("the warm server is gone");
  pollfd p{server_->ctl.get(), POLLIN, 0};
  const int r = RetryOnEintr([&] { return ::poll(&p, 1, MillisLeft(deadline)); });
  if (r == 0) return Status::Error("no answer from the warm server in time");
  Message m;
  const ssize_t n = ReceiveWithFds(server_->ctl.get(), kMaxMessage, &m.text, &m.fds);
  if (n <= 0) return Status::Error("the warm server exited");
  json j = json::parse(m.text, nullptr, false);
  m.op = j.is_object() ? j.value("op", "") : "";
  return m;
}

void WarmSpawner::Absorb(Message& m) {
  json j = json::parse(m.text, nullptr, false);
  if (m.op == "child" && m.fds.size() == 2) {
    if (server_->pending > 0) --server_->pending;
    Child c;
    c.pid = j.value("pid", -1);
    c.pidfd = std::move(m.fds[0]);
    c.sock = std::move(m.fds[1]);
    pool_.push_back(std::move(c));
  } else if (m.op == "unsafe") {
    server_->pending = 0;
    problem_ = j.value("problem", "the warm server refused to fork");
  }
}

StatusOr<WarmSpawner::Message> WarmSpawner::Await(const std::string& op, TimePoint deadline) {
  while (true) {
    auto m = ReadOne(deadline);
    if (!m.ok()) return m.status();
    if (m.value().op == op) return m;
    Absorb(m.value());
  }
}

std::vector<pid_t> WarmSpawner::SparedPids() {
  std::vector<pid_t> out;
  if (!server_) return out;
  const TimePoint deadline = std::chrono::steady_clock::now() + options_.fork_wait;
  while (server_->pending > 0 && problem_.empty()) {  // only its arrival names a child
    auto m = ReadOne(deadline);
    if (!m.ok()) break;  // a server that does not answer is not spared for long: it is restarted
    Absorb(m.value());
  }
  out.push_back(server_->pid);
  for (const Child& c : pool_) out.push_back(c.pid);
  return out;
}

Status WarmSpawner::FillPool(size_t n, TimePoint deadline) {
  // Children that died while waiting (reaped by the agent as unknown pids) are dropped.
  std::erase_if(pool_, [](const Child& c) { return !c.pidfd || Exited(c.pidfd.get()); });
  if (pool_.size() + server_->pending < n) {
    const size_t more = n - pool_.size() - server_->pending;
    if (Status s = Send(json{{"op", "fork"}, {"n", more}}.dump()); !s.ok()) return s;
    server_->pending += more;
  }
  while (pool_.size() < n) {
    if (!problem_.empty()) return Status::Error(problem_);
    auto m = ReadOne(deadline);
    if (!m.ok()) return Status::Error("waiting for the warm server's children: " + m.message());
    Absorb(m.value());
  }
  return Status::Ok();
}

WarmSpawner::Handed WarmSpawner::Hand(Child& child, const SpawnSpec& spec, SpawnedProcess* out) {
  if (!child.pidfd || Exited(child.pidfd.get())) return Handed::kNextChild;
  StdioPlumbing in_p, out_p, err_p;
  std::string what;
  if (!PrepareStdio(spec.stdin_target, /*input=*/true, &in_p, &what) ||
      !PrepareStdio(spec.stdout_target, /*input=*/false, &out_p, &what) ||
      !PrepareStdio(spec.stderr_target, /*input=*/false, &err_p, &what)) {
    Warn("cannot prepare a worker's stdio (" + what + ": " + std::strerror(errno) + ")");
    return Handed::kNextChild;
  }
  // Each of fds 0-2 goes to the child at its number, or is closed there: an inherited one that
  // ctrun got closed (its slot then holds one of ctrun's own fds, all close-on-exec) is closed in
  // a cold worker by its exec.
  std::vector<int> fds, targets, closed;
  const StdioPlumbing* plumbing[] = {&in_p, &out_p, &err_p};
  for (int target = 0; target < 3; ++target) {
    const UniqueFd& end = plumbing[target]->child_end;
    const int flags = end ? 0 : ::fcntl(target, F_GETFD);
    if (!end && (flags < 0 || (flags & FD_CLOEXEC))) {
      closed.push_back(target);
      continue;
    }
    fds.push_back(end ? end.get() : target);
    targets.push_back(target);
  }
  const auto launch = ParsePythonLaunch(spec);
  std::error_code ec;
  const std::string cwd = std::filesystem::current_path(ec).string();
  json j{{"argv", spec.argv},
         {"env", spec.env},
         {"cwd", cwd},
         {"parent", ::getpid()},
         {"nflags", launch ? launch->flags.size() : 0}};
  if (spec.extra_fd >= 0) {  // the heartbeat channel, at the same fd number as in a cold start
    fds.push_back(spec.extra_fd);
    targets.push_back(spec.extra_fd_target);
  }
  j["fd_targets"] = targets;
  j["closed_fds"] = closed;
  const std::string text = j.dump();
  const auto too_big = [&] {
    return "a worker's arguments and environment (" + std::to_string(text.size() / 1024) +
           " KiB) are more than the warm path can hand over; it starts cold";
  };
  // More than a waiting child reads: the datagram would arrive cut.
  if (text.size() > kMaxSpec) {
    Warn(too_big());
    pool_.insert(pool_.begin(), std::move(child));  // untouched: the next spec may take it
    return Handed::kCold;
  }
  // The waiting child has run nothing of the worker yet: move it into the attempt's cgroup now,
  // as a cold child joins it before exec (everything it starts then follows it there).
  if (spec.cgroup_procs_fd >= 0) {
    const std::string pid = std::to_string(child.pid);
    (void)!::write(spec.cgroup_procs_fd, pid.data(), pid.size());
  }
  // Registered before the spec goes: from then on the child runs the worker and may start
  // children of its own, which a SIGKILL of ctrun must take too.
  AnnounceGroup(spec.watchdog_fd, child.pid);
  // The spec goes as one datagram, which must fit the socket's send buffer (about 208 KiB by
  // default): a large environment asks for more. SO_SNDBUFFORCE passes the system's cap (root).
  if (text.size() > kDefaultSendBuffer) {
    const int want = static_cast<int>(std::min<size_t>(text.size() + 4096, kMaxSpec));
    if (::setsockopt(child.sock.get(), SOL_SOCKET, SO_SNDBUFFORCE, &want, sizeof want) != 0)
      (void)::setsockopt(child.sock.get(), SOL_SOCKET, SO_SNDBUF, &want, sizeof want);
  }
  if (!SendWithFds(child.sock.get(), text, fds)) {
    const int err = errno;
    KillAndReap(child.pid, child.pidfd);
    // Too large for the buffer, or no memory for one that large: the next child fares no better.
    if (err != EMSGSIZE && err != ENOBUFS && err != ENOMEM) return Handed::kNextChild;
    Warn(too_big());
    return Handed::kCold;
  }
  child.sock.reset();
  out->pid = child.pid;
  out->pidfd = std::move(child.pidfd);
  out->stdout_pipe = std::move(out_p.parent_end);
  out->stderr_pipe = std::move(err_p.parent_end);
  out->stdin_pipe = std::move(in_p.parent_end);
  out->exec_confirmed = true;
  return Handed::kWarm;
}

}  // namespace ctrun::warm
