// Watchdog: covers the one case PR_SET_PDEATHSIG cannot. When ctrun itself is SIGKILLed, its
// workers die by PDEATHSIG, but their children (DataLoader workers, ...) are merely reparented
// and keep running, holding GPUs. The watchdog is a tiny process that holds the read end of a
// pipe whose write end lives in the agent (and, CLOEXEC, in each child until its exec). It learns
// each worker process group as it starts ('A' pgid) and when it is gone ('R' pgid, from the
// agent). If the pipe reaches EOF without a prior 'Q' (clean shutdown), the agent died: the
// watchdog SIGKILLs every registered group, then runs the agent's last cleanup (WatchdogCleanup:
// the workers' cgroup sub-tree, emptied through cgroup.kill, which also takes descendants that
// left their group or session; the next attempt's directories made ahead), and exits. It ignores
// INT/TERM/HUP/QUIT so a signal aimed at ctrun's group cannot take it first, and is named
// `ct-watchdog`, with `ct-watchdog` for its whole command line, which neither `pkill -9 ctrun`
// nor `pkill -9 -f ctrun` (or -f of the training script) matches.
//
// Two ways to start it, one behaviour: the program ct-watchdog (process/watchdog_helper.c),
// started with posix_spawn, which for the agent costs only a clone; or, where that program is
// not found or cannot run, a fork of the agent, which makes the agent pay copy-on-write faults on
// the pages it writes next (3-4 ms of an 8-worker launch on the development VM). The program
// reaches the cleanup by exec'ing ctrun's executable in its cleanup mode (kWatchdogCleanupFlag);
// a forked watchdog calls the same function in its copy of the agent.
//
// The 'A' is written before a worker runs any code of its own: by the child between setpgid and
// exec (cold), or by the warm spawner before it hands a spec to a waiting child, through
// AnnounceGroup. Registering from the agent once the spawn had returned left a window, seen under
// load, in which a worker had already started children when ctrun was SIGKILLed: the worker died
// by PDEATHSIG and its children ran on.
//
// Limits: without a cgroup, a descendant that leaves its worker's process group (setsid/setpgid)
// is not covered after an agent SIGKILL; everything else is, however many groups are registered.
// A SIGKILL of the watchdog itself as well (killpg of its own group) leaves the groups running.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"
#include "process/watchdog_wire.h"  // WatchdogMessage, kWatchdogPidLimit

namespace ctrun {

// A forked watchdog's set of registered groups: one bit per possible process group id
// (kWatchdogPidLimit), so every group fits: no limit on how many are covered, O(1) add and
// remove, no allocation (the watchdog is a forked copy of the agent). 512 KiB, zero pages until
// touched.
// Values that cannot be pids (<= 0, >= the limit) are ignored.
class PgidSet {
 public:
  static constexpr uint32_t kPidLimit = kWatchdogPidLimit;

  void Add(pid_t pgid);
  void Remove(pid_t pgid);
  // Calls fn(pgid) for every member, in increasing order.
  template <typename Fn>
  void ForEach(Fn&& fn) const {
    for (uint32_t w = 0; w < kWords; ++w)
      for (Word left = bits_[w]; left != 0; left &= left - 1)
        fn(static_cast<pid_t>(w * kWordBits + static_cast<uint32_t>(__builtin_ctzll(left))));
  }

 private:
  using Word = uint64_t;
  static constexpr uint32_t kWordBits = 64;
  static constexpr uint32_t kWords = kPidLimit / kWordBits;
  Word bits_[kWords] = {};
};

// Registers process group `pgid` with the watchdog that reads the pipe whose write end is
// `watchdog_fd` (Watchdog::fd()). Async-signal-safe (one write of a message shorter than
// PIPE_BUF, atomic among all writers), so a child may call it between fork and exec. A failed
// write (the watchdog is gone) is ignored: the group is then covered by nothing, as before.
void AnnounceGroup(int watchdog_fd, pid_t pgid);

// ctrun's cleanup mode: `ctrun --ct-watchdog-cleanup ARG...` runs the cleanup of a dead agent
// (main.cc), as exec'd by the ct-watchdog program. Not a user-facing flag. Without ARGs, they are
// the lines of kWatchdogCleanupArgsVariable: the program carries them there, so that its command
// line names neither ctrun nor the paths ctrun made (ctrun-<pid>), and `pkill -f ctrun` or
// `pkill -f train.py` aimed at a job does not take its watchdog with it.
inline constexpr const char* kWatchdogCleanupFlag = "--ct-watchdog-cleanup";
inline constexpr const char* kWatchdogCleanupArgsVariable = "CT_WATCHDOG_CLEANUP_ARGS";

// What the watchdog does after the agent died, once the registered groups are killed: run(args),
// in a forked watchdog directly, from the ct-watchdog program through ctrun's cleanup mode. Both
// run in a process of their own with no thread but one, after the agent is gone; best effort.
struct WatchdogCleanup {
  std::vector<std::string> args;
  int (*run)(const std::vector<std::string>& args) = nullptr;  // null: nothing to clean up
};

// Where the ct-watchdog program is: `override_path` when given ("" for none: fork), else next
// to ctrun's executable (a build tree), else <ctrun's dir>/../libexec/ctrun (an installation);
// "" when it is in neither.
std::string LocateWatchdogHelper(const std::string* override_path);

class Watchdog {
 public:
  // Starts the watchdog: the program at `helper` (LocateWatchdogHelper), or a fork of this
  // process when `helper` is "" or cannot be started. Call before starting workers; a fork wants
  // no thread to exist yet.
  static StatusOr<Watchdog> Start(const std::string& helper, WatchdogCleanup cleanup);
  Watchdog(Watchdog&&) = default;
  Watchdog& operator=(Watchdog&&) = default;
  ~Watchdog();  // clean shutdown ('Q' + close) unless released

  void RemoveGroup(pid_t pgid);
  pid_t pid() const { return pid_; }
  // Why the watchdog is a fork of the agent and not the ct-watchdog program; "" when it is the program.
  const std::string& why_forked() const { return why_forked_; }
  // The write end, for AnnounceGroup in spawned children (CLOEXEC: no worker program keeps it).
  int fd() const { return write_.get(); }

 private:
  Watchdog(UniqueFd w, pid_t pid, std::string why_forked)
      : write_(std::move(w)), pid_(pid), why_forked_(std::move(why_forked)) {}
  void Send(char op, pid_t pgid);
  UniqueFd write_;
  pid_t pid_ = -1;
  std::string why_forked_;
};

}  // namespace ctrun
