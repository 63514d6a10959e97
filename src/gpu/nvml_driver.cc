#include "gpu/nvml_driver.h"

#include <dlfcn.h>

#include <cctype>
#include <cstdio>

namespace ctrun {
namespace {

// NVML's C ABI (nvml.h): return codes are ints, handles opaque pointers.
using NvmlReturn = int;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr NvmlReturn kNvmlInsufficientSize = 7;
using NvmlDevice = struct NvmlDeviceOpaque*;
struct NvmlPciInfo {  // nvmlPciInfo_t (v3)
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
};
struct NvmlProcessInfo {  // nvmlProcessInfo_t as the _v2/_v3 process queries fill it
  unsigned pid;
  unsigned long long used_gpu_memory;
  unsigned gpu_instance_id, compute_instance_id;
};

struct NvmlApi {
  NvmlReturn (*init)();
  NvmlReturn (*shutdown)();
  NvmlReturn (*count)(unsigned*);
  NvmlReturn (*handle)(unsigned, NvmlDevice*);
  NvmlReturn (*uuid)(NvmlDevice, char*, unsigned);
  NvmlReturn (*pci)(NvmlDevice, NvmlPciInfo*);
  NvmlReturn (*compute_procs)(NvmlDevice, unsigned*, NvmlProcessInfo*);
  NvmlReturn (*graphics_procs)(NvmlDevice, unsigned*, NvmlProcessInfo*);
  NvmlReturn (*max_mig)(NvmlDevice, unsigned*);                  // optional
  NvmlReturn (*mig_handle)(NvmlDevice, unsigned, NvmlDevice*);   // optional
  const char* (*error_string)(NvmlReturn);                       // optional
};

template <typename Fn>
bool Resolve(void* lib, Fn* out, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (void* p = ::dlsym(lib, n)) {
      *out = reinterpret_cast<Fn>(p);
      return true;
    }
  *out = nullptr;
  return false;
}

class NvmlDriver final : public GpuDriver {
 public:
  NvmlDriver(void* lib, NvmlApi api) : lib_(lib), api_(api) {}
  ~NvmlDriver() override {
    api_.shutdown();
    ::dlclose(lib_);
  }

  std::vector<GpuDevice> Devices() override {
    std::vector<GpuDevice> out;
    unsigned n = 0;
    if (api_.count(&n) != kNvmlSuccess) return out;
    for (unsigned i = 0; i < n; ++i) {
      NvmlDevice h = nullptr;
      // NO_PERMISSION: a device cgroup keeps this process off the GPU (CUDA does not see it
      // either). Left out; the others keep their NVML index (the probe gives CUDA's ordinals).
      if (api_.handle(i, &h) != kNvmlSuccess) continue;
      GpuDevice d;
      d.index = static_cast<int>(i);
      d.uuid = Uuid(h);
      NvmlPciInfo pci{};
      if (api_.pci(h, &pci) == kNvmlSuccess) d.pci_bus_id = NormalizePciBusId(pci.bus_id);
      unsigned max_mig = 0;
      if (api_.max_mig && api_.mig_handle && api_.max_mig(h, &max_mig) == kNvmlSuccess)
        for (unsigned m = 0; m < max_mig; ++m) {
          NvmlDevice mh = nullptr;
          if (api_.mig_handle(h, m, &mh) == kNvmlSuccess) d.mig_uuids.push_back(Uuid(mh));
        }
      out.push_back(std::move(d));
    }
    return out;
  }

  StatusOr<std::vector<GpuProcess>> Processes(int index) override {
    NvmlDevice h = nullptr;
    if (NvmlReturn r = api_.handle(static_cast<unsigned>(index), &h); r != kNvmlSuccess)
      return Status::Error("NVML has no device " + std::to_string(index) + ": " + Reason(r));
    std::vector<GpuProcess> out;
    for (auto query : {api_.compute_procs, api_.graphics_procs}) {
      if (!query) continue;
      // Twice the room the count says: a driver that fills larger entries than it should (see
      // LoadNvml) must not write past the buffer.
      unsigned room = 16;
      std::vector<NvmlProcessInfo> infos(2 * room);
      unsigned count = room;
      NvmlReturn r = query(h, &count, infos.data());
      if (r == kNvmlInsufficientSize) {  // more than 16: ask again with room for them
        room = count + 8;
        infos.assign(2 * static_cast<size_t>(room), NvmlProcessInfo{});
        count = room;
        r = query(h, &count, infos.data());
      }
      if (r != kNvmlSuccess)
        return Status::Error("NVML cannot list the processes on GPU " + std::to_string(index) + ": " + Reason(r));
      for (unsigned i = 0; i < count && i < room; ++i)
        out.push_back({static_cast<pid_t>(infos[i].pid), infos[i].used_gpu_memory});
    }
    return out;
  }

 private:
  // NVML's words for a return code ("Insufficient Permissions"), with the code itself.
  std::string Reason(NvmlReturn r) const {
    const char* text = api_.error_string ? api_.error_string(r) : nullptr;
    return (text && *text ? std::string(text) + " " : std::string()) + "(NVML error " + std::to_string(r) + ")";
  }

  std::string Uuid(NvmlDevice h) {
    char buf[96] = {0};
    return api_.uuid(h, buf, sizeof buf) == kNvmlSuccess ? std::string(buf) : "";
  }

  void* lib_;
  NvmlApi api_;
};

}  // namespace

std::string NormalizePciBusId(const std::string& id) {
  // [domain:]bus:device.function, hex; NVML writes an 8-digit domain.
  unsigned domain = 0, bus = 0, dev = 0, fn = 0;
  char tail = 0;
  if (std::sscanf(id.c_str(), "%x:%x:%x.%x%c", &domain, &bus, &dev, &fn, &tail) != 4) {
    domain = 0;
    if (std::sscanf(id.c_str(), "%x:%x.%x%c", &bus, &dev, &fn, &tail) != 3) return "";
  }
  if (domain > 0xffff || bus > 0xff || dev > 0x1f || fn > 7) return "";
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04x:%02x:%02x.%x", domain, bus, dev, fn);
  return buf;
}

std::unique_ptr<GpuDriver> LoadNvml() {
  void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return nullptr;
  NvmlApi api{};
  const bool ok = Resolve(lib, &api.init, {"nvmlInit_v2", "nvmlInit"}) &&
                  Resolve(lib, &api.shutdown, {"nvmlShutdown"}) &&
                  Resolve(lib, &api.count, {"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"}) &&
                  Resolve(lib, &api.handle, {"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"}) &&
                  Resolve(lib, &api.uuid, {"nvmlDeviceGetUUID"}) &&
                  Resolve(lib, &api.pci, {"nvmlDeviceGetPciInfo_v3"}) &&
                  // _v2 first: drivers 535.43-535.86 fill _v3 with 32-byte entries (the later
                  // nvmlProcessInfo_v3_t) where the header says 24, so every entry after the
                  // first would be read at the wrong place; _v2's 24-byte entries are the same
                  // in every driver that has it.
                  Resolve(lib, &api.compute_procs,
                          {"nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetComputeRunningProcesses_v3"});
  Resolve(lib, &api.graphics_procs,
          {"nvmlDeviceGetGraphicsRunningProcesses_v2", "nvmlDeviceGetGraphicsRunningProcesses_v3"});
  Resolve(lib, &api.max_mig, {"nvmlDeviceGetMaxMigDeviceCount"});
  Resolve(lib, &api.mig_handle, {"nvmlDeviceGetMigDeviceHandleByIndex"});
  Resolve(lib, &api.error_string, {"nvmlErrorString"});
  if (!ok || api.init() != kNvmlSuccess) {
    ::dlclose(lib);
    return nullptr;
  }
  return std::make_unique<NvmlDriver>(lib, api);
}

}  // namespace ctrun
