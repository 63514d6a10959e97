// FakeGpuDriver: a GpuDriver with devices and per-device process lists the test sets; lets the
// GPU logic (inventory, --gpus, the wait for GPU release) run without GPUs or NVML.
#pragma once

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "gpu/gpu_device.h"

namespace ctrun::testing {

class FakeGpuDriver final : public GpuDriver {
 public:
  // n devices "GPU-000<i>-..." at bus 0000:<i+1>0:00.0.
  static FakeGpuDriver WithDevices(int n) {
    FakeGpuDriver d;
    for (int i = 0; i < n; ++i) {
      GpuDevice g;
      g.index = i;
      g.ordinal = i;
      g.uuid = "GPU-000" + std::to_string(i) + "aaaa-bbbb-cccc-dddd-eeeeeeeeeeee";
      char bus[32];
      std::snprintf(bus, sizeof bus, "0000:%02x:00.0", (i + 1) * 16);
      g.pci_bus_id = bus;
      d.devices.push_back(g);
    }
    return d;
  }
  // As NVML's driver lists them: without the devices whose handle lookup fails.
  std::vector<GpuDevice> Devices() override {
    std::vector<GpuDevice> out;
    for (const GpuDevice& d : devices)
      if (!no_handle.count(d.index)) out.push_back(d);
    return out;
  }
  StatusOr<std::vector<GpuProcess>> Processes(int index) override {
    ++queries;
    if (no_handle.count(index)) return Status::Error("NVML has no device " + std::to_string(index));
    if (failing.count(index)) return Status::Error("fake NVML error");
    return processes[index];
  }

  std::vector<GpuDevice> devices;
  std::map<int, std::vector<GpuProcess>> processes;  // by NVML index
  std::map<int, bool> failing;
  // NVML indices whose handle lookup fails (NO_PERMISSION: a device cgroup blocks the GPU).
  std::map<int, bool> no_handle;
  int queries = 0;
};

}  // namespace ctrun::testing
