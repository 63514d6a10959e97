#include "placement/binding_plan.h"

#include <algorithm>
#include <map>

namespace ctrun {
namespace {

size_t Overlap(const CpuList& a, const CpuList& b) { return Intersect(a, b).size(); }

// Index of the object sharing most CPUs with `cpus`; -1 when none shares any.
int MostOverlapping(const std::vector<TopoObject>& objs, const CpuList& cpus) {
  int best = -1;
  size_t best_n = 0;
  for (size_t i = 0; i < objs.size(); ++i)
    if (size_t n = Overlap(objs[i].cpus, cpus); n > best_n) best = static_cast<int>(i), best_n = n;
  return best;
}

// Indices of the objects sharing the most CPUs with `cpus` (several when they tie); empty when
// none shares any.
std::vector<int> AllMostOverlapping(const std::vector<TopoObject>& objs, const CpuList& cpus) {
  std::vector<int> best;
  size_t best_n = 0;
  for (size_t i = 0; i < objs.size(); ++i) {
    const size_t n = Overlap(objs[i].cpus, cpus);
    if (n == 0 || n < best_n) continue;
    if (n > best_n) best.clear(), best_n = n;
    best.push_back(static_cast<int>(i));
  }
  return best;
}

// Each rank's NUMA node (index into numa_nodes) from its GPU's locality. A GPU whose locality
// fits one node is on it. One near several nodes alike (firmware that gives no affinity: the
// locality is the machine) has no node of its own: such ranks go, in rank order, to the node
// among those that has the fewest ranks so far, so they spread instead of all taking the first.
std::vector<int> GpuNodes(const Topology& t, const std::vector<std::vector<int>>& candidates) {
  std::vector<int> node(candidates.size(), -1);
  std::vector<int> load(t.numa_nodes.size(), 0);
  for (size_t r = 0; r < candidates.size(); ++r)
    if (candidates[r].size() == 1) ++load[static_cast<size_t>(node[r] = candidates[r][0])];
  for (size_t r = 0; r < candidates.size(); ++r) {
    if (candidates[r].size() <= 1) continue;
    node[r] = *std::min_element(candidates[r].begin(), candidates[r].end(),
                                [&](int a, int b) { return load[static_cast<size_t>(a)] < load[static_cast<size_t>(b)]; });
    ++load[static_cast<size_t>(node[r])];
  }
  return node;
}

int NumaOf(const Topology& t, const CpuList& cpus) {
  const int i = MostOverlapping(t.numa_nodes, cpus);
  return i < 0 ? -1 : t.numa_nodes[static_cast<size_t>(i)].os_index;
}

// Objects (cores or L3s) inside `within`, in topology order.
std::vector<const TopoObject*> Inside(const std::vector<TopoObject>& objs, const CpuList& within) {
  std::vector<const TopoObject*> out;
  for (const auto& o : objs)
    if (!o.cpus.empty() && Overlap(o.cpus, within) == o.cpus.size()) out.push_back(&o);
  return out;
}

// Share k of m of `cores` (contiguous blocks); round-robin single cores when m > cores.
CpuList CoreShare(const std::vector<const TopoObject*>& cores, size_t k, size_t m, bool* shared) {
  CpuList out;
  if (cores.empty()) return out;
  if (m > cores.size()) {
    *shared = true;
    return cores[k % cores.size()]->cpus;
  }
  for (size_t c = k * cores.size() / m; c < (k + 1) * cores.size() / m; ++c) out = Union(out, cores[c]->cpus);
  return out;
}

CpuList AllCpus(const Topology& t) {
  CpuList all;
  for (const auto& n : t.numa_nodes) all = Union(all, n.cpus);
  for (const auto& c : t.cores) all = Union(all, c.cpus);
  return all;
}

StatusOr<std::vector<RankBinding>> PlanGpu(const Topology& t, BindMode mode, int nproc,
                                           const std::vector<std::string>& bus_ids) {
  std::vector<std::vector<int>> candidates(static_cast<size_t>(nproc));  // each rank's nearest nodes
  for (int r = 0; r < nproc; ++r) {
    const std::string bus = static_cast<size_t>(r) < bus_ids.size() ? bus_ids[static_cast<size_t>(r)] : "";
    auto it = bus.empty() ? t.pci_locality.end() : t.pci_locality.find(bus);
    if (it == t.pci_locality.end())
      return Status::Error("--numa-binding=" + std::string(BindModeName(mode)) + ": local rank " + std::to_string(r) +
                           (bus.empty() ? " has no GPU (or its PCI address is unknown)"
                                        : "'s GPU " + bus + " is not in the machine's topology") +
                           "; use --cpu-binding for jobs without GPUs");
    candidates[static_cast<size_t>(r)] = AllMostOverlapping(t.numa_nodes, it->second);
    if (candidates[static_cast<size_t>(r)].empty())
      return Status::Error("--numa-binding: the topology has no NUMA node with CPUs near GPU " + bus);
  }
  const std::vector<int> node = GpuNodes(t, candidates);
  std::vector<RankBinding> out(static_cast<size_t>(nproc));
  std::map<int, std::vector<int>> ranks_on_node;  // NUMA node -> its ranks, in rank order
  for (int r = 0; r < nproc; ++r) ranks_on_node[node[static_cast<size_t>(r)]].push_back(r);
  for (const auto& [n, ranks] : ranks_on_node) {
    const TopoObject& numa = t.numa_nodes[static_cast<size_t>(n)];
    for (size_t k = 0; k < ranks.size(); ++k) {
      RankBinding& b = out[static_cast<size_t>(ranks[k])];
      switch (mode) {
        case BindMode::kNode:
          b.cpus = numa.cpus;
          break;
        case BindMode::kSocket: {
          const int p = MostOverlapping(t.packages, numa.cpus);
          b.cpus = p < 0 ? numa.cpus : t.packages[static_cast<size_t>(p)].cpus;
          break;
        }
        case BindMode::kExclusive:
          b.cpus = CoreShare(Inside(t.cores, numa.cpus), k, ranks.size(), &b.shared);
          break;
        case BindMode::kCoreComplex: {
          auto l3s = Inside(t.l3s, numa.cpus);
          std::stable_sort(l3s.begin(), l3s.end(),
                           [](const TopoObject* x, const TopoObject* y) { return x->cpus.size() > y->cpus.size(); });
          if (l3s.empty()) {
            b.cpus = numa.cpus;  // no L3 inside the node (it is inside one L3): the node
            b.shared = ranks.size() > 1;
          } else {
            b.cpus = l3s[k % l3s.size()]->cpus;
            b.shared = ranks.size() > l3s.size();
          }
          break;
        }
        default:
          break;
      }
      if (b.cpus.empty()) b.cpus = numa.cpus;
      b.numa_node = numa.os_index;
    }
  }
  return out;
}

}  // namespace

StatusOr<BindMode> NumaBindingMode(const std::string& name) {
  if (name == "node") return BindMode::kNode;
  if (name == "socket") return BindMode::kSocket;
  if (name == "exclusive") return BindMode::kExclusive;
  if (name == "core-complex") return BindMode::kCoreComplex;
  return Status::Error("expected node, socket, exclusive or core-complex");
}

StatusOr<BindMode> CpuBindingMode(const std::string& name) {
  if (name == "numa") return BindMode::kCpuNuma;
  if (name == "socket") return BindMode::kCpuSocket;
  if (name == "core") return BindMode::kCpuCore;
  if (name == "none") return BindMode::kNone;
  return Status::Error("expected numa, socket, core or none");
}

bool UsesGpus(BindMode m) {
  return m == BindMode::kNode || m == BindMode::kSocket || m == BindMode::kExclusive || m == BindMode::kCoreComplex;
}

const char* BindModeName(BindMode m) {
  switch (m) {
    case BindMode::kNone: return "none";
    case BindMode::kNode: return "node";
    case BindMode::kSocket: return "socket";
    case BindMode::kExclusive: return "exclusive";
    case BindMode::kCoreComplex: return "core-complex";
    case BindMode::kCpuNuma: return "numa";
    case BindMode::kCpuSocket: return "socket";
    case BindMode::kCpuCore: return "core";
  }
  return "";
}

StatusOr<std::vector<RankBinding>> PlanBindings(const Topology& t, BindMode mode, int nproc,
                                                const std::vector<std::string>& gpu_bus_ids) {
  if (nproc < 1) return std::vector<RankBinding>{};
  if (UsesGpus(mode)) return PlanGpu(t, mode, nproc, gpu_bus_ids);
  std::vector<RankBinding> out(static_cast<size_t>(nproc));
  if (mode == BindMode::kNone) return out;
  const size_t n = static_cast<size_t>(nproc);
  std::vector<const TopoObject*> cores;
  for (const auto& c : t.cores) cores.push_back(&c);
  const std::vector<TopoObject>& spread = mode == BindMode::kCpuNuma ? t.numa_nodes : t.packages;
  for (size_t r = 0; r < n; ++r) {
    RankBinding& b = out[r];
    if (mode == BindMode::kCpuCore) {
      b.cpus = CoreShare(cores, r, n, &b.shared);
    } else if (!spread.empty()) {
      b.cpus = spread[r * spread.size() / n].cpus;
    }
    if (b.cpus.empty()) b.cpus = AllCpus(t);  // a topology without those objects: the machine
    b.numa_node = NumaOf(t, b.cpus);
  }
  return out;
}

}  // namespace ctrun
