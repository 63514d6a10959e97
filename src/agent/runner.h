// Runner: wires the pure Agent to the real world for one `ctrun` invocation: signal blocking and
// the signalfd, the subreaper and the reaping drain, the watchdog, the event loop, pidfds, the
// agent store, the log relay and log dir, and the final report. main.cc parses; this runs.
#pragma once

#include <string>
#include <vector>

#include "base/environment.h"
#include "config/launch_config.h"
#include "logs/output_plan.h"
#include "report/events.h"
#include "report/run_outcome.h"
#include "gpu/gpu_device.h"
#include "placement/placement.h"

namespace ctrun {

// Process-wide facts gathered by main before the run (never parsed again here).
struct RunContext {
  Environment env;                 // the agent's environment, read once
  std::string executable;          // what every worker execs (ResolveEntrypoint)
  logs::OutputFlags output_flags;  // the log flags, parsed once
  std::string hostname;            // for the summary
  EventSink* events = &NullEvents();  // --events-file (not owned)
  PlacementPlan placement;         // per local rank: GPU, CPU binding, debugger (--debug-rank)
  GpuDriver* gpu_driver = nullptr;  // NVML when loaded (not owned): restarts wait for GPU release
  std::vector<int> gpu_indices;    // NVML indices of the job's GPUs
};

// Runs the job to completion and returns how it ended (agent/job_outcome.h decides; its
// exit_code is ctrun's, see README "Exit codes"). The caller reports it (report/run_end.h).
RunOutcome RunJob(const LaunchConfig& config, const RunContext& context);

}  // namespace ctrun
