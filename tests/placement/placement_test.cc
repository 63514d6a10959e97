// Per-rank placement (GPU, CPUs, the debug rank) and the flags that ask for it.
#include "placement/placement.h"

#include <gtest/gtest.h>

#include "agent/launch_checks.h"
#include "cli/cli.h"
#include "helpers/map_env.h"
#include "placement/hwloc_topology.h"

namespace ctrun {
namespace {

CliOutcome Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "ctrun");
  return ParseCommandLine(args, testing::MapEnv({}));
}

GpuInventory TwoGpus() {
  GpuInventory inv;
  inv.source = "nvml";
  inv.visible = {"0", "1"};
  inv.devices = {GpuDevice{0, "GPU-a", "0000:18:00.0", {}}, GpuDevice{1, "GPU-b", "0000:86:00.0", {}}};
  return inv;
}

RankInfo Rank(int local, int global) {
  RankInfo r;
  r.local_rank = local;
  r.global_rank = global;
  return r;
}

SpawnSpec Spec() {
  SpawnSpec s;
  s.executable = "/usr/bin/python3";
  s.argv = {"/usr/bin/python3", "-u", "train.py", "--lr", "0.1"};
  return s;
}

TEST(Placement, NumaBindingPlansFromTheGpusLocality) {
  auto topo = LoadTopology(std::string(TOPOLOGY_DIR) + "/topo_2numa.xml");
  ASSERT_TRUE(topo.ok()) << topo.message();
  LaunchConfig c;
  c.nproc_per_node = 2;
  c.numa_binding = "node";
  auto plan = PlanPlacement(c, TwoGpus(), RequestedBindMode(c).value(), &topo.value(), "");
  ASSERT_TRUE(plan.ok()) << plan.message();
  SpawnSpec s = Spec();
  EXPECT_EQ(ApplyPlacement(plan.value(), 1, Rank(1, 1), &s), "");
  EXPECT_EQ(FormatCpuList(s.cpu_affinity), "16-31");
  EXPECT_EQ(s.argv, Spec().argv);  // only the debug rank's command changes
  EXPECT_EQ(FormatBinding(plan.value(), 1, Rank(1, 1)), "rank 1 (local_rank 1): cpus 16-31 (node) | numa 1 | gpu 1 (0000:86:00.0)");
}

TEST(Placement, WithoutBindingNothingIsBoundAndTheGpuIsStillReported) {
  LaunchConfig c;
  c.nproc_per_node = 3;
  auto plan = PlanPlacement(c, TwoGpus(), BindMode::kNone, nullptr, "");
  ASSERT_TRUE(plan.ok());
  SpawnSpec s = Spec();
  ApplyPlacement(plan.value(), 0, Rank(0, 4), &s);
  EXPECT_TRUE(s.cpu_affinity.empty());
  EXPECT_EQ(FormatBinding(plan.value(), 0, Rank(0, 4)), "rank 4 (local_rank 0): cpus not bound | gpu 0 (0000:18:00.0)");
  EXPECT_EQ(FormatBinding(plan.value(), 2, Rank(2, 6)), "rank 6 (local_rank 2): cpus not bound | gpu none");
}

TEST(Placement, DebugRankRunsUnderGdbserver) {
  LaunchConfig c;
  c.nproc_per_node = 2;
  c.debug_rank = 1;
  c.debug_port = 2345;
  auto plan = PlanPlacement(c, GpuInventory{}, BindMode::kNone, nullptr, "/usr/bin/gdbserver");
  ASSERT_TRUE(plan.ok());
  SpawnSpec other = Spec();
  EXPECT_EQ(ApplyPlacement(plan.value(), 0, Rank(0, 0), &other), "");
  EXPECT_FALSE(UnderDebugger(plan.value(), Rank(0, 0)));
  SpawnSpec s = Spec();
  const std::string notice = ApplyPlacement(plan.value(), 1, Rank(1, 1), &s);
  EXPECT_TRUE(UnderDebugger(plan.value(), Rank(1, 1)));
  EXPECT_EQ(s.executable, "/usr/bin/gdbserver");
  EXPECT_EQ(s.argv, (std::vector<std::string>{"gdbserver", "--no-startup-with-shell", ":2345", "/usr/bin/python3",
                                              "-u", "train.py", "--lr", "0.1"}));
  EXPECT_FALSE(s.stop_before_exec);
  EXPECT_NE(notice.find("port 2345"), std::string::npos);
  EXPECT_NE(FormatBinding(plan.value(), 1, Rank(1, 1)).find("under a debugger"), std::string::npos);
}

TEST(Placement, DebugRankWithoutGdbserverStopsBeforeExec) {
  LaunchConfig c;
  c.nproc_per_node = 1;
  c.debug_rank = 0;
  auto plan = PlanPlacement(c, GpuInventory{}, BindMode::kNone, nullptr, "");
  ASSERT_TRUE(plan.ok());
  SpawnSpec s = Spec();
  EXPECT_NE(ApplyPlacement(plan.value(), 0, Rank(0, 0), &s).find("gdb -p"), std::string::npos);
  EXPECT_TRUE(s.stop_before_exec);
  EXPECT_EQ(s.argv, Spec().argv);
}

TEST(PlacementFlags, Parsed) {
  CliOutcome o = Parse({"--gpus", "0,2-3", "--cpu-binding=core", "--report-bindings", "--debug-rank=3:5678", "./t"});
  ASSERT_EQ(o.action, CliOutcome::Action::kRun) << o.error;
  EXPECT_EQ(o.config.gpus, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(o.config.cpu_binding, "core");
  EXPECT_TRUE(o.config.report_bindings);
  EXPECT_EQ(o.config.debug_rank, 3);
  EXPECT_EQ(o.config.debug_port, 5678);
  CliOutcome n = Parse({"--numa-binding=exclusive", "--debug_rank", "0", "./t"});
  ASSERT_EQ(n.action, CliOutcome::Action::kRun) << n.error;
  EXPECT_EQ(n.config.numa_binding, "exclusive");
  EXPECT_EQ(n.config.debug_port, 0);
}

TEST(PlacementFlags, BadValuesAreOneLineErrors) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--gpus", "a", "./t"}, "invalid value 'a' for --gpus: 'a' is not an index or a range like 0-3"},
      {{"--gpus", "1,1", "./t"}, "invalid value '1,1' for --gpus: 1 is listed twice"},
      {{"--gpus", "3-1", "./t"}, "invalid value '3-1' for --gpus: '3-1' is not an index or a range like 0-3"},
      {{"--cpu-binding", "l3", "./t"}, "invalid value 'l3' for --cpu-binding: expected numa, socket, core or none"},
      {{"--numa-binding", "numa", "./t"},
       "invalid value 'numa' for --numa-binding: expected node, socket, exclusive or core-complex"},
      {{"--numa-binding", "node", "--cpu-binding", "core", "./t"},
       "invalid value 'core' for --cpu-binding: give --numa-binding (workers with GPUs) or --cpu-binding "
       "(without), not both"},
      {{"--debug-rank", "-1", "./t"},
       "invalid value '-1' for --debug-rank: expected a global rank (>= 0), optionally with :PORT"},
      {{"--debug-rank", "1:0", "./t"}, "invalid value '1:0' for --debug-rank: port must be in 1..65535"},
  };
  for (const auto& [args, message] : cases) {
    CliOutcome o = Parse(args);
    EXPECT_EQ(o.exit_code, 2) << message;
    EXPECT_EQ(o.error, "ctrun: error: " + message + "\n");
  }
}

TEST(PlacementFlags, VirtualLocalRankNeedsAGpuPerWorker) {
  LaunchConfig c;
  c.nproc_per_node = 3;
  c.virtual_local_rank = true;
  Environment env = Environment::FromEntries({"CUDA_VISIBLE_DEVICES=4,5"});
  Status s = CheckGpuFlags(c, env);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "--virtual-local-rank: local rank 2 has no GPU: CUDA_VISIBLE_DEVICES=4,5 lists 2 for 3 workers");
  c.nproc_per_node = 2;
  EXPECT_TRUE(CheckGpuFlags(c, env).ok());
  EXPECT_TRUE(CheckGpuFlags(c, Environment::FromEntries({})).ok());  // torchrun: str(local_rank)
}

TEST(PlacementFlags, DebugRankMustExist) {
  LaunchConfig c;
  c.nproc_per_node = 2;
  c.debug_rank = 2;
  Status s = CheckGpuFlags(c, Environment::FromEntries({}));
  EXPECT_EQ(s.message(), "invalid value '2' for --debug-rank: the job has 2 ranks (0-1)");
}

}  // namespace
}  // namespace ctrun
