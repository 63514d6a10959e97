#include "agent/worker_limits.h"

#include <sys/resource.h>
#include <algorithm>
#include <unistd.h>

#include <string>

#include "sys/posix_util.h"

namespace ctrun {
namespace {

constexpr uint64_t kReservedPids = 300;  // the kernel's RESERVED_PIDS
constexpr uint64_t kFdCap = 1u << 20;    // RaiseFdLimit's ceiling

}  // namespace

SystemLimits ReadSystemLimits() {
  SystemLimits l;
  std::string text;
  if (ReadFile("/proc/sys/kernel/pid_max", &text)) {
    try {
      l.pid_max = std::stoull(text);
    } catch (...) {
    }
  }
  struct rlimit r;
  if (::geteuid() != 0 && ::getrlimit(RLIMIT_NPROC, &r) == 0 && r.rlim_cur != RLIM_INFINITY) l.nproc = r.rlim_cur;
  if (::getrlimit(RLIMIT_NOFILE, &r) == 0)
    l.nofile = r.rlim_max == RLIM_INFINITY ? kFdCap : std::min<uint64_t>(r.rlim_max, kFdCap);
  return l;
}

Status CheckWorkerLimits(int nproc, const SystemLimits& l) {
  const uint64_t n = nproc > 0 ? static_cast<uint64_t>(nproc) : 0;
  std::string why;
  auto add = [&why](const std::string& s) { why += (why.empty() ? "" : "; ") + s; };
  if (l.pid_max && n + 1 > (*l.pid_max > kReservedPids ? *l.pid_max - kReservedPids : 0))
    add("pid_max is " + std::to_string(*l.pid_max) + " (/proc/sys/kernel/pid_max)");
  if (l.nproc && n + 1 > *l.nproc)
    add("RLIMIT_NPROC is " + std::to_string(*l.nproc) + " processes for this user (ulimit -u)");
  if (l.nofile && n * kFdsPerWorker + kFdsBase > *l.nofile)
    add("RLIMIT_NOFILE is " + std::to_string(*l.nofile) + " (ulimit -Hn) and ctrun needs up to " +
        std::to_string(kFdsPerWorker) + " per worker + " + std::to_string(kFdsBase) + ", so at most " +
        std::to_string(*l.nofile > kFdsBase ? (*l.nofile - kFdsBase) / kFdsPerWorker : 0) + " workers");
  if (why.empty()) return Status::Ok();
  return Status::Error("--nproc_per_node=" + std::to_string(nproc) +
                       " is more workers than this machine allows: " + why);
}

}  // namespace ctrun
