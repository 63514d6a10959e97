// The job's GPUs and placement, decided once in main before anything starts (each step a
// one-line error, exit code 2, on bad input):
//  - WantsGpuDriver: whether NVML is worth loading (the NVIDIA kernel driver is present and a
//    flag needs GPUs: --nproc-per-node=gpu|auto, --gpus, --numa-binding, --report-bindings, or
//    restarts, which wait for the GPUs' release: --max-restarts > 0, and every multi-node job,
//    whose rounds restart the workers when members change).
//  - ProbeGpus: the visible GPUs; with --gpus only those, and the workers' CUDA_VISIBLE_DEVICES
//    (in *worker_env) narrowed to them.
//  - PlanJobPlacement: after ResolveNproc: the binding (hwloc topology of this machine,
//    restricted to ctrun's own CPU affinity), each rank's GPU and the debug rank's gdbserver.
#pragma once

#include "base/environment.h"
#include "base/status.h"
#include "cli/cli.h"
#include "config/launch_config.h"
#include "gpu/gpu_probe.h"
#include "placement/placement.h"

namespace ctrun {

bool WantsGpuDriver(const LaunchConfig& config);
StatusOr<GpuInventory> ProbeGpus(const LaunchConfig& config, const EnvLookup& env, GpuDriver* driver,
                                 Environment* worker_env);
StatusOr<PlacementPlan> PlanJobPlacement(const LaunchConfig& config, const GpuInventory& gpus, const Environment& env);

}  // namespace ctrun
