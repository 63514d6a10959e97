// RemoveTree: rm -rf of a directory tree, fast where removals are fast and overlapped where each
// one waits. On some file systems removing a directory waits for the disk (ext4 mounted with
// `discard` was seen at ~3.5 ms per rmdir on the development VM, while mkdir took 0.05 ms; network
// file systems), so a sequential rm -rf of a run's log base (<base>/<run>/attempt_<n>/<local_rank>)
// would cost n_ranks x that at the end of every run. Files go first (one after another while each
// is fast, the rest in parallel). Directories then go deepest first on the calling thread while
// each removal is fast (the usual case, 0.1-0.2 ms: renames and threads would only add their
// cost); from the first that waited `slow`, every directory left below the top's own children is
// renamed up into the top (a rename frees no block), so that all of them go in one parallel round
// of rmdir calls on up to `max_threads` short-lived threads, then the top.
//
// Contract:
//  - Never follows a symlink: a symlink (at the top or inside) is unlinked, not its target.
//  - A missing `path` is success (like std::filesystem::remove_all).
//  - Returns the first error as "rm -rf <path>: <step> <entry>: <strerror>"; what could be removed
//    is removed either way.
//  - The threads exist only inside the call, touch nothing but the entries listed, and inherit the
//    caller's signal mask (ctrun's blocked signals stay blocked). Not for trees other users can
//    write to while they are removed (the walk is a snapshot).
#pragma once

#include <chrono>
#include <string>

#include "base/status.h"

namespace ctrun {

// `slow`: the removal time from which the rest goes the parallel way (tests pass 0: from the
// first removal of each kind on).
[[nodiscard]] Status RemoveTree(const std::string& path, int max_threads = 8,
                                std::chrono::microseconds slow = std::chrono::microseconds(500));

}  // namespace ctrun
