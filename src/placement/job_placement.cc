#include "placement/job_placement.h"

#include <sched.h>
#include <unistd.h>

#include <cerrno>
#include <memory>

#include "agent/launch_checks.h"
#include "placement/hwloc_topology.h"

namespace ctrun {
namespace {

CpuList OwnAffinity() {
  CpuList out;
  // A kernel built for more than CPU_SETSIZE (1024) CPUs refuses a smaller mask (EINVAL).
  for (int ncpus = CPU_SETSIZE; ncpus <= (1 << 22); ncpus *= 2) {
    std::unique_ptr<cpu_set_t, void (*)(cpu_set_t*)> set(CPU_ALLOC(ncpus), [](cpu_set_t* s) { CPU_FREE(s); });
    if (!set) return out;
    const size_t size = CPU_ALLOC_SIZE(ncpus);
    if (::sched_getaffinity(0, size, set.get()) == 0) {
      for (int c = 0; c < ncpus; ++c)
        if (CPU_ISSET_S(c, size, set.get())) out.push_back(c);
      return out;
    }
    if (errno != EINVAL) return out;
  }
  return out;
}

}  // namespace

bool WantsGpuDriver(const LaunchConfig& c) {
  if (::access("/proc/driver/nvidia", F_OK) != 0) return false;
  return c.nproc.kind == NprocSpec::Kind::kGpu || c.nproc.kind == NprocSpec::Kind::kAuto || !c.gpus.empty() ||
         !c.numa_binding.empty() || c.report_bindings || c.max_restarts > 0 || c.rdzv.multi_node;
}

StatusOr<GpuInventory> ProbeGpus(const LaunchConfig& c, const EnvLookup& env, GpuDriver* driver,
                                 Environment* worker_env) {
  SystemGpuProbe probe(env, "", driver);
  GpuInventory gpus = probe.Probe();
  if (c.gpus.empty()) return gpus;
  std::string list;
  for (int g : c.gpus) list += (list.empty() ? "" : ",") + std::to_string(g);
  auto selected = SelectGpus(gpus, c.gpus);
  if (!selected.ok()) return Status::Error("invalid value '" + list + "' for --gpus: " + selected.message());
  worker_env->Set("CUDA_VISIBLE_DEVICES", selected.value().VisibleValue());
  return selected;
}

StatusOr<PlacementPlan> PlanJobPlacement(const LaunchConfig& c, const GpuInventory& gpus, const Environment& env) {
  auto mode = RequestedBindMode(c);
  if (!mode.ok()) return mode.status();
  std::optional<Topology> topo;
  if (mode.value() != BindMode::kNone) {
    // hwloc honours HWLOC_XMLFILE (a saved topology) itself.
    auto loaded = LoadTopology("", /*with_pci=*/UsesGpus(mode.value()));
    if (!loaded.ok()) return loaded.status();
    topo = std::move(loaded.value());
    RestrictTopology(&*topo, OwnAffinity());
  }
  const std::string gdbserver = c.debug_rank ? FindOnPath("gdbserver", env) : "";
  return PlanPlacement(c, gpus, mode.value(), topo ? &*topo : nullptr, gdbserver);
}

}  // namespace ctrun
