// NvmlDriver: GpuDriver over NVML (libnvidia-ml.so.1), loaded with dlopen, so ctrun runs (and
// links) without the NVIDIA driver. The few NVML types it needs are declared in nvml_driver.cc
// from NVML's stable C ABI (no header needed at build time).
//
// Contract: LoadNvml() returns nullptr when the library is missing or nvmlInit fails (no driver,
// no GPU); the driver is shut down and the library unloaded when the object goes.
#pragma once

#include <memory>

#include "gpu/gpu_device.h"

namespace ctrun {

std::unique_ptr<GpuDriver> LoadNvml();

}  // namespace ctrun
