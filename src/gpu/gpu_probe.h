// GpuProbe: how many GPUs this node's workers can use, found at run time without linking CUDA
// (the agent stays lean and runs on machines without CUDA).
// Order: CUDA_VISIBLE_DEVICES when set (it is what the workers will see), else NVML through
// dlopen("libnvidia-ml.so.1"), else /proc/driver/nvidia/gpus, else NVIDIA PCI display/3D
// controllers in sysfs.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace ctrun {

struct GpuCount {
  int count = 0;
  std::string source;  // "CUDA_VISIBLE_DEVICES", "nvml", "procfs", "sysfs", "none"
};

class GpuProbe {
 public:
  virtual ~GpuProbe() = default;
  virtual GpuCount Count() = 0;
};

class SystemGpuProbe final : public GpuProbe {
 public:
  // env: lookup for CUDA_VISIBLE_DEVICES; sys_root prefixes /proc and /sys (tests use a fixture).
  SystemGpuProbe(std::function<std::optional<std::string>(const std::string&)> env,
                 std::string sys_root = "", bool use_nvml = true)
      : env_(std::move(env)), root_(std::move(sys_root)), use_nvml_(use_nvml) {}
  GpuCount Count() override;

 private:
  std::function<std::optional<std::string>(const std::string&)> env_;
  std::string root_;
  bool use_nvml_;
};

// Counts the entries of a CUDA_VISIBLE_DEVICES value the way the CUDA runtime does: entries up
// to the first invalid one ("-1" or empty hides everything).
int CountVisibleDevices(const std::string& value);

}  // namespace ctrun
