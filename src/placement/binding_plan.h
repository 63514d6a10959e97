// PlanBindings: which CPUs each local rank may run on, a pure function of the topology, the mode
// and (for the GPU modes) each rank's GPU. Applied by the spawner in the child before exec
// (SpawnSpec::cpu_affinity); printed by --report-bindings.
//
// GPU modes (--numa-binding, torchrun's names), from each GPU's PCI locality (a GPU near several
// NUMA nodes alike, as with firmware that reports no affinity, counts as on the one of them with
// the fewest ranks so far, in rank order, after the GPUs near one node):
//   node          every CPU of the GPU's NUMA node
//   socket        every CPU of the package (socket) holding the GPU's NUMA node
//   exclusive     the physical cores of the GPU's NUMA node split evenly, in rank order, among the
//                 ranks whose GPUs share that node: no two ranks share a core (hyperthreads stay
//                 with their core); with more such ranks than cores, ranks share cores round-robin
//   core-complex  one L3 cache (core complex) of the GPU's NUMA node per rank, the largest first,
//                 in rank order; with more ranks than L3s on the node, they are reused round-robin
// CPU modes (--cpu-binding, ctrun's, for jobs without GPUs): ranks are spread over the machine
// in blocks, rank i taking the (i * count / nproc)-th object:
//   numa    a NUMA node          socket  a package
//   core    an even, exclusive share of the physical cores (round-robin single cores when there
//           are more ranks than cores)
//   none    no binding
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "placement/topology.h"

namespace ctrun {

enum class BindMode { kNone, kNode, kSocket, kExclusive, kCoreComplex, kCpuNuma, kCpuSocket, kCpuCore };

// "node" -> kNode ... for --numa-binding; "numa" -> kCpuNuma ... for --cpu-binding.
StatusOr<BindMode> NumaBindingMode(const std::string& name);
StatusOr<BindMode> CpuBindingMode(const std::string& name);
bool UsesGpus(BindMode mode);
const char* BindModeName(BindMode mode);

struct RankBinding {
  CpuList cpus;         // empty: not bound
  int numa_node = -1;   // the NUMA node (OS index) holding most of those CPUs, -1 when none
  bool shared = false;  // an exclusive mode had to share CPUs (more ranks than cores or L3s)
};

// gpu_bus_ids[i]: local rank i's GPU (PCI bus id, "" when unknown); used by the GPU modes only.
// Errors: a GPU mode for a rank without a GPU whose PCI location the topology knows.
StatusOr<std::vector<RankBinding>> PlanBindings(const Topology& topo, BindMode mode, int nproc,
                                                const std::vector<std::string>& gpu_bus_ids);

}  // namespace ctrun
