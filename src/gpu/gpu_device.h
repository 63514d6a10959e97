// GpuDriver: what ctrun asks of the GPU driver (NVML), behind an interface so the GPU logic
// (CUDA_VISIBLE_DEVICES resolution, --gpus, the wait for GPU release before a restart) is tested
// with tests/fakes/fake_gpu_driver.h on machines without GPUs. nvml_driver.cc is the real one,
// loaded with dlopen: ctrun never links NVML or CUDA.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "base/status.h"

namespace ctrun {

// One physical GPU, in NVML index order (PCI bus order; the same as CUDA's order under
// CUDA_DEVICE_ORDER=PCI_BUS_ID, and on machines with one GPU model).
//
// Two numbers: NVML numbers every GPU of the machine, while CUDA numbers only the GPUs this
// process can open (a device cgroup, as Slurm's ConstrainDevices or `docker --gpus` set up, hides
// the others from CUDA but not from NVML's count). With GPUs 2 and 3 of 8 allowed, their NVML
// indices are 2 and 3 and their CUDA ordinals 0 and 1. NVML calls take `index`; ordinals in
// CUDA_VISIBLE_DEVICES (read or written) are `ordinal`s.
struct GpuDevice {
  int index = 0;                      // NVML index
  std::string uuid;                   // "GPU-8a1b...", "" when unknown
  std::string pci_bus_id;             // "0000:3b:00.0" (lower case, 4-digit domain), "" when unknown
  std::vector<std::string> mig_uuids;  // "MIG-..." of its MIG instances, when MIG is on
  // CUDA's number for it with CUDA_VISIBLE_DEVICES unset: its position among the GPUs this
  // process can open, in the order above (SystemGpuProbe sets it); -1 when unknown.
  int ordinal = -1;
};

// A process holding a context on a GPU (compute or graphics).
struct GpuProcess {
  pid_t pid = 0;
  unsigned long long used_bytes = 0;  // 0 when NVML cannot tell
};

class GpuDriver {
 public:
  virtual ~GpuDriver() = default;
  // The GPUs this process can open, in NVML index order; a GPU NVML counts but cannot open
  // (NO_PERMISSION from a device cgroup) is left out, and the others keep their NVML index.
  virtual std::vector<GpuDevice> Devices() = 0;
  // The processes with a context on device `index` (an NVML index) right now.
  virtual StatusOr<std::vector<GpuProcess>> Processes(int index) = 0;
};

// "00000000:3B:00.0" (NVML) or "0000:3b:00.0" (sysfs) -> "0000:3b:00.0"; "" when not a bus id.
std::string NormalizePciBusId(const std::string& id);

}  // namespace ctrun
