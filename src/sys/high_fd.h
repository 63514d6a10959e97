// High fds: where the agent keeps its long-lived descriptors, out of the way of the children it
// spawns vfork-style.
//
// A vfork-style child (process/vfork_clone.h) may share the agent's fd table (CLONE_FILES) and then
// take its own copy of the part below kHighFdLine alone (ChildUnshareBelowLine: the kernel copies
// nothing from the line up). The descriptors the agent keeps per worker (pipe ends, pidfds, cgroup
// directories, log files) live from the line up, so a child copies, and closes again at its exec,
// only the agent's few low fds and its own stdio ends, not those of every other worker. Without
// this every spawn cost O(workers) and a batch of n spawns O(n^2): on the development VM a launch
// of 64 x /bin/true took 81.2 ms instead of 65.0, a restart of 64 workers 41.3 instead of 36.2
// (launch and restart of 4-8 workers: no change beyond the noise).
//
// Contract:
//  - ReserveHighFds grows the fd table past the line, once, and must run while the process has a
//    single thread: a table shared by threads grows only after an RCU grace period (a launch of 8
//    workers took 17-21 ms instead of 10 when the first move happened on a threaded agent). It
//    returns false (and nothing is ever moved) when RLIMIT_NOFILE does not reach past the line, or
//    when close_range(2) with its flags is unavailable here (kernel < 5.11, a seccomp filter):
//    children then copy the whole table, as before.
//  - MoveHigh re-homes a descriptor at the line or above (F_DUPFD_CLOEXEC, the old number closed).
//    One it cannot move (no reservation, EMFILE) stays where it is: correct, only costlier to
//    spawn beside. Thread-safe.
//  - Below the line stays what children need: their stdio ends, error pipe, the watchdog's pipe.
#pragma once

#include "base/unique_fd.h"

namespace ctrun {

inline constexpr int kHighFdLine = 1024;

// See the contract. Idempotent.
bool ReserveHighFds();
// Whether ReserveHighFds succeeded: descriptors move, and children may unshare below the line.
bool HighFdsReserved();

void MoveHigh(UniqueFd* fd);
// The same for a raw descriptor owned by the caller: returns its new number (or `fd` unchanged).
int MoveHigh(int fd);

// Child side, first thing in a vfork-style child made with CLONE_FILES, before it changes any
// descriptor: its own fd table, holding copies of the agent's descriptors below the line alone.
// Async-signal-safe. False (errno set) when neither close_range(CLOSE_RANGE_UNSHARE) nor
// unshare(CLONE_FILES) worked: the table is still the agent's, and the child must not touch it.
bool ChildUnshareBelowLine();

}  // namespace ctrun
