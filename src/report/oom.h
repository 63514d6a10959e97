// OOM-killer evidence: the kernel's count of OOM kills, read before an attempt starts and after it
// fails, so a worker that died of SIGKILL nobody in ctrun sent can be reported as "likely killed by
// the kernel OOM killer" instead of leaving the user with a bare "-9 (SIGKILL)".
//
// Where the count comes from, first readable wins:
//   1. cgroup v1 memory controller (a "N:...memory...:/path" line in /proc/self/cgroup):
//      <root>/sys/fs/cgroup/memory/<path>/memory.oom_control, line "oom_kill N" (Linux >= 4.13).
//   2. cgroup v2 (the "0::/path" line): <root>/sys/fs/cgroup/<path>/memory.events, "oom_kill N".
//      memory.events is hierarchical, so the count covers workers in child cgroups too.
//   In both, when <path> is not there (a container that mounts only its own cgroup at the root),
//   the parents of <path> are tried, up to the mount root itself.
//   3. <root>/proc/vmstat "oom_kill N": system-wide, so noisier, but better than nothing.
// root is "" for the real system; tests point it at a temp dir holding the same layout.
// Nothing here is fatal: an unreadable source just gives nullopt.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "process/exit_status.h"

namespace ctrun {

struct OomKillSample {
  uint64_t count = 0;
  std::string source;  // "cgroup memory.events", "cgroup memory.oom_control" or "/proc/vmstat"
};

// Reads the OOM-kill counter for ctrun's own cgroup (see above for the order of sources).
std::optional<OomKillSample> ReadOomKillSample(const std::string& root = "");
// Just the number.
std::optional<uint64_t> ReadOomKillCount(const std::string& root = "");

// Pure parsers, exposed for tests. Both look for a line "oom_kill <n>"; nullopt if absent.
std::optional<uint64_t> ParseOomKillCounter(const std::string& file_text);
// /proc/self/cgroup -> the memory controller's cgroup path and whether it is v1.
struct CgroupMemoryPath {
  std::string path;  // e.g. "/user.slice/job.scope"
  bool v1 = false;
};
std::optional<CgroupMemoryPath> ParseProcSelfCgroup(const std::string& file_text);

// A worker is a likely OOM-killer victim when it died of SIGKILL that ctrun did not send, and the
// counter went up between the start of the attempt and the failure.
bool LikelyOomKilled(const ExitStatus& status, bool stopped_by_ctrun,
                     const std::optional<OomKillSample>& before,
                     const std::optional<OomKillSample>& after);

}  // namespace ctrun
