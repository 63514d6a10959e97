// GpuProbe: the GPUs this node's workers can use, found at run time without linking CUDA (the
// agent stays lean and runs on machines without CUDA).
// Physical devices: NVML (a GpuDriver, loaded with dlopen), else /proc/driver/nvidia/gpus (bus
// ids and UUIDs), else NVIDIA PCI display/3D controllers in sysfs bound to the `nvidia` driver
// (bus ids), in PCI bus order.
// CUDA_VISIBLE_DEVICES, when set, narrows and orders them as the CUDA runtime does
// (gpu/visible_devices.h); when no physical device can be found its entries are taken as written
// (a machine whose driver ctrun cannot see, or a simulated device list in tests).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "gpu/gpu_device.h"

namespace ctrun {

// The GPUs workers will see, in the order they see them (CUDA device 0 first).
struct GpuInventory {
  std::string source = "none";       // "nvml", "procfs", "sysfs", "CUDA_VISIBLE_DEVICES", "none"
  std::vector<std::string> visible;  // each GPU's CUDA_VISIBLE_DEVICES entry as written, or its ordinal
  std::vector<GpuDevice> devices;    // parallel to visible; index -1 / empty ids when unknown
  bool as_written = false;           // no physical GPU found: CUDA_VISIBLE_DEVICES taken as written
  int count() const { return static_cast<int>(visible.size()); }
  // "0,2,3": the CUDA_VISIBLE_DEVICES value that shows exactly these GPUs.
  std::string VisibleValue() const;
};

// Kept for callers that only count.
struct GpuCount {
  int count = 0;
  std::string source;
};

class GpuProbe {
 public:
  virtual ~GpuProbe() = default;
  virtual GpuInventory Probe() = 0;
  GpuCount Count() {
    GpuInventory inv = Probe();
    return {inv.count(), inv.source};
  }
};

class SystemGpuProbe final : public GpuProbe {
 public:
  // env: lookup for CUDA_VISIBLE_DEVICES; sys_root prefixes /proc and /sys (tests use a fixture);
  // driver: NVML when loaded (not owned, may be null).
  SystemGpuProbe(std::function<std::optional<std::string>(const std::string&)> env, std::string sys_root = "",
                 GpuDriver* driver = nullptr)
      : env_(std::move(env)), root_(std::move(sys_root)), driver_(driver) {}
  GpuInventory Probe() override;

 private:
  std::vector<GpuDevice> PhysicalDevices(std::string* source);
  std::function<std::optional<std::string>(const std::string&)> env_;
  std::string root_;
  GpuDriver* driver_;
};

// --gpus: keeps the GPUs at these positions of `inv` (in the given order). An error names the
// first position past the end.
StatusOr<GpuInventory> SelectGpus(const GpuInventory& inv, const std::vector<int>& positions);

// Counts the devices a CUDA_VISIBLE_DEVICES value shows when nothing is known about the machine.
int CountVisibleDevices(const std::string& value);

}  // namespace ctrun
