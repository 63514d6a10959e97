// What is left to clean once ctrun itself was SIGKILLed: the watchdog (process/watchdog.h) has
// killed the workers' process groups; this empties the rest in a process of its own, the one
// ctrun's cleanup mode (`ctrun --ct-watchdog-cleanup CGROUP RUN_DIR`) runs, or a forked watchdog.
#pragma once

#include <string>
#include <vector>

namespace ctrun {

// args = {workers' cgroup sub-tree or "", run directory whose next-attempt trees made ahead go,
// or ""}. The cgroup is emptied through cgroup.kill (everything a worker started, whatever its
// group or session), awaited (bounded) and removed. Names the process `ct-watchdog`. Returns 0,
// or 2 for arguments not of that form (a cgroup directory not named like a workers' cgroup: this
// kills what is in it).
int RunAgentDeathCleanup(const std::vector<std::string>& args);

}  // namespace ctrun
