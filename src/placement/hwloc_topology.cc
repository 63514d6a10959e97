#include "placement/hwloc_topology.h"

#include <dlfcn.h>
#include <hwloc.h>

#include <algorithm>
#include <cstdio>

namespace ctrun {
namespace {

struct HwlocApi {
  unsigned (*api_version)();
  int (*init)(hwloc_topology_t*);
  int (*set_xml)(hwloc_topology_t, const char*);
  int (*set_io_filter)(hwloc_topology_t, enum hwloc_type_filter_e);
  int (*load)(hwloc_topology_t);
  void (*destroy)(hwloc_topology_t);
  hwloc_obj_t (*obj_by_depth)(hwloc_topology_t, int, unsigned);
  int (*bitmap_next)(hwloc_const_bitmap_t, int);
};

StatusOr<const HwlocApi*> LoadHwloc() {
  static const StatusOr<const HwlocApi*> loaded = []() -> StatusOr<const HwlocApi*> {
    void* lib = ::dlopen("libhwloc.so.15", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return Status::Error(std::string("CPU binding needs hwloc (libhwloc15): ") + ::dlerror());
    static HwlocApi api{};
    bool ok = true;
    auto sym = [&](auto* out, const char* name) {
      void* p = ::dlsym(lib, name);
      ok = ok && p != nullptr;
      *out = reinterpret_cast<std::remove_reference_t<decltype(*out)>>(p);
    };
    sym(&api.api_version, "hwloc_get_api_version");
    sym(&api.init, "hwloc_topology_init");
    sym(&api.set_xml, "hwloc_topology_set_xml");
    sym(&api.set_io_filter, "hwloc_topology_set_io_types_filter");
    sym(&api.load, "hwloc_topology_load");
    sym(&api.destroy, "hwloc_topology_destroy");
    sym(&api.obj_by_depth, "hwloc_get_obj_by_depth");
    sym(&api.bitmap_next, "hwloc_bitmap_next");
    if (!ok) return Status::Error("libhwloc.so.15 lacks a function ctrun needs");
    if ((api.api_version() >> 16) != (HWLOC_API_VERSION >> 16))
      return Status::Error("libhwloc.so.15 has API version " + std::to_string(api.api_version() >> 16) +
                           ".x; ctrun was built for " + std::to_string(HWLOC_API_VERSION >> 16) + ".x");
    return &api;
  }();
  return loaded;
}

CpuList Cpus(const HwlocApi& api, hwloc_const_bitmap_t set) {
  CpuList out;
  if (!set) return out;
  for (int i = api.bitmap_next(set, -1); i >= 0; i = api.bitmap_next(set, i)) out.push_back(i);
  return out;
}

std::string BusId(const hwloc_obj_t o) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", static_cast<unsigned>(o->attr->pcidev.domain),
                o->attr->pcidev.bus, o->attr->pcidev.dev, o->attr->pcidev.func);
  return buf;
}

// Depth-first over normal, memory and I/O children; `local` is the CPUs of the nearest non-I/O
// ancestor (I/O objects have no cpuset).
void Walk(const HwlocApi& api, hwloc_obj_t o, const CpuList& local, Topology* t) {
  const CpuList cpus = o->cpuset ? Cpus(api, o->cpuset) : local;
  TopoObject obj{static_cast<int>(o->os_index), cpus};
  switch (o->type) {
    case HWLOC_OBJ_NUMANODE:
      // hwloc gives a NUMA node its parent's CPUs, also to one that owns none (HBM in flat mode
      // or GPU memory beside the DDR node, which comes first; see DropCpulessNodes).
      if (!cpus.empty() && o->parent && o->parent->memory_first_child == o) t->numa_nodes.push_back(obj);
      break;
    case HWLOC_OBJ_PACKAGE: t->packages.push_back(obj); break;
    case HWLOC_OBJ_L3CACHE: t->l3s.push_back(obj); break;
    case HWLOC_OBJ_CORE: t->cores.push_back(obj); break;
    case HWLOC_OBJ_PCI_DEVICE: t->pci_locality[BusId(o)] = cpus; break;
    default: break;
  }
  for (unsigned i = 0; i < o->arity; ++i) Walk(api, o->children[i], cpus, t);
  for (hwloc_obj_t c = o->memory_first_child; c; c = c->next_sibling) Walk(api, c, cpus, t);
  for (hwloc_obj_t c = o->io_first_child; c; c = c->next_sibling) Walk(api, c, cpus, t);
}

// A NUMA node whose CPUs strictly contain another node's is memory attached above several nodes
// (CXL memory at the machine's root): its CPUs belong to those nodes, not to it.
void DropCpulessNodes(std::vector<TopoObject>* nodes) {
  auto strictly_contains = [](const CpuList& big, const CpuList& small) {
    return big.size() > small.size() && std::includes(big.begin(), big.end(), small.begin(), small.end());
  };
  std::vector<TopoObject> kept;
  for (const TopoObject& n : *nodes) {
    bool above_another = false;
    for (const TopoObject& m : *nodes) above_another |= strictly_contains(n.cpus, m.cpus);
    if (!above_another) kept.push_back(n);
  }
  *nodes = std::move(kept);
}

}  // namespace

StatusOr<Topology> LoadTopology(const std::string& xml_path, bool with_pci) {
  auto loaded = LoadHwloc();
  if (!loaded.ok()) return loaded.status();
  const HwlocApi& api = *loaded.value();
  hwloc_topology_t topo = nullptr;
  if (api.init(&topo) != 0) return Status::Error("hwloc cannot create a topology");
  struct Guard {
    const HwlocApi& api;
    hwloc_topology_t t;
    ~Guard() { api.destroy(t); }
  } guard{api, topo};
  if (!xml_path.empty() && api.set_xml(topo, xml_path.c_str()) != 0)
    return Status::Error("hwloc cannot read the topology file " + xml_path);
  // PCI GPUs and their bridges, or no I/O object at all.
  api.set_io_filter(topo, with_pci ? HWLOC_TYPE_FILTER_KEEP_IMPORTANT : HWLOC_TYPE_FILTER_KEEP_NONE);
  if (api.load(topo) != 0)
    return Status::Error("hwloc cannot load the topology" + (xml_path.empty() ? "" : " from " + xml_path));
  Topology t;
  Walk(api, api.obj_by_depth(topo, 0, 0), {}, &t);
  DropCpulessNodes(&t.numa_nodes);
  return t;
}

}  // namespace ctrun
