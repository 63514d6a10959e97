#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <sstream>
#include <string>
#include <vector>

#include "gpu/gpu_probe.h"
#include "gpu/visible_devices.h"
#include "sys/posix_util.h"

namespace ctrun {
namespace {

std::vector<std::string> ListDir(const std::string& path) {
  std::vector<std::string> out;
  DIR* d = ::opendir(path.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::string Trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.erase(0, 1);
  return s;
}

// "GPU UUID:  GPU-8a1b..." from /proc/driver/nvidia/gpus/<bus>/information.
std::string UuidFromInformation(const std::string& text) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("GPU UUID:", 0) == 0) return Trim(line.substr(9));
  return "";
}

// The name of the kernel driver bound to a PCI device (the last part of its `driver` link,
// "../../../bus/pci/drivers/nvidia"); "" when none is bound.
std::string BoundDriver(const std::string& device_dir) {
  char target[4096];
  const ssize_t n = ::readlink((device_dir + "/driver").c_str(), target, sizeof target - 1);
  if (n <= 0) return "";
  const std::string link(target, static_cast<size_t>(n));
  const size_t slash = link.find_last_of('/');
  return slash == std::string::npos ? link : link.substr(slash + 1);
}

// CUDA numbers the GPUs it can open from 0, in the order found (the driver's list leaves out those
// it cannot open): that position is each one's ordinal, whatever its NVML index.
std::vector<GpuDevice> Numbered(std::vector<GpuDevice> devices) {
  for (size_t i = 0; i < devices.size(); ++i) devices[i].ordinal = static_cast<int>(i);
  return devices;
}

}  // namespace

std::string GpuInventory::VisibleValue() const {
  std::string out;
  for (const auto& v : visible) out += (out.empty() ? "" : ",") + v;
  return out;
}

int CountVisibleDevices(const std::string& value) {
  return static_cast<int>(ParseVisibleDevices(value).entries.size());
}

std::vector<GpuDevice> SystemGpuProbe::PhysicalDevices(std::string* source) {
  if (driver_) {
    auto devs = driver_->Devices();
    if (!devs.empty()) {
      *source = "nvml";
      return Numbered(std::move(devs));
    }
  }
  std::vector<GpuDevice> out;
  const std::string procfs = root_ + "/proc/driver/nvidia/gpus";
  for (const auto& bus : ListDir(procfs)) {
    GpuDevice d;
    d.index = static_cast<int>(out.size());
    d.pci_bus_id = NormalizePciBusId(bus);
    std::string info;
    if (ReadFile(procfs + "/" + bus + "/information", &info)) d.uuid = UuidFromInformation(info);
    out.push_back(std::move(d));
  }
  if (!out.empty()) {
    *source = "procfs";
    return Numbered(std::move(out));
  }
  const std::string pci = root_ + "/sys/bus/pci/devices";
  for (const auto& dev : ListDir(pci)) {
    std::string vendor, cls;
    if (!ReadFile(pci + "/" + dev + "/vendor", &vendor) || Trim(vendor) != "0x10de") continue;
    if (!ReadFile(pci + "/" + dev + "/class", &cls)) continue;
    cls = Trim(cls);
    // 0x0300xx VGA controller, 0x0302xx 3D controller (data-centre GPUs).
    if (cls.rfind("0x0300", 0) != 0 && cls.rfind("0x0302", 0) != 0) continue;
    // Only a GPU the NVIDIA driver drives can run CUDA: one passed through to a VM (vfio-pci),
    // driven by nouveau, or bound to no driver is no GPU for the workers.
    if (BoundDriver(pci + "/" + dev) != "nvidia") continue;
    GpuDevice d;
    d.index = static_cast<int>(out.size());
    d.pci_bus_id = NormalizePciBusId(dev);
    out.push_back(std::move(d));
  }
  if (!out.empty()) *source = "sysfs";
  return Numbered(std::move(out));
}

GpuInventory SystemGpuProbe::Probe() {
  GpuInventory inv;
  std::string source = "none";
  std::vector<GpuDevice> physical = PhysicalDevices(&source);
  const std::optional<std::string> env = env_("CUDA_VISIBLE_DEVICES");
  if (!env) {
    inv.source = source;
    for (const auto& d : physical) inv.visible.push_back(std::to_string(d.ordinal));
    inv.devices = std::move(physical);
    return inv;
  }
  const VisibleDevicesSpec spec = ParseVisibleDevices(*env);
  inv.source = "CUDA_VISIBLE_DEVICES";
  if (physical.empty()) {  // nothing to check the entries against: take them as written
    inv.as_written = !spec.entries.empty();
    for (size_t i = 0; i < spec.entries.size(); ++i) {
      GpuDevice d;
      d.index = i < spec.ordinals.size() ? spec.ordinals[i] : -1;
      d.ordinal = d.index;
      if (spec.kind == VisibleDevicesSpec::Kind::kUuids) d.uuid = spec.entries[i];
      inv.visible.push_back(spec.entries[i]);
      inv.devices.push_back(std::move(d));
    }
    return inv;
  }
  const std::vector<int> resolved = ResolveVisibleDevices(spec, physical);
  for (size_t i = 0; i < resolved.size(); ++i) {
    inv.visible.push_back(spec.entries[i]);
    inv.devices.push_back(physical[static_cast<size_t>(resolved[i])]);
  }
  return inv;
}

StatusOr<GpuInventory> SelectGpus(const GpuInventory& inv, const std::vector<int>& positions) {
  GpuInventory out;
  out.source = inv.source;
  out.as_written = inv.as_written;
  for (int p : positions) {
    if (p < 0 || p >= inv.count())
      return Status::Error("GPU " + std::to_string(p) + " does not exist: " +
                           (inv.count() == 0 ? std::string("no GPU is visible")
                                             : std::to_string(inv.count()) + " visible (0-" +
                                                   std::to_string(inv.count() - 1) + ", from " + inv.source + ")"));
    out.visible.push_back(inv.visible[static_cast<size_t>(p)]);
    out.devices.push_back(inv.devices[static_cast<size_t>(p)]);
  }
  return out;
}

}  // namespace ctrun
