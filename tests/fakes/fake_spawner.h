// FakeSpawner: records SpawnSpecs and signals; the test decides when "processes" exit and
// whether their process groups still have members. Lets the agent's state machine run without
// forking.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "process/spawner.h"

namespace ctrun::testing {

class FakeSpawner final : public Spawner {
 public:
  struct Signal {
    pid_t pgid;
    int sig;
  };

  bool Spawn(const SpawnSpec& spec, SpawnedProcess* out, SpawnError* error) override {
    if (fail_at_ == spawn_calls_++ && fail_at_err_ != 0) fail_next_with_ = fail_at_err_;
    if (fail_next_with_ != 0) {
      error->err = fail_next_with_;
      error->shell_code = fail_next_with_ == ENOENT ? 127 : 126;
      error->message = "cannot execute " + spec.argv[0] + ": fake";
      fail_next_with_ = 0;
      return false;
    }
    specs.push_back(spec);
    out->pid = next_pid_++;
    out->exec_confirmed = !unconfirmed_exec;
    alive_groups.insert(out->pid);
    return true;
  }
  bool SignalGroup(pid_t pgid, int sig) override {
    signals.push_back({pgid, sig});
    if (!alive_groups.count(pgid)) return false;
    if (sig == SIGKILL && !unkillable.count(pgid)) alive_groups.erase(pgid);
    return true;
  }
  bool GroupAlive(pid_t pgid) override { return alive_groups.count(pgid) != 0; }

  void FailNextSpawn(int err) { fail_next_with_ = err; }
  // The n-th Spawn call (0-based) fails with err.
  void FailSpawnNumber(int n, int err) {
    fail_at_ = n;
    fail_at_err_ = err;
  }
  // Signals sent with `sig` since the start.
  int CountSignals(int sig) const {
    int n = 0;
    for (const auto& s : signals) n += s.sig == sig;
    return n;
  }

  std::vector<SpawnSpec> specs;
  std::vector<Signal> signals;
  std::set<pid_t> alive_groups;  // groups with members; tests erase to model "group empty"
  std::set<pid_t> unkillable;    // groups that survive SIGKILL (D state)
  bool unconfirmed_exec = false; // every spawn comes back as still in exec (a hung file system)

 private:
  pid_t next_pid_ = 1000;
  int fail_next_with_ = 0;
  int spawn_calls_ = 0;
  int fail_at_ = -1;
  int fail_at_err_ = 0;
};

}  // namespace ctrun::testing
