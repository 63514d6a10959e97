#include "placement/topology.h"

#include <algorithm>
#include <iterator>

namespace ctrun {

std::string FormatCpuList(const CpuList& cpus, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += sep;
    out += std::to_string(cpus[i]);
    if (j > i) out += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

CpuList Intersect(const CpuList& a, const CpuList& b) {
  CpuList out;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

CpuList Union(const CpuList& a, const CpuList& b) {
  CpuList out;
  std::set_union(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

void RestrictTopology(Topology* topo, const CpuList& allowed) {
  auto restrict = [&](std::vector<TopoObject>& objs) {
    for (auto& o : objs) o.cpus = Intersect(o.cpus, allowed);
    std::erase_if(objs, [](const TopoObject& o) { return o.cpus.empty(); });
  };
  restrict(topo->numa_nodes);
  restrict(topo->packages);
  restrict(topo->l3s);
  restrict(topo->cores);
  for (auto& [bus, cpus] : topo->pci_locality) cpus = Intersect(cpus, allowed);
}

}  // namespace ctrun
