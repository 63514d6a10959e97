// Topology: the machine's CPU layout as the binding planner needs it, plain data (filled from
// hwloc by hwloc_topology.cc, or by hand in tests). CPU numbers are the kernel's (OS indices,
// what sched_setaffinity takes); every list is sorted.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace ctrun {

using CpuList = std::vector<int>;

struct TopoObject {
  int os_index = -1;
  CpuList cpus;
};

struct Topology {
  std::vector<TopoObject> numa_nodes;  // NUMA nodes that have CPUs, in order
  std::vector<TopoObject> packages;    // sockets
  std::vector<TopoObject> l3s;         // L3 caches: the "core complexes"
  std::vector<TopoObject> cores;       // physical cores, each with its hardware threads
  // PCI bus id ("0000:3b:00.0") -> the CPUs of the device's locality (its nearest non-I/O
  // ancestor in the topology: a package, a NUMA node's group, the machine).
  std::map<std::string, CpuList> pci_locality;
};

// Sorted numbers as ranges, "0-3,8,10-11"; `sep` between items (", " for rank lists in messages).
std::string FormatCpuList(const CpuList& cpus, std::string_view sep = ",");
CpuList Intersect(const CpuList& a, const CpuList& b);
CpuList Union(const CpuList& a, const CpuList& b);

// Keeps only `allowed` CPUs (this process's affinity) everywhere; objects left without a CPU go.
void RestrictTopology(Topology* topo, const CpuList& allowed);

}  // namespace ctrun
