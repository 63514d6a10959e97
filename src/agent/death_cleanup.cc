#include "agent/death_cleanup.h"

#include <sys/prctl.h>

#include <chrono>
#include <filesystem>

#include "logs/log_dir.h"
#include "sys/cgroup.h"

namespace ctrun {

int RunAgentDeathCleanup(const std::vector<std::string>& args) {
  // Not "ctrun...": `pkill -9 ctrun` matches process names (see process/watchdog.h).
  ::prctl(PR_SET_NAME, "ct-watchdog");
  if (args.size() != 2) return 2;
  const std::string& cgroup = args[0];
  const std::string& run_dir = args[1];
  if (!cgroup.empty()) {
    if (!ParseWorkerCgroupName(std::filesystem::path(cgroup).filename().string())) return 2;
    // How long to wait for the cgroup to empty after cgroup.kill (a process in D state dies
    // only when its I/O ends) before leaving the directory.
    constexpr std::chrono::seconds kCgroupEmptyBudget{10};
    RemoveWorkerCgroup(cgroup, kCgroupEmptyBudget);
  }
  if (!run_dir.empty()) logs::RemoveTreesMadeAhead(run_dir);
  return 0;
}

}  // namespace ctrun
