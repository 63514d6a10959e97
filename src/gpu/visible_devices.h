// CUDA_VISIBLE_DEVICES, read the way the CUDA runtime reads it (the rules PyTorch mirrors in
// torch.cuda._parse_visible_devices / _device_count_nvml, which ctrun follows):
//  - The list is ordinals or UUIDs, decided by the first entry: "GPU-" or "MIG-" makes it a UUID
//    list; anything else an ordinal list.
//  - Ordinals are read like strtoul after trimming blanks: "1gpu2" is 1. A negative or
//    non-numeric entry ends the list ("0,-1,2" is one device; "-1" and "" are none).
//  - UUID entries may be any unique prefix of a device's UUID ("GPU-8a1b"); the list ends at the
//    first entry that does not start with the list's prefix or names no device.
//  - Ordinals count only the GPUs this process can open (GpuDevice::ordinal, not the NVML index).
//    An ordinal past the last device ends the list there ("0,1,9" on 4 GPUs is two devices).
//  - The same device named twice hides every device (the runtime reports none), and so does an
//    ambiguous UUID prefix.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "gpu/gpu_device.h"

namespace ctrun {

struct VisibleDevicesSpec {
  enum class Kind { kOrdinals, kUuids };
  Kind kind = Kind::kOrdinals;
  std::vector<std::string> entries;  // the accepted entries as written (trimmed), in order
  std::vector<int> ordinals;         // kOrdinals: entries read as numbers
  bool hides_all = false;            // a repeated entry: the runtime sees no device
};

VisibleDevicesSpec ParseVisibleDevices(std::string_view value);

// Where each visible device is among `devices` (indices into that vector), in visible order,
// after the truncation rules above. MIG entries resolve to the GPU that holds the instance.
std::vector<int> ResolveVisibleDevices(const VisibleDevicesSpec& spec, const std::vector<GpuDevice>& devices);

// Splits "a,b,c" at commas, each entry without the spaces around it (" 1" is device 1, as torchrun
// reads the list); "" gives one empty entry.
std::vector<std::string> SplitCommas(std::string_view value);

}  // namespace ctrun
