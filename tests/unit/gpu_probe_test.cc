#include "gpu/gpu_probe.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "agent/launch_checks.h"

namespace ctrun {
namespace {

namespace fs = std::filesystem;

// An inventory of n GPUs, as ResolveNproc sees it.
GpuInventory Gpus(int n) {
  GpuInventory inv;
  inv.source = n ? "fake" : "none";
  for (int i = 0; i < n; ++i) {
    inv.visible.push_back(std::to_string(i));
    inv.devices.push_back(GpuDevice{i, "", "", {}});
  }
  return inv;
}

auto NoEnv() {
  return [](const std::string&) -> std::optional<std::string> { return std::nullopt; };
}

TEST(GpuProbe, CudaVisibleDevicesCountsLikeTheRuntime) {
  EXPECT_EQ(CountVisibleDevices("0,1,2,3"), 4);
  EXPECT_EQ(CountVisibleDevices(""), 0);
  EXPECT_EQ(CountVisibleDevices("-1"), 0);
  EXPECT_EQ(CountVisibleDevices("0,-1,2"), 1);
  EXPECT_EQ(CountVisibleDevices("GPU-8a1b,GPU-77c2"), 2);
  SystemGpuProbe p([](const std::string& k) -> std::optional<std::string> {
    if (k == "CUDA_VISIBLE_DEVICES") return "2,3";
    return std::nullopt;
  });
  EXPECT_EQ(p.Count().count, 2);
  EXPECT_EQ(p.Count().source, "CUDA_VISIBLE_DEVICES");
}

class SysfsFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("ctrun_gpu_" + std::to_string(::getpid()));
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  // driver: the kernel driver bound to it ("" none), a `driver` link as sysfs has it.
  void PciDevice(const std::string& name, const std::string& vendor, const std::string& cls,
                 const std::string& driver = "nvidia") {
    fs::path d = root_ / "sys/bus/pci/devices" / name;
    fs::create_directories(d);
    std::ofstream(d / "vendor") << vendor << "\n";
    std::ofstream(d / "class") << cls << "\n";
    if (driver.empty()) return;
    fs::create_directories(root_ / "sys/bus/pci/drivers" / driver);
    fs::create_directory_symlink("../../../bus/pci/drivers/" + driver, d / "driver");
  }
  fs::path root_;
};

TEST_F(SysfsFixture, CountsNvidiaDisplayAnd3dControllers) {
  PciDevice("0000:01:00.0", "0x10de", "0x030200");
  PciDevice("0000:02:00.0", "0x10de", "0x030000");
  PciDevice("0000:02:00.1", "0x10de", "0x040300", "snd_hda_intel");  // its HDMI audio function
  PciDevice("0000:03:00.0", "0x8086", "0x030000", "i915");           // not NVIDIA
  SystemGpuProbe p(NoEnv(), root_.string());
  EXPECT_EQ(p.Count().count, 2);
  EXPECT_EQ(p.Count().source, "sysfs");
}

// NVIDIA GPUs CUDA cannot use: passed through to a VM, driven by nouveau, bound to no driver.
// Counting them would start workers that fail in CUDA's init instead of the "no GPU" error.
TEST_F(SysfsFixture, CountsOnlyGpusBoundToTheNvidiaDriver) {
  PciDevice("0000:01:00.0", "0x10de", "0x030200", "vfio-pci");
  PciDevice("0000:02:00.0", "0x10de", "0x030000", "nouveau");
  PciDevice("0000:03:00.0", "0x10de", "0x030200", "");
  SystemGpuProbe none(NoEnv(), root_.string());
  EXPECT_EQ(none.Count().count, 0);
  EXPECT_EQ(none.Count().source, "none");
  PciDevice("0000:04:00.0", "0x10de", "0x030200", "nvidia");
  SystemGpuProbe one(NoEnv(), root_.string());
  GpuInventory inv = one.Probe();
  ASSERT_EQ(inv.count(), 1);
  EXPECT_EQ(inv.devices[0].pci_bus_id, "0000:04:00.0");
  EXPECT_EQ(inv.visible, std::vector<std::string>{"0"});
}

TEST_F(SysfsFixture, ProcDriverWinsOverSysfs) {
  fs::create_directories(root_ / "proc/driver/nvidia/gpus/0000:01:00.0");
  PciDevice("0000:01:00.0", "0x10de", "0x030200");
  PciDevice("0000:02:00.0", "0x10de", "0x030200");
  SystemGpuProbe p(NoEnv(), root_.string());
  EXPECT_EQ(p.Count().count, 1);
  EXPECT_EQ(p.Count().source, "procfs");
}

TEST_F(SysfsFixture, NothingMeansZero) {
  SystemGpuProbe p(NoEnv(), root_.string());
  EXPECT_EQ(p.Count().count, 0);
}

TEST(ResolveNproc, CountsCpuGpuAuto) {
  LaunchConfig c;
  c.nproc.kind = NprocSpec::Kind::kCpu;
  ASSERT_TRUE(ResolveNproc(&c, Gpus(0), 6).ok());
  EXPECT_EQ(c.nproc_per_node, 6);
  c.nproc.kind = NprocSpec::Kind::kGpu;
  EXPECT_FALSE(ResolveNproc(&c, Gpus(0), 6).ok());
  EXPECT_NE(ResolveNproc(&c, Gpus(0), 6).message().find("no GPU"), std::string::npos);
  ASSERT_TRUE(ResolveNproc(&c, Gpus(8), 6).ok());
  EXPECT_EQ(c.nproc_per_node, 8);
  c.nproc.kind = NprocSpec::Kind::kAuto;
  ASSERT_TRUE(ResolveNproc(&c, Gpus(8), 6).ok());
  EXPECT_EQ(c.nproc_per_node, 8);
  ASSERT_TRUE(ResolveNproc(&c, Gpus(0), 6).ok());
  EXPECT_EQ(c.nproc_per_node, 6);
}

// A CUDA process uses only the first MIG instance of a CUDA_VISIBLE_DEVICES list of several: gpu
// and auto start one worker for it (torchrun's device_count is 1) and say so, unless
// --virtual-local-rank gives each worker its own entry; the inventory keeps every entry.
TEST(ResolveNproc, AMigListCountsOneInstanceUnlessEachWorkerGetsItsOwn) {
  GpuInventory mig = Gpus(3);
  mig.visible = {"MIG-aaaa", "MIG-bbbb", "MIG-cccc"};
  LaunchConfig c;
  for (NprocSpec::Kind kind : {NprocSpec::Kind::kGpu, NprocSpec::Kind::kAuto}) {
    c.nproc.kind = kind;
    c.virtual_local_rank = false;
    ASSERT_TRUE(ResolveNproc(&c, mig, 6).ok());
    EXPECT_EQ(c.nproc_per_node, 1);
    EXPECT_EQ(MigListNotice(c, mig), std::string("CUDA_VISIBLE_DEVICES lists 3 MIG instances, and a CUDA process uses only the first: "
                                                 "--nproc_per_node=") + (kind == NprocSpec::Kind::kGpu ? "gpu" : "auto") +
                                         " starts 1 worker, as torchrun does; --virtual-local-rank gives each worker its own instance");
    c.virtual_local_rank = true;
    ASSERT_TRUE(ResolveNproc(&c, mig, 6).ok());
    EXPECT_EQ(c.nproc_per_node, 3);
    EXPECT_EQ(MigListNotice(c, mig), "");
  }
  c = LaunchConfig{};
  c.nproc.kind = NprocSpec::Kind::kCount;
  c.nproc.count = 2;
  ASSERT_TRUE(ResolveNproc(&c, mig, 6).ok());
  EXPECT_EQ(c.nproc_per_node, 2);
  EXPECT_NE(MigListNotice(c, mig).find("the 2 workers all see MIG-aaaa as device 0"), std::string::npos);
  c.nproc.count = 1;
  ASSERT_TRUE(ResolveNproc(&c, mig, 6).ok());
  EXPECT_EQ(MigListNotice(c, mig), "");
  mig.visible.resize(1);  // one instance: nothing to say
  mig.devices.resize(1);
  c.nproc.kind = NprocSpec::Kind::kGpu;
  ASSERT_TRUE(ResolveNproc(&c, mig, 6).ok());
  EXPECT_EQ(c.nproc_per_node, 1);
  EXPECT_EQ(MigListNotice(c, mig), "");
  EXPECT_EQ(MigListNotice(c, Gpus(4)), "");
}

// 2147483647 nodes x 2 workers: the world size overflowed int (world_size=-2 in a dry run).
TEST(ResolveNproc, ARankCountPastIntIsRefused) {
  LaunchConfig c;
  c.max_nodes = 2147483647;
  c.nproc.kind = NprocSpec::Kind::kCount;
  c.nproc.count = 2;
  const Status s = ResolveNproc(&c, Gpus(0), 6);
  EXPECT_EQ(s.message(), "--nnodes=2147483647 with --nproc_per_node=2 makes more ranks than 2147483647");
  c.max_nodes = 1073741823;
  EXPECT_TRUE(ResolveNproc(&c, Gpus(0), 6).ok());
}

// torchrun prints its agent's events to the console with --event-log-handler console; ctrun says
// once that it does not. null and dynamic_rendezvous print nothing in torchrun either.
TEST(EventLogHandlerNotice, OnlyConsoleIsSaid) {
  LaunchConfig c;
  EXPECT_EQ(EventLogHandlerNotice(c), "");
  c.event_log_handler = "dynamic_rendezvous";
  EXPECT_EQ(EventLogHandlerNotice(c), "");
  c.event_log_handler = "console";
  EXPECT_EQ(EventLogHandlerNotice(c),
            "--event-log-handler console: torchrun prints its agent's events there, ctrun does not; ctrun writes "
            "its own as JSON lines with --events-file PATH");
}

}  // namespace
}  // namespace ctrun
