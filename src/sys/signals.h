// Signal plumbing for the agent: no work in signal handlers, ever. At start-up (before any thread)
// the agent blocks the asynchronous signals it cares about and reads them from a signalfd in the
// event loop. The original mask is remembered so spawned workers get it back before exec.
// Synchronous fault signals (SEGV, BUS, FPE, ILL, ABRT, TRAP, SYS) stay unblocked.
#pragma once

#include <signal.h>

#include <chrono>
#include <optional>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"

namespace ctrun {

// Blocks `signals` (plus SIGCHLD) for the calling thread, records the previous mask, sets
// SIGPIPE to SIG_IGN (a dead console must be an EPIPE, not a dead agent) and SIGCHLD to SIG_DFL
// (an inherited SIG_IGN would let the kernel reap the workers unseen). Call once, early.
Status BlockAgentSignals(const std::vector<int>& signals);
// The mask in force before BlockAgentSignals (empty set if never called). Safe after fork.
const sigset_t& OriginalSignalMask();

// One signal as read from a signalfd: its number, and who sent it (kill(2) from another process:
// from_process, with its pid; the kernel, a terminal's ^C, a child's exit: from_process false).
struct ReadSignal {
  int signo = 0;
  bool from_process = false;
  pid_t sender = 0;
};

// A signalfd over the given signals (which must already be blocked).
class SignalFd {
 public:
  static StatusOr<SignalFd> Create(const std::vector<int>& signals);
  int fd() const { return fd_.get(); }
  // Reads every pending signal (non-blocking); returns them in arrival order.
  std::vector<ReadSignal> ReadPending();

 private:
  explicit SignalFd(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
};

// Two stopping signals within `window` are one event when one process sent the same signal twice,
// or when ctrun's parent sent either (the same signal or another). timeout(1) signals its child,
// then its own process group, which holds the child too; a ^C at a terminal reaches ctrun and a
// wrapping `timeout`, `bash` trap or init that forwards it to ctrun, as SIGINT or turned into
// SIGTERM. ctrun took the second for a user who insists, and the grace period was skipped. Two
// signals from the kernel (two ^C at a terminal) are never merged: two presses are two requests.
// Feed it stopping signals only. Pure.
class RepeatedSignalFilter {
 public:
  // parent: ctrun's parent process (getppid() at the start); 0 for none.
  explicit RepeatedSignalFilter(std::chrono::steady_clock::duration window, pid_t parent = 0)
      : window_(window), parent_(parent) {}
  // True when `s`, arriving at `now`, repeats the last signal this filter let through.
  // FromParent tells the caller where a repeat came from.
  bool IsRepeat(const ReadSignal& s, std::chrono::steady_clock::time_point now);
  bool FromParent(const ReadSignal& s) const { return parent_ > 0 && s.from_process && s.sender == parent_; }

 private:
  std::chrono::steady_clock::duration window_;
  pid_t parent_;
  std::optional<ReadSignal> last_;
  std::chrono::steady_clock::time_point last_at_{};
};

}  // namespace ctrun
