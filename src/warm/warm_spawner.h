// WarmSpawner (ctrun --warm): starts Python workers by fork from a warm server that has imported
// torch once, instead of fork/exec of a fresh interpreter that imports it again; and C++ workers
// that opt in (CTRUN_MAIN) by fork from their own binary started once as the server (the loader
// has mapped LibTorch once), instead of exec. Both servers speak one protocol (warm_server.py). Everything else
// about a worker is as a cold start: the agent sees the same Spawner interface and gets the same
// SpawnedProcess (pid, pidfd, output pipes), the worker leads its own process group, has
// PR_SET_PDEATHSIG(SIGKILL), is ctrun's child (reaped by the agent's drain), and gets the spec's
// environment, argv, working directory and fds 0-2.
//
// The server (src/warm/warm_server.py, embedded; or the binary with CTRUN_WARM_SERVER set,
// src/worker/warm_main.cc) is ctrun's child: own process group, PDEATHSIG, started at the first
// attempt under the workers' interpreter, flags and common environment (a binary: the first
// worker's argv and the common environment).
// Its children are ctrun's children too: see the race analysis at the top of warm_server.py.
// After handing out an attempt's workers ctrun asks for the next attempt's children at once, so a
// restart forks nothing on its critical path: it checks the server (one round trip: preloaded
// files unchanged, still one thread) and sends each waiting child its spec.
//
// Falls back to the cold spawner, with one warning line per reason, when a spec breaks a rule
// (warm_rules.h), the server breaks a safety rule (threads, CUDA), cannot preload, or dies. When
// preloaded files change on disk the server is restarted before the attempt.
//
// Blocking: SpawnMany blocks the agent's loop while a server preloads (the first attempt, or after
// a restart of the server), bounded by WarmOptions::start_wait; a cold start would spend that time
// importing in every worker instead.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "process/spawner.h"
#include "warm/warm_rules.h"

namespace ctrun::warm {

struct WarmOptions {
  // Modules the server imports; "@script": also the script's own top-level absolute imports.
  std::vector<std::string> preload{"torch", "torch.distributed"};
  Duration start_wait = std::chrono::seconds(120);  // the server's preload
  Duration fork_wait = std::chrono::seconds(30);    // children and check replies
  // Why workers must start cold for the whole job (e.g. per-worker CPU binding), or "".
  std::string cold_reason;
  // How many attempts the job can have (max_restarts + 1 on one node); -1 unbounded (a multi-node
  // job restarts on membership changes). No children are forked ahead for an attempt past it.
  int max_attempts = -1;
  std::function<void(int level, const std::string& msg)> log;  // 1 warning, 0 info, -1 debug
};

class WarmSpawner final : public Spawner {
 public:
  WarmSpawner(Spawner& cold, WarmOptions options);
  ~WarmSpawner() override;
  WarmSpawner(const WarmSpawner&) = delete;
  WarmSpawner& operator=(const WarmSpawner&) = delete;

  bool Spawn(const SpawnSpec& spec, SpawnedProcess* out, SpawnError* error) override;
  void SpawnMany(const std::vector<SpawnSpec>& specs, std::vector<SpawnResult>* results) override;
  bool SignalGroup(pid_t pgid, int sig) override { return cold_.SignalGroup(pgid, sig); }
  bool GroupAlive(pid_t pgid) override { return cold_.GroupAlive(pgid); }

  pid_t server_pid() const { return server_ ? server_->pid : -1; }
  // The server and its waiting children (ctrun's children, outside every worker's group): not
  // what an attempt left behind. Children the server is still forking are waited for first
  // (at most WarmOptions::fork_wait; a fork takes milliseconds). Empty without a server.
  std::vector<pid_t> SparedPids();
  // How many workers of the last SpawnMany were forked warm.
  size_t last_warm_count() const { return last_warm_; }

 private:
  struct Child {
    pid_t pid = -1;
    UniqueFd pidfd;
    UniqueFd sock;
  };
  struct Server {
    pid_t pid = -1;
    UniqueFd pidfd;
    UniqueFd ctl;
    ServerIdentity identity;
    size_t pending = 0;  // children asked for and not yet arrived
  };
  struct Message {
    std::string op;
    std::string text;  // the JSON
    std::vector<UniqueFd> fds;
  };

  // "" when every spec may be forked from a (possibly new) server; else why they start cold.
  std::string Prepare(const std::vector<SpawnSpec>& specs);
  Status StartServer(const std::vector<SpawnSpec>& specs, const WarmLaunch& launch);
  void StopServer();
  Status Send(const std::string& json);
  // Reads messages until one with `op` arrives (children arriving meanwhile join the pool).
  StatusOr<Message> Await(const std::string& op, TimePoint deadline);
  StatusOr<Message> ReadOne(TimePoint deadline);
  void Absorb(Message& m);
  Status FillPool(size_t n, TimePoint deadline);
  // What handing a spec to a waiting child came to: the worker runs in it; the child was gone or
  // failed (the next one may do); or the spec cannot go warm at all (no child is spent on it).
  enum class Handed { kWarm, kNextChild, kCold };
  Handed Hand(Child& child, const SpawnSpec& spec, SpawnedProcess* out);
  void Warn(const std::string& reason);
  void Disable(const std::string& reason);

  Spawner& cold_;
  WarmOptions options_;
  std::optional<Server> server_;
  std::vector<Child> pool_;
  std::string problem_;   // a safety rule the server reported breaking
  bool disabled_ = false;
  std::set<std::string> warned_;
  size_t last_warm_ = 0;
  int attempts_ = 0;  // SpawnMany calls: the attempts started
};

// The embedded server script (generated from warm_server.py at build time).
extern const char* const kWarmServerSource;

}  // namespace ctrun::warm
