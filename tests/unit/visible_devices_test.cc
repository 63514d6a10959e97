// CUDA_VISIBLE_DEVICES as the CUDA runtime reads it, the GPU inventory (NVML fake, procfs
// fixture) and --gpus selection.
#include "gpu/visible_devices.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "fakes/fake_gpu_driver.h"
#include "gpu/gpu_probe.h"

namespace ctrun {
namespace {

using testing::FakeGpuDriver;
namespace fs = std::filesystem;

std::vector<int> Resolve(const std::string& value, const std::vector<GpuDevice>& devs) {
  return ResolveVisibleDevices(ParseVisibleDevices(value), devs);
}

auto EnvWith(std::optional<std::string> cvd) {
  return [cvd](const std::string& k) -> std::optional<std::string> {
    if (k == "CUDA_VISIBLE_DEVICES") return cvd;
    return std::nullopt;
  };
}

TEST(VisibleDevices, OrdinalsReadLikeStrtoul) {
  auto s = ParseVisibleDevices(" 1 ,2gpu,3");
  EXPECT_EQ(s.kind, VisibleDevicesSpec::Kind::kOrdinals);
  EXPECT_EQ(s.ordinals, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(s.entries, (std::vector<std::string>{"1", "2gpu", "3"}));
  EXPECT_EQ(ParseVisibleDevices("+2").ordinals, std::vector<int>{2});
}

TEST(VisibleDevices, NegativeOrNonNumericEndsTheList) {
  EXPECT_EQ(ParseVisibleDevices("0,-1,2").ordinals, std::vector<int>{0});
  EXPECT_TRUE(ParseVisibleDevices("-1").ordinals.empty());
  EXPECT_TRUE(ParseVisibleDevices("").ordinals.empty());
  EXPECT_EQ(ParseVisibleDevices("0,x,2").ordinals, std::vector<int>{0});
  EXPECT_EQ(ParseVisibleDevices("0,,2").ordinals, std::vector<int>{0});
}

TEST(VisibleDevices, ARepeatedEntryHidesEverything) {
  auto s = ParseVisibleDevices("0,1,0");
  EXPECT_TRUE(s.hides_all);
  EXPECT_TRUE(s.entries.empty());
  EXPECT_TRUE(ParseVisibleDevices("GPU-aa,GPU-aa").entries.empty());
}

TEST(VisibleDevices, OrdinalPastTheLastDeviceTruncates) {
  auto devs = FakeGpuDriver::WithDevices(4).devices;
  EXPECT_EQ(Resolve("3,1", devs), (std::vector<int>{3, 1}));
  EXPECT_EQ(Resolve("0,1,9,2", devs), (std::vector<int>{0, 1}));
  EXPECT_TRUE(Resolve("7", devs).empty());
}

TEST(VisibleDevices, UuidsFullAndPartial) {
  auto devs = FakeGpuDriver::WithDevices(4).devices;
  auto s = ParseVisibleDevices("GPU-0002aaaa-bbbb-cccc-dddd-eeeeeeeeeeee,GPU-0000");
  EXPECT_EQ(s.kind, VisibleDevicesSpec::Kind::kUuids);
  EXPECT_EQ(ResolveVisibleDevices(s, devs), (std::vector<int>{2, 0}));
  // An unknown UUID truncates; an entry without the list's prefix ends it.
  EXPECT_EQ(Resolve("GPU-0001,GPU-ffff,GPU-0002", devs), std::vector<int>{1});
  EXPECT_EQ(Resolve("GPU-0001,2", devs), std::vector<int>{1});
  // An ambiguous prefix: every GPU's UUID starts with GPU-000.
  EXPECT_TRUE(Resolve("GPU-000", devs).empty());
  // Two prefixes of one device: the same device twice.
  EXPECT_TRUE(Resolve("GPU-0001,GPU-0001aaaa", devs).empty());
}

TEST(VisibleDevices, MigInstancesResolveToTheirGpu) {
  auto devs = FakeGpuDriver::WithDevices(2).devices;
  devs[1].mig_uuids = {"MIG-1111", "MIG-2222"};
  EXPECT_EQ(Resolve("MIG-2222,MIG-1111", devs), (std::vector<int>{1, 1}));
  EXPECT_EQ(Resolve("MIG-1111,MIG-9999", devs), std::vector<int>{1});
}

TEST(GpuInventory, NvmlDevicesInIndexOrder) {
  auto nvml = FakeGpuDriver::WithDevices(3);
  SystemGpuProbe p(EnvWith(std::nullopt), "/nonexistent", &nvml);
  GpuInventory inv = p.Probe();
  EXPECT_EQ(inv.source, "nvml");
  EXPECT_EQ(inv.visible, (std::vector<std::string>{"0", "1", "2"}));
  EXPECT_EQ(inv.devices[2].pci_bus_id, "0000:30:00.0");
}

TEST(GpuInventory, CudaVisibleDevicesNarrowsAndKeepsItsSpelling) {
  auto nvml = FakeGpuDriver::WithDevices(4);
  SystemGpuProbe p(EnvWith("GPU-0003,GPU-0001,GPU-9"), "/nonexistent", &nvml);
  GpuInventory inv = p.Probe();
  EXPECT_EQ(inv.source, "CUDA_VISIBLE_DEVICES");
  EXPECT_EQ(inv.visible, (std::vector<std::string>{"GPU-0003", "GPU-0001"}));
  EXPECT_EQ(inv.devices[0].index, 3);
  EXPECT_EQ(inv.devices[1].pci_bus_id, "0000:20:00.0");
  EXPECT_EQ(inv.VisibleValue(), "GPU-0003,GPU-0001");
}

// GPUs 2 and 3 of 8 allowed by the device cgroup (Slurm ConstrainDevices, docker --gpus): NVML
// counts all 8 but cannot open the others, and CUDA numbers the two it can open 0 and 1.
FakeGpuDriver TwoOfEightAllowed() {
  auto nvml = FakeGpuDriver::WithDevices(8);
  for (int i : {0, 1, 4, 5, 6, 7}) nvml.no_handle[i] = true;
  return nvml;
}

TEST(GpuInventory, OrdinalsCountOnlyTheGpusThisProcessCanOpen) {
  auto nvml = TwoOfEightAllowed();
  SystemGpuProbe unset(EnvWith(std::nullopt), "/nonexistent", &nvml);
  GpuInventory inv = unset.Probe();
  EXPECT_EQ(inv.visible, (std::vector<std::string>{"0", "1"}));
  ASSERT_EQ(inv.count(), 2);
  EXPECT_EQ(inv.devices[0].index, 2);  // NVML calls (process lists) still use the NVML index
  EXPECT_EQ(inv.devices[0].ordinal, 0);
  EXPECT_EQ(inv.devices[1].index, 3);
  EXPECT_EQ(inv.devices[1].ordinal, 1);
  // --gpus 1: the workers' CUDA_VISIBLE_DEVICES names the second GPU CUDA sees, not NVML's 3.
  auto sel = SelectGpus(inv, {1});
  ASSERT_TRUE(sel.ok());
  EXPECT_EQ(sel.value().VisibleValue(), "1");
  EXPECT_EQ(sel.value().devices[0].index, 3);

  SystemGpuProbe both(EnvWith("1,0"), "/nonexistent", &nvml);
  inv = both.Probe();
  ASSERT_EQ(inv.count(), 2);
  EXPECT_EQ(inv.devices[0].index, 3);
  EXPECT_EQ(inv.devices[1].index, 2);
  // An NVML index CUDA does not have: past the last ordinal, so no GPU.
  SystemGpuProbe past(EnvWith("2"), "/nonexistent", &nvml);
  EXPECT_EQ(past.Probe().count(), 0);
  // UUIDs name the same GPUs whatever the numbering.
  SystemGpuProbe by_uuid(EnvWith("GPU-0003"), "/nonexistent", &nvml);
  inv = by_uuid.Probe();
  ASSERT_EQ(inv.count(), 1);
  EXPECT_EQ(inv.devices[0].index, 3);
}

TEST(GpuInventory, WithoutADriverEntriesAreTakenAsWritten) {
  SystemGpuProbe p(EnvWith("GPU-ab,GPU-cd,GPU-ef"), "/nonexistent");
  EXPECT_EQ(p.Probe().count(), 3);
  SystemGpuProbe none(EnvWith(std::nullopt), "/nonexistent");
  EXPECT_EQ(none.Probe().count(), 0);
  EXPECT_EQ(none.Probe().source, "none");
}

TEST(GpuInventory, ProcfsGivesBusIdsAndUuids) {
  const fs::path root = fs::temp_directory_path() / ("ctrun_gpu_inv_" + std::to_string(::getpid()));
  fs::remove_all(root);
  for (const char* bus : {"0000:86:00.0", "0000:3b:00.0"}) {
    fs::create_directories(root / "proc/driver/nvidia/gpus" / bus);
    std::ofstream(root / "proc/driver/nvidia/gpus" / bus / "information")
        << "Model: \t\t NVIDIA H100\nGPU UUID: \t GPU-" << bus[5] << bus[6] << "-uuid\nBus Location: \t " << bus << "\n";
  }
  SystemGpuProbe p(EnvWith("GPU-86"), root.string());
  GpuInventory inv = p.Probe();
  ASSERT_EQ(inv.count(), 1);
  EXPECT_EQ(inv.devices[0].pci_bus_id, "0000:86:00.0");
  EXPECT_EQ(inv.devices[0].index, 1);  // bus order: 3b first
  fs::remove_all(root);
}

TEST(GpuSelection, KeepsThePositionsGivenInOrder) {
  auto nvml = FakeGpuDriver::WithDevices(4);
  SystemGpuProbe p(EnvWith(std::nullopt), "/nonexistent", &nvml);
  auto sel = SelectGpus(p.Probe(), {3, 0, 2});
  ASSERT_TRUE(sel.ok());
  EXPECT_EQ(sel.value().VisibleValue(), "3,0,2");
  EXPECT_EQ(sel.value().devices[0].pci_bus_id, "0000:40:00.0");
}

TEST(GpuSelection, PositionsAreAmongTheVisibleGpus) {
  auto nvml = FakeGpuDriver::WithDevices(4);
  SystemGpuProbe p(EnvWith("2,3"), "/nonexistent", &nvml);
  auto sel = SelectGpus(p.Probe(), {1});
  ASSERT_TRUE(sel.ok());
  EXPECT_EQ(sel.value().VisibleValue(), "3");
  auto bad = SelectGpus(p.Probe(), {0, 2});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.message(), "GPU 2 does not exist: 2 visible (0-1, from CUDA_VISIBLE_DEVICES)");
}

TEST(PciBusId, Normalized) {
  EXPECT_EQ(NormalizePciBusId("00000000:3B:00.0"), "0000:3b:00.0");
  EXPECT_EQ(NormalizePciBusId("0000:86:00.1"), "0000:86:00.1");
  EXPECT_EQ(NormalizePciBusId("3b:00.0"), "0000:3b:00.0");
  EXPECT_EQ(NormalizePciBusId("nonsense"), "");
}

}  // namespace
}  // namespace ctrun
