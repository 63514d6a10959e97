// Placement: where each local rank runs: its GPU (as the worker sees it), its CPUs and NUMA node
// (--numa-binding, --cpu-binding; placement/binding_plan.h), and whether it runs under a debugger
// (--debug-rank). Planned once, before the first attempt, from the GPU inventory and the
// topology (PlanPlacement, pure); applied to every attempt's SpawnSpecs (ApplyPlacement).
//
// --debug-rank R: the worker whose global rank is R starts as
//   gdbserver --no-startup-with-shell :PORT <program> <args>
// (gdbserver starts the program stopped at its first instruction and waits for a debugger on
// PORT), or, without gdbserver, with SpawnSpec::stop_before_exec (SIGSTOP just before exec;
// attach with gdb -p PID and continue). Such a rank is marked UnderDebugger(): no ctrun deadline
// meant for hung or silent workers (heartbeat, output, hang detection) may apply while it is in
// the job, to it or to the ranks that wait for it in collectives, since it sits at a breakpoint
// for as long as its user likes (the agent starts such attempts without judging). ctrun's stop path (signals, the grace
// period, SIGKILL) still applies: the job can always be stopped.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "agent/worker_env.h"
#include "base/status.h"
#include "config/launch_config.h"
#include "gpu/gpu_probe.h"
#include "placement/binding_plan.h"
#include "placement/topology.h"
#include "process/spawn_spec.h"

namespace ctrun {

struct RankPlacement {
  std::string gpu;         // the worker's GPU: its CUDA_VISIBLE_DEVICES entry; "" none
  std::string gpu_bus_id;  // its PCI address, "" when unknown
  RankBinding binding;     // cpus empty: not bound (inherits ctrun's affinity)
};

struct PlacementPlan {
  BindMode mode = BindMode::kNone;
  std::vector<RankPlacement> ranks;  // per local rank
  std::optional<int> debug_rank;     // global rank under a debugger
  int debug_port = 0;                // gdbserver's port
  std::string gdbserver;             // its path; "" = stop before exec instead
};

// The binding mode the flags ask for (kNone when neither --numa-binding nor --cpu-binding).
StatusOr<BindMode> RequestedBindMode(const LaunchConfig& config);

// topology: needed when the mode is not kNone (null otherwise). Local rank i's GPU is the i-th
// visible one (torchrun's cuda:LOCAL_RANK convention), none past the last.
StatusOr<PlacementPlan> PlanPlacement(const LaunchConfig& config, const GpuInventory& gpus, BindMode mode,
                                      const Topology* topology, std::string gdbserver);

// Whether this rank runs under a debugger: no hang/heartbeat/output deadline applies to it.
bool UnderDebugger(const PlacementPlan& plan, const RankInfo& rank);

// Sets the worker's CPU affinity and, for the debug rank, wraps it in gdbserver (or stops it
// before exec). Returns a line for the user about the debug rank, "" for the others.
std::string ApplyPlacement(const PlacementPlan& plan, int local_rank, const RankInfo& rank, SpawnSpec* spec);

// --report-bindings: "rank 1 (local_rank 1): cpus 8-15 | numa 1 | gpu 1 (0000:86:00.0)".
std::string FormatBinding(const PlacementPlan& plan, int local_rank, const RankInfo& rank);

}  // namespace ctrun
