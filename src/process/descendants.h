// Descendants: the processes a run leaves behind outside the workers' process groups (a
// start_new_session=True child, a daemon that forked twice) and their removal. ctrun is a child
// subreaper, so an orphaned descendant is reparented to ctrun instead of init: every process the
// workers ever started is either still below a live descendant or a child of ctrun itself, and
// "every descendant of ctrun but the watchdog" is exactly what an attempt may leave behind once
// its workers are gone.
//
// Listing: /proc/<pid>/task/<tid>/children when the kernel has it (CONFIG_PROC_CHILDREN), else one
// scan of every /proc/<pid>/stat for its parent. Both are snapshots: a descendant that forks while
// it is being killed is caught by the next round of KillDescendants.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace ctrun {

// Whether /proc shows this process's own PID namespace (/proc/self is getpid()). It does not
// after `unshare --pid --fork` without a /proc mounted for the new namespace: /proc/<n> is then
// another process than pid n here. KillDescendants does nothing in that case (it would read the
// wrong tree); the caller says so.
bool ProcIsOurs();

// Every descendant of `root` (not root itself), parents before their children.
std::vector<pid_t> ListDescendants(pid_t root, const std::string& proc_root = "/proc");

// Pure part of the scan, for tests: the descendants of root in a pid -> parent pid map.
std::vector<pid_t> DescendantsFromParents(pid_t root, const std::map<pid_t, pid_t>& parent_of);

struct SweepResult {
  std::vector<pid_t> killed;    // every live descendant that was sent SIGKILL (zombies are only reaped)
  std::vector<pid_t> survivors; // still there when the budget ran out (D state)
};

// SIGKILLs every descendant of this process except the pids in `keep` and everything below them
// (the watchdog, and what ctrun had before its first worker: children inherited from a shell that
// exec'd it, e.g. `monitor & exec ctrun ...`), waits for each to exit on its pidfd (no polling),
// reaps the ones that are (or become) ctrun's children, and repeats until no descendant is left or
// `budget` is spent. Call it only when every worker leader has been reaped: it reaps any child of
// ctrun it killed.
SweepResult KillDescendants(const std::vector<pid_t>& keep, std::chrono::milliseconds budget);

}  // namespace ctrun
