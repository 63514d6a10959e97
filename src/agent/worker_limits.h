// Worker limits: --nproc_per_node checked against what this machine lets ctrun start, before
// anything starts, so a typo like --nproc_per_node=100000 is one line with the numbers instead of
// forking until fork() fails.
//  - pid_max (/proc/sys/kernel/pid_max, less the kernel's 300 reserved pids): no more processes can
//    exist at once;
//  - RLIMIT_NPROC (ulimit -u) of the user, unless ctrun runs as root (the kernel does not enforce
//    it then);
//  - RLIMIT_NOFILE (ulimit -Hn): ctrun raises its soft limit to the hard one and holds up to
//    kFdsPerWorker descriptors per worker (pidfd, two output pipes, two tee'd log files, the exec
//    check pipe, the worker's store connection, its cgroup's cgroup.procs) plus kFdsBase of its own.
#pragma once

#include <cstdint>
#include <optional>

#include "base/status.h"

namespace ctrun {

inline constexpr uint64_t kFdsPerWorker = 8;
inline constexpr uint64_t kFdsBase = 64;

struct SystemLimits {
  std::optional<uint64_t> pid_max;     // nullopt: unknown
  std::optional<uint64_t> nproc;       // soft RLIMIT_NPROC; nullopt: unlimited or not enforced (root)
  std::optional<uint64_t> nofile;      // hard RLIMIT_NOFILE, at most 1<<20 (RaiseFdLimit's ceiling); nullopt: unknown
};

SystemLimits ReadSystemLimits();

// OK, or "--nproc_per_node=N is more workers than this machine allows: ..." with every limit that
// is exceeded and its number.
Status CheckWorkerLimits(int nproc, const SystemLimits& limits);

}  // namespace ctrun
