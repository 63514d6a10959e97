// Runner: wires the pure Agent to the real world for one `ctrun` invocation: signal blocking and
// the signalfd, the subreaper and the reaping drain, the watchdog, the event loop, pidfds, the
// agent store, the log relay and log dir, and the final report. main.cc parses; this runs.
#pragma once

#include <string>

#include "base/environment.h"
#include "config/launch_config.h"
#include "logs/output_plan.h"

namespace ctrun {

// Process-wide facts gathered by main before the run (never parsed again here).
struct RunContext {
  Environment env;                 // the agent's environment, read once
  std::string executable;          // what every worker execs (ResolveEntrypoint)
  logs::OutputFlags output_flags;  // the log flags, parsed once
  std::string hostname;            // for the summary
};

// Runs the job to completion and returns ctrun's exit code (see README "Exit codes").
int RunJob(const LaunchConfig& config, const RunContext& context);

}  // namespace ctrun
