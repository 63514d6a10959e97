#include <dirent.h>
#include <dlfcn.h>

#include <cctype>
#include <string>
#include <vector>

#include "gpu/gpu_probe.h"
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
  return out;
}

std::optional<int> NvmlCount() {
  void* h = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) return std::nullopt;
  using InitFn = int (*)();
  using CountFn = int (*)(unsigned*);
  auto init = reinterpret_cast<InitFn>(::dlsym(h, "nvmlInit_v2"));
  auto count = reinterpret_cast<CountFn>(::dlsym(h, "nvmlDeviceGetCount_v2"));
  auto shutdown = reinterpret_cast<InitFn>(::dlsym(h, "nvmlShutdown"));
  std::optional<int> result;
  if (init && count && init() == 0) {
    unsigned n = 0;
    if (count(&n) == 0) result = static_cast<int>(n);
    if (shutdown) shutdown();
  }
  ::dlclose(h);
  return result;
}

std::string Trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  return s;
}

}  // namespace

int CountVisibleDevices(const std::string& value) {
  int n = 0;
  size_t start = 0;
  while (start <= value.size()) {
    size_t end = value.find(',', start);
    if (end == std::string::npos) end = value.size();
    std::string item = value.substr(start, end - start);
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.front()))) item.erase(0, 1);
    item = Trim(item);
    if (item.empty() || item[0] == '-') break;  // the runtime stops at the first invalid entry
    ++n;
    start = end + 1;
  }
  return n;
}

GpuCount SystemGpuProbe::Count() {
  if (auto v = env_("CUDA_VISIBLE_DEVICES")) return {CountVisibleDevices(*v), "CUDA_VISIBLE_DEVICES"};
  if (use_nvml_ && root_.empty()) {
    if (auto n = NvmlCount()) return {*n, "nvml"};
  }
  auto gpus = ListDir(root_ + "/proc/driver/nvidia/gpus");
  if (!gpus.empty()) return {static_cast<int>(gpus.size()), "procfs"};
  int n = 0;
  const std::string pci = root_ + "/sys/bus/pci/devices";
  for (const auto& dev : ListDir(pci)) {
    std::string vendor, cls;
    if (!ReadFile(pci + "/" + dev + "/vendor", &vendor) || Trim(vendor) != "0x10de") continue;
    if (!ReadFile(pci + "/" + dev + "/class", &cls)) continue;
    cls = Trim(cls);
    // 0x0300xx VGA controller, 0x0302xx 3D controller (data-centre GPUs).
    if (cls.rfind("0x0300", 0) == 0 || cls.rfind("0x0302", 0) == 0) ++n;
  }
  if (n > 0) return {n, "sysfs"};
  return {0, "none"};
}

}  // namespace ctrun
