// RemoveTree: rm -rf of a directory tree whose removals overlap. On some file systems removing a
// directory waits for the disk (ext4 mounted with `discard` frees the directory's block at once:
// ~3.5 ms per rmdir on the development VM, while mkdir takes 0.05 ms), so a sequential rm -rf of a
// run's log base (<base>/<run>/attempt_<n>/<local_rank>/...) costs n_ranks x that at the end of
// every run. Removals of independent entries overlap: every file is unlinked at once, then every
// directory below the top's own children is renamed up into the top (a rename frees no block:
// ~0.01 ms), so that all directories go in one round of rmdir calls, then the top. Each round
// runs on the calling thread while every removal is fast (a local disk without discard: threads
// would only add their cost, removals in one directory take its lock in turn), and the rest of the
// round on up to `max_threads` short-lived threads from the first removal that waited 0.5 ms.
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

// `slow`: the removal time from which the rest of a round goes on threads (tests pass 0 for
// threads from the second entry on).
[[nodiscard]] Status RemoveTree(const std::string& path, int max_threads = 8,
                                std::chrono::microseconds slow = std::chrono::microseconds(500));

}  // namespace ctrun
