#include "agent/launch_checks.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "agent/worker_env.h"
#include "gpu/visible_devices.h"

namespace ctrun {
namespace {

bool IsExecutableFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// Resolves argv0 the way execvp would, through `path` (the value of PATH; nullptr: unset, then
// the usual system directories); returns argv0 unchanged when it contains '/', or when nothing
// executable is found.
std::string ResolveExecutable(const std::string& argv0, const std::string* path) {
  if (argv0.empty() || argv0.find('/') != std::string::npos) return argv0;
  const std::string dirs = path ? *path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    if (dir.empty()) dir = ".";
    std::string cand = dir + "/" + argv0;
    if (IsExecutableFile(cand)) return cand;
    start = end + 1;
  }
  return argv0;
}

}  // namespace

Status CheckSupported(const LaunchConfig& c) {
  if (c.run_path)
    return Status::Error(
        "--run_path is not supported: it runs the script inside torchrun's Python agent process; "
        "ctrun starts every worker as its own process (drop --run_path)");
  // torchrun's comma_separated_list gives the flag with an empty value no filter at all.
  if (!c.duplicate_stdout_filters.empty())
    return Status::Error(
        "--duplicate-stdout-filters (PET_DUPLICATE_STDOUT_FILTERS) is not supported yet: ctrun would not "
        "copy the matching lines anywhere (drop the flag)");
  if (!c.duplicate_stderr_filters.empty())
    return Status::Error(
        "--duplicate-stderr-filters (PET_DUPLICATE_STDERR_FILTERS) is not supported yet: ctrun would not "
        "copy the matching lines anywhere (drop the flag)");
  return Status::Ok();
}

Status ResolveNproc(LaunchConfig* c, const GpuInventory& g, int cpus) {
  switch (c->nproc.kind) {
    case NprocSpec::Kind::kCount:
      c->nproc_per_node = c->nproc.count;
      break;
    case NprocSpec::Kind::kCpu:
      c->nproc_per_node = cpus;
      break;
    case NprocSpec::Kind::kGpu:
      if (g.count() <= 0)
        return Status::Error("--nproc_per_node=gpu: no GPU is visible on this machine (checked " +
                             std::string(g.source == "CUDA_VISIBLE_DEVICES" ? "CUDA_VISIBLE_DEVICES"
                                                                            : "NVML, /proc/driver/nvidia and sysfs") +
                             ")");
      c->nproc_per_node = g.count();
      break;
    case NprocSpec::Kind::kAuto:
      c->nproc_per_node = g.count() > 0 ? g.count() : cpus;
      break;
  }
  if (c->nproc_per_node < 1) return Status::Error("--nproc_per_node resolved to 0 workers");
  return Status::Ok();
}

std::string FindOnPath(const std::string& name, const Environment& env) {
  std::string p = ResolveExecutable(name, env.Get("PATH"));
  return p.find('/') == std::string::npos ? "" : p;
}

Status CheckGpuFlags(const LaunchConfig& c, const Environment& worker_env) {
  if (c.virtual_local_rank)
    if (const std::string* v = worker_env.Get("CUDA_VISIBLE_DEVICES")) {
      // torchrun: the local_rank-th entry of the list, a ValueError past its end.
      const size_t entries = SplitCommas(*v).size();
      if (static_cast<size_t>(c.nproc_per_node) > entries)
        return Status::Error("--virtual-local-rank: local rank " + std::to_string(entries) +
                             " has no GPU: CUDA_VISIBLE_DEVICES=" + *v + " lists " + std::to_string(entries) +
                             " for " + std::to_string(c.nproc_per_node) + " workers");
    }
  if (c.debug_rank && *c.debug_rank >= c.max_nodes * c.nproc_per_node && c.min_nodes == c.max_nodes)
    return Status::Error("invalid value '" + std::to_string(*c.debug_rank) + "' for --debug-rank: the job has " +
                         std::to_string(c.max_nodes * c.nproc_per_node) + " ranks (0-" +
                         std::to_string(c.max_nodes * c.nproc_per_node - 1) + ")");
  return Status::Ok();
}

std::string FindPython(const Environment& env) {
  const std::string* path = env.Get("PATH");
  if (const std::string* v = env.Get("PYTHON_EXEC"); v && !v->empty()) return ResolveExecutable(*v, path);
  std::string p = ResolveExecutable("python3", path);
  return p.find('/') == std::string::npos ? "" : p;
}

namespace {

Status CheckExecutable(const std::string& shown, const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    return Status::Error("cannot execute " + shown + ": " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) return Status::Error("cannot execute " + shown + ": is a directory");
  if (::access(path.c_str(), X_OK) != 0)
    return Status::Error("cannot execute " + shown + ": " + std::strerror(errno) + " (is it executable? chmod +x)");
  return Status::Ok();
}

}  // namespace

StatusOr<std::string> ResolveEntrypoint(const LaunchConfig& c, const std::string& python_exec,
                                        const Environment& env) {
  if (c.entrypoint.empty()) return Status::Error("missing the training script or program to run");
  if (UsesPython(c)) {
    if (python_exec.empty())
      return Status::Error("cannot run " + c.entrypoint + ": no python3 on PATH (set PYTHON_EXEC)");
    if (Status s = CheckExecutable(python_exec, python_exec); !s.ok()) return s;
    if (!c.module) {
      struct stat st;
      if (::stat(c.entrypoint.c_str(), &st) != 0)
        return Status::Error("cannot open " + c.entrypoint + ": " + std::strerror(errno));
    }
    return python_exec;
  }
  std::string resolved = ResolveExecutable(c.entrypoint, env.Get("PATH"));
  if (resolved.find('/') == std::string::npos)
    return Status::Error("cannot execute " + c.entrypoint + ": command not found in PATH");
  if (Status s = CheckExecutable(c.entrypoint, resolved); !s.ok()) return s;
  return resolved;
}

}  // namespace ctrun
