// Binding plans from synthetic hwloc topologies (tests/placement/topologies, made by
// make_topologies.py): 1 NUMA node / 2 GPUs, 2 NUMA nodes / 4 GPUs, 8 NUMA nodes / 8 GPUs.
#include "placement/binding_plan.h"

#include <gtest/gtest.h>

#include "placement/hwloc_topology.h"

namespace ctrun {
namespace {

Topology Load(const std::string& name) {
  auto t = LoadTopology(std::string(TOPOLOGY_DIR) + "/" + name);
  EXPECT_TRUE(t.ok()) << t.message();
  return t.ok() ? t.value() : Topology{};
}

std::vector<std::string> Cpus(const std::vector<RankBinding>& plan) {
  std::vector<std::string> out;
  for (const auto& b : plan) out.push_back(FormatCpuList(b.cpus));
  return out;
}
std::vector<int> Nodes(const std::vector<RankBinding>& plan) {
  std::vector<int> out;
  for (const auto& b : plan) out.push_back(b.numa_node);
  return out;
}

std::vector<RankBinding> Plan(const Topology& t, BindMode m, int n, std::vector<std::string> gpus = {}) {
  auto p = PlanBindings(t, m, n, gpus);
  EXPECT_TRUE(p.ok()) << p.message();
  return p.ok() ? p.value() : std::vector<RankBinding>{};
}

const std::vector<std::string> k2NumaGpus = {"0000:18:00.0", "0000:3b:00.0", "0000:86:00.0", "0000:af:00.0"};
const std::vector<std::string> k8NumaGpus = {"0000:01:00.0", "0000:21:00.0", "0000:41:00.0", "0000:61:00.0",
                                             "0000:81:00.0", "0000:a1:00.0", "0000:c1:00.0", "0000:e1:00.0"};

TEST(Topology, LoadsObjectsAndGpuLocalityFromXml) {
  Topology t = Load("topo_2numa.xml");
  ASSERT_EQ(t.numa_nodes.size(), 2u);
  EXPECT_EQ(FormatCpuList(t.numa_nodes[1].cpus), "16-31");
  EXPECT_EQ(t.packages.size(), 2u);
  EXPECT_EQ(t.l3s.size(), 4u);
  EXPECT_EQ(t.cores.size(), 16u);
  EXPECT_EQ(FormatCpuList(t.cores[0].cpus), "0-1");
  ASSERT_EQ(t.pci_locality.count("0000:86:00.0"), 1u);
  EXPECT_EQ(FormatCpuList(t.pci_locality["0000:86:00.0"]), "16-31");
  Topology t8 = Load("topo_8numa.xml");
  EXPECT_EQ(t8.numa_nodes.size(), 8u);
  EXPECT_EQ(FormatCpuList(t8.pci_locality["0000:c1:00.0"]), "96-111");
}

TEST(Topology, MissingFileIsAnError) {
  auto t = LoadTopology("/nonexistent/topo.xml");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.message().find("/nonexistent/topo.xml"), std::string::npos);
}

TEST(NumaBinding, NodeOnOneTwoAndEightNodes) {
  Topology t1 = Load("topo_1numa.xml");
  auto p1 = Plan(t1, BindMode::kNode, 2, {"0000:3b:00.0", "0000:5e:00.0"});
  EXPECT_EQ(Cpus(p1), (std::vector<std::string>{"0-15", "0-15"}));
  EXPECT_EQ(Nodes(p1), (std::vector<int>{0, 0}));

  Topology t2 = Load("topo_2numa.xml");
  auto p2 = Plan(t2, BindMode::kNode, 4, k2NumaGpus);
  EXPECT_EQ(Cpus(p2), (std::vector<std::string>{"0-15", "0-15", "16-31", "16-31"}));
  EXPECT_EQ(Nodes(p2), (std::vector<int>{0, 0, 1, 1}));

  Topology t8 = Load("topo_8numa.xml");
  auto p8 = Plan(t8, BindMode::kNode, 8, k8NumaGpus);
  EXPECT_EQ(Cpus(p8)[5], "80-95");
  EXPECT_EQ(Nodes(p8), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
}

// NUMA nodes without CPUs (HBM or GPU memory beside each package's DDR node, CXL memory at the
// machine's root) get their parent's CPUs from hwloc. They are not nodes to bind to: the plans
// are those of the same machine without them.
TEST(NumaBinding, NodesWithoutCpusAreLeftOut) {
  Topology t = Load("topo_hbm.xml");
  ASSERT_EQ(t.numa_nodes.size(), 2u);
  EXPECT_EQ(t.numa_nodes[0].os_index, 0);
  EXPECT_EQ(t.numa_nodes[1].os_index, 2);
  auto node = Plan(t, BindMode::kNode, 4, k2NumaGpus);
  EXPECT_EQ(Cpus(node), (std::vector<std::string>{"0-15", "0-15", "16-31", "16-31"}));
  EXPECT_EQ(Nodes(node), (std::vector<int>{0, 0, 2, 2}));
  auto ex = Plan(t, BindMode::kExclusive, 4, k2NumaGpus);
  EXPECT_EQ(Cpus(ex), (std::vector<std::string>{"0-7", "8-15", "16-23", "24-31"}));
  for (const auto& b : ex) EXPECT_FALSE(b.shared);
}

TEST(NumaBinding, RanksFollowTheirGpuNotTheirNumber) {
  Topology t2 = Load("topo_2numa.xml");
  // --gpus 2,0: local rank 0 has the GPU on node 1.
  auto p = Plan(t2, BindMode::kNode, 2, {"0000:86:00.0", "0000:18:00.0"});
  EXPECT_EQ(Nodes(p), (std::vector<int>{1, 0}));
}

// Firmware without affinity: a GPU's locality is the whole machine. Such ranks spread over the
// nodes (after the ranks whose GPUs have a node), rather than all binding to node 0.
TEST(NumaBinding, GpusNearEveryNodeSpreadOverTheNodes) {
  Topology t2 = Load("topo_2numa.xml");
  CpuList machine;
  for (int c = 0; c < 32; ++c) machine.push_back(c);
  for (const auto& bus : k2NumaGpus) t2.pci_locality[bus] = machine;
  auto p = Plan(t2, BindMode::kNode, 4, k2NumaGpus);
  EXPECT_EQ(Nodes(p), (std::vector<int>{0, 1, 0, 1}));
  auto ex = Plan(t2, BindMode::kExclusive, 4, k2NumaGpus);
  EXPECT_EQ(Cpus(ex), (std::vector<std::string>{"0-7", "16-23", "8-15", "24-31"}));
  // Two GPUs on node 0 as the topology says, the third near both nodes: it goes to node 1.
  Topology mixed = Load("topo_2numa.xml");
  mixed.pci_locality["0000:86:00.0"] = machine;
  auto m = Plan(mixed, BindMode::kNode, 3, {"0000:18:00.0", "0000:86:00.0", "0000:3b:00.0"});
  EXPECT_EQ(Nodes(m), (std::vector<int>{0, 1, 0}));
}

TEST(NumaBinding, SocketTakesTheWholePackage) {
  Topology t8 = Load("topo_8numa.xml");
  auto p = Plan(t8, BindMode::kSocket, 8, k8NumaGpus);
  EXPECT_EQ(Cpus(p)[0], "0-63");
  EXPECT_EQ(Cpus(p)[7], "64-127");
  EXPECT_EQ(p[7].numa_node, 7);
}

TEST(NumaBinding, ExclusiveSplitsTheNodesCoresWithoutSharing) {
  Topology t2 = Load("topo_2numa.xml");
  auto p = Plan(t2, BindMode::kExclusive, 4, k2NumaGpus);
  // 8 cores (16 threads) per node, two GPUs per node: 4 whole cores each.
  EXPECT_EQ(Cpus(p), (std::vector<std::string>{"0-7", "8-15", "16-23", "24-31"}));
  for (const auto& b : p) EXPECT_FALSE(b.shared);
  Topology t1 = Load("topo_1numa.xml");
  auto one = Plan(t1, BindMode::kExclusive, 1, {"0000:5e:00.0"});
  EXPECT_EQ(Cpus(one), std::vector<std::string>{"0-15"});
}

TEST(NumaBinding, CoreComplexGivesEachGpuItsOwnL3) {
  Topology t2 = Load("topo_2numa.xml");
  auto p = Plan(t2, BindMode::kCoreComplex, 4, k2NumaGpus);
  EXPECT_EQ(Cpus(p), (std::vector<std::string>{"0-7", "8-15", "16-23", "24-31"}));
  Topology t8 = Load("topo_8numa.xml");
  auto p8 = Plan(t8, BindMode::kCoreComplex, 8, k8NumaGpus);
  EXPECT_EQ(Cpus(p8)[3], "48-55");  // node 3's first L3
  // Three ranks on one node with two L3s: the third shares.
  Topology t1 = Load("topo_1numa.xml");
  auto p1 = Plan(t1, BindMode::kCoreComplex, 3, {"0000:3b:00.0", "0000:5e:00.0", "0000:3b:00.0"});
  EXPECT_EQ(Cpus(p1), (std::vector<std::string>{"0-7", "8-15", "0-7"}));
  EXPECT_TRUE(p1[2].shared);
}

TEST(NumaBinding, ARankWithoutAKnownGpuIsAnError) {
  Topology t2 = Load("topo_2numa.xml");
  auto p = PlanBindings(t2, BindMode::kNode, 5, k2NumaGpus);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.message(),
            "--numa-binding=node: local rank 4 has no GPU (or its PCI address is unknown); use --cpu-binding for "
            "jobs without GPUs");
  auto q = PlanBindings(t2, BindMode::kExclusive, 1, {"0000:99:00.0"});
  ASSERT_FALSE(q.ok());
  EXPECT_NE(q.message().find("GPU 0000:99:00.0 is not in the machine's topology"), std::string::npos);
}

TEST(CpuBinding, NumaSpreadsRanksInBlocks) {
  Topology t8 = Load("topo_8numa.xml");
  auto p = Plan(t8, BindMode::kCpuNuma, 4);
  EXPECT_EQ(Nodes(p), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(Cpus(p)[1], "32-47");
  Topology t2 = Load("topo_2numa.xml");
  EXPECT_EQ(Nodes(Plan(t2, BindMode::kCpuNuma, 4)), (std::vector<int>{0, 0, 1, 1}));
  Topology t1 = Load("topo_1numa.xml");
  EXPECT_EQ(Cpus(Plan(t1, BindMode::kCpuNuma, 2)), (std::vector<std::string>{"0-15", "0-15"}));
}

TEST(CpuBinding, SocketAndCore) {
  Topology t2 = Load("topo_2numa.xml");
  EXPECT_EQ(Cpus(Plan(t2, BindMode::kCpuSocket, 2)), (std::vector<std::string>{"0-15", "16-31"}));
  auto cores = Plan(t2, BindMode::kCpuCore, 4);
  EXPECT_EQ(Cpus(cores), (std::vector<std::string>{"0-7", "8-15", "16-23", "24-31"}));
  auto three = Plan(t2, BindMode::kCpuCore, 3);  // 16 cores: 5, 5 and 6
  EXPECT_EQ(Cpus(three), (std::vector<std::string>{"0-9", "10-19", "20-31"}));
  EXPECT_EQ(Nodes(three), (std::vector<int>{0, 0, 1}));
}

TEST(CpuBinding, MoreRanksThanCoresShareRoundRobin) {
  Topology t1 = Load("topo_1numa.xml");  // 8 cores
  auto p = Plan(t1, BindMode::kCpuCore, 10);
  EXPECT_EQ(Cpus(p)[8], "0-1");
  EXPECT_EQ(Cpus(p)[9], "2-3");
  EXPECT_TRUE(p[9].shared);
}

TEST(CpuBinding, NoneBindsNothing) {
  Topology t1 = Load("topo_1numa.xml");
  for (const auto& b : Plan(t1, BindMode::kNone, 3)) EXPECT_TRUE(b.cpus.empty());
}

TEST(Topology, RestrictedToTheAllowedCpus) {
  Topology t2 = Load("topo_2numa.xml");
  RestrictTopology(&t2, {0, 1, 2, 3, 16, 17});
  EXPECT_EQ(t2.numa_nodes.size(), 2u);
  EXPECT_EQ(t2.cores.size(), 3u);
  EXPECT_EQ(Cpus(Plan(t2, BindMode::kCpuCore, 3)), (std::vector<std::string>{"0-1", "2-3", "16-17"}));
}

TEST(CpuList, Formats) {
  EXPECT_EQ(FormatCpuList({}), "");
  EXPECT_EQ(FormatCpuList({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
}

TEST(BindModes, NamesAndErrors) {
  EXPECT_EQ(NumaBindingMode("core-complex").value(), BindMode::kCoreComplex);
  EXPECT_FALSE(NumaBindingMode("numa").ok());
  EXPECT_EQ(CpuBindingMode("core").value(), BindMode::kCpuCore);
  EXPECT_EQ(CpuBindingMode("x").message(), "expected numa, socket, core or none");
}

}  // namespace
}  // namespace ctrun
