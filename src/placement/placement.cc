#include "placement/placement.h"

namespace ctrun {

StatusOr<BindMode> RequestedBindMode(const LaunchConfig& c) {
  if (!c.numa_binding.empty()) {
    auto m = NumaBindingMode(c.numa_binding);
    if (!m.ok()) return Status::Error("invalid value '" + c.numa_binding + "' for --numa-binding: " + m.message());
    return m;
  }
  if (!c.cpu_binding.empty()) {
    auto m = CpuBindingMode(c.cpu_binding);
    if (!m.ok()) return Status::Error("invalid value '" + c.cpu_binding + "' for --cpu-binding: " + m.message());
    return m;
  }
  return BindMode::kNone;
}

StatusOr<PlacementPlan> PlanPlacement(const LaunchConfig& c, const GpuInventory& gpus, BindMode mode,
                                      const Topology* topology, std::string gdbserver) {
  PlacementPlan plan;
  plan.mode = mode;
  plan.debug_rank = c.debug_rank;
  plan.debug_port = c.debug_port;
  plan.gdbserver = std::move(gdbserver);
  const int n = c.nproc_per_node;
  plan.ranks.resize(static_cast<size_t>(n));
  std::vector<std::string> bus_ids;
  for (int i = 0; i < n; ++i) {
    RankPlacement& r = plan.ranks[static_cast<size_t>(i)];
    if (i < gpus.count()) {
      r.gpu = gpus.visible[static_cast<size_t>(i)];
      r.gpu_bus_id = gpus.devices[static_cast<size_t>(i)].pci_bus_id;
    }
    bus_ids.push_back(r.gpu_bus_id);
  }
  if (mode == BindMode::kNone) return plan;
  if (!topology) return Status::Error("CPU binding needs the machine's topology");
  auto bindings = PlanBindings(*topology, mode, n, bus_ids);
  if (!bindings.ok()) return bindings.status();
  for (int i = 0; i < n; ++i) plan.ranks[static_cast<size_t>(i)].binding = bindings.value()[static_cast<size_t>(i)];
  return plan;
}

bool UnderDebugger(const PlacementPlan& plan, const RankInfo& rank) {
  return plan.debug_rank && *plan.debug_rank == rank.global_rank;
}

std::string ApplyPlacement(const PlacementPlan& plan, int local_rank, const RankInfo& rank, SpawnSpec* spec) {
  if (static_cast<size_t>(local_rank) < plan.ranks.size())
    spec->cpu_affinity = plan.ranks[static_cast<size_t>(local_rank)].binding.cpus;
  if (!UnderDebugger(plan, rank)) return "";
  const std::string who = "rank " + std::to_string(rank.global_rank) + " (local_rank " + std::to_string(local_rank) + ")";
  if (plan.gdbserver.empty()) {
    spec->stop_before_exec = true;
    return who + " stops before exec (gdbserver is not on PATH): attach with gdb -p <its pid, printed when "
                 "it starts>, then continue";
  }
  const std::string program = spec->executable.empty() ? spec->argv[0] : spec->executable;
  std::vector<std::string> argv = {"gdbserver", "--no-startup-with-shell", ":" + std::to_string(plan.debug_port),
                                   program};
  argv.insert(argv.end(), spec->argv.begin() + 1, spec->argv.end());
  spec->argv = std::move(argv);
  spec->executable = plan.gdbserver;
  return who + " starts under gdbserver, waiting for a debugger on port " + std::to_string(plan.debug_port) +
         ": gdb -ex 'target remote localhost:" + std::to_string(plan.debug_port) + "' " + program +
         " (or the VS Code entry in .vscode/launch.json)";
}

std::string FormatBinding(const PlacementPlan& plan, int local_rank, const RankInfo& rank) {
  std::string line = "rank " + std::to_string(rank.global_rank) + " (local_rank " + std::to_string(local_rank) + "): ";
  const RankPlacement* r =
      static_cast<size_t>(local_rank) < plan.ranks.size() ? &plan.ranks[static_cast<size_t>(local_rank)] : nullptr;
  if (!r || r->binding.cpus.empty()) {
    line += "cpus not bound";
  } else {
    line += "cpus " + FormatCpuList(r->binding.cpus) + " (" + BindModeName(plan.mode) +
            (r->binding.shared ? ", shared: more workers than cores" : "") + ")";
    line += " | numa " + (r->binding.numa_node >= 0 ? std::to_string(r->binding.numa_node) : std::string("?"));
  }
  line += " | gpu ";
  if (!r || r->gpu.empty()) {
    line += "none";
  } else {
    line += r->gpu;
    if (!r->gpu_bus_id.empty()) line += " (" + r->gpu_bus_id + ")";
  }
  if (UnderDebugger(plan, rank)) line += " | under a debugger";
  return line;
}

}  // namespace ctrun
