// The base fixture of the Agent's unit tests: an Agent on a fake spawner and a fake clock, with
// hooks that record what the agent asked. No fork, no sleep.
//
// Workers get pids 1000, 1001, ... in spawn order (FakeSpawner); Exit() ends one like the kernel
// would (its group empties, then the agent hears of the exit). Derived fixtures set `config`
// before MakeAgent() and attach their own fakes in Attach().
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "agent/agent.h"
#include "fakes/fake_spawner.h"
#include "fakes/fake_timer_queue.h"

namespace ctrun::testing {

class RecordingHooks : public AgentHooks {
 public:
  // master_port is 29500 + attempt, so tests can tell attempts apart.
  Status PrepareAttempt(int attempt, AttemptInfo* info) override {
    attempts.push_back(attempt);
    info->master_addr = "127.0.0.1";
    info->master_port = 29500 + attempt;
    info->use_agent_store = true;
    for (int r = 0; r < 4; ++r) info->error_files.push_back("/err/" + std::to_string(attempt) + "/" + std::to_string(r));
    if (fail_prepare) return Status::Error(prepare_error);
    return Status::Ok();
  }
  void OnWorkerExited(int local_rank, pid_t, const ExitStatus&) override { exited.push_back(local_rank); }
  void Log(int level, const std::string& msg) override { logs.push_back(std::to_string(level) + " " + msg); }
  void ConfigureWorker(int local_rank, const RankInfo&, int, SpawnSpec* spec) override {
    spec->cpu_affinity = {local_rank};
  }
  // With defer_restart the restart waits until the test calls pending_restart.
  void BeforeRestart(const std::vector<pid_t>& pids, std::function<void(Status)> ready) override {
    restart_pids = pids;
    if (defer_restart) {
      pending_restart = std::move(ready);
    } else {
      ready(Status::Ok());
    }
  }
  void OnAttemptFailed(int restart_count, const std::vector<FailureRecord>& failures) override {
    failed_attempts.push_back({restart_count, failures.size()});
  }
  // Failures of the pids in lost_peer count as having lost a peer (as an error file saying
  // "Connection closed by peer" would), besides the default's SIGPIPE.
  bool FailureLostAPeer(const FailureRecord& f) override {
    return lost_peer.count(f.pid) > 0 || AgentHooks::FailureLostAPeer(f);
  }
  // The error files in own_failure_files record a failure of their own (written, not yet exited).
  bool AnErrorFileRecordsAnOwnFailure(const std::vector<std::string>& files) override {
    asked_error_files = files;
    for (const auto& f : files)
      if (own_failure_files.count(f)) return true;
    return false;
  }
  // Some log line contains `part`.
  bool Logged(const std::string& part) const {
    for (const auto& l : logs)
      if (l.find(part) != std::string::npos) return true;
    return false;
  }

  bool fail_prepare = false;
  std::string prepare_error = "prepare failed";
  bool defer_restart = false;
  std::function<void(Status)> pending_restart;
  std::vector<pid_t> restart_pids;
  std::vector<int> attempts;
  std::vector<std::pair<int, size_t>> failed_attempts;  // restart count, failures recorded
  std::vector<int> exited;
  std::vector<std::string> logs;  // "<level> <message>"
  std::set<pid_t> lost_peer;
  std::set<std::string> own_failure_files;
  std::vector<std::string> asked_error_files;
};

class AgentFixture : public ::testing::Test {
 protected:
  AgentFixture() {
    config.nproc_per_node = 4;
    config.entrypoint = "./train";
    config.shutdown_timeout = 30;
  }
  // A new agent from `config` (not started), with Attach() applied.
  Agent& MakeAgent() {
    agent = std::make_unique<Agent>(config, Environment::FromEntries({"PATH=/bin", "HOME=/root"}), "/work/train",
                                    spawner, timers, hooks);
    Attach(*agent);
    return *agent;
  }
  // What a derived fixture connects before the agent starts (monitors, event sinks).
  virtual void Attach(Agent&) {}

  // The worker with `pid` exits; its group empties.
  void Exit(pid_t pid, ExitStatus st) {
    spawner.alive_groups.erase(pid);
    agent->OnChildExit(pid, st);
  }
  // Every worker of the current attempt exits with `st`.
  void ExitAll(ExitStatus st) {
    for (pid_t pid : agent->live_worker_pids()) Exit(pid, st);
  }
  // The pid of the spawn_index-th worker spawned.
  pid_t Pid(size_t spawn_index) const { return 1000 + static_cast<pid_t>(spawn_index); }
  // The pid of `local_rank` in the last attempt spawned.
  pid_t LastPid(int local_rank) const {
    return static_cast<pid_t>(1000 + spawner.specs.size() - static_cast<size_t>(config.nproc_per_node) +
                              static_cast<size_t>(local_rank));
  }

  LaunchConfig config;
  FakeSpawner spawner;
  FakeTimerQueue timers;
  RecordingHooks hooks;
  std::unique_ptr<Agent> agent;
};

}  // namespace ctrun::testing
