// Watchdog: covers the one case PR_SET_PDEATHSIG cannot. When ctrun itself is SIGKILLed, its
// workers die by PDEATHSIG, but their children (DataLoader workers, ...) are merely reparented
// and keep running, holding GPUs. The watchdog is a tiny forked process that holds the read end
// of a pipe whose only write end lives in the agent. The agent tells it each worker process
// group as it starts ('A' pgid) and when it is gone ('R' pgid). If the pipe reaches EOF without
// a prior 'Q' (clean shutdown), the agent died: the watchdog SIGKILLs every registered group and
// exits. It ignores INT/TERM/HUP/QUIT so a signal aimed at ctrun's group cannot take it first.
//
// Limits: a descendant that leaves its worker's process group (setsid/setpgid) is not covered
// after an agent SIGKILL; everything else is, however many groups are registered.
#pragma once

#include <sys/types.h>

#include <cstdint>

#include "base/status.h"
#include "base/unique_fd.h"

namespace ctrun {

// The watchdog's set of registered groups: one bit per possible process group id. A pgid is a
// pid, and pids are below PID_MAX_LIMIT (4194304 on 64-bit Linux; /proc/sys/kernel/pid_max cannot
// exceed it), so every group fits: no limit on how many are covered, O(1) add and remove, no
// allocation (the watchdog is a forked copy of the agent). 512 KiB, zero pages until touched.
// Values that cannot be pids (<= 0, >= the limit) are ignored.
class PgidSet {
 public:
  static constexpr uint32_t kPidLimit = 4u << 20;

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

class Watchdog {
 public:
  // Forks the watchdog. Call before starting workers and before any thread exists.
  static StatusOr<Watchdog> Start();
  Watchdog(Watchdog&&) = default;
  Watchdog& operator=(Watchdog&&) = default;
  ~Watchdog();  // clean shutdown ('Q' + close) unless released

  void AddGroup(pid_t pgid);
  void RemoveGroup(pid_t pgid);
  pid_t pid() const { return pid_; }

 private:
  Watchdog(UniqueFd w, pid_t pid) : write_(std::move(w)), pid_(pid) {}
  void Send(char op, pid_t pgid);
  UniqueFd write_;
  pid_t pid_ = -1;
};

}  // namespace ctrun
