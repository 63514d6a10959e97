#include "agent/launch_checks.h"

#include <limits>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "agent/worker_env.h"
#include "base/shebang.h"
#include "sys/posix_util.h"
#include "gpu/visible_devices.h"

namespace ctrun {
namespace {

bool IsExecutableFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

}  // namespace

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

namespace {

// CUDA_VISIBLE_DEVICES lists MIG instances (the first entry decides, as for the runtime).
bool IsMigList(const GpuInventory& g) { return !g.visible.empty() && g.visible.front().rfind("MIG-", 0) == 0; }

// The GPUs one worker count per GPU can use: a CUDA process uses only the first MIG instance of a
// list of several (torch.cuda.device_count() is 1, so torchrun starts one worker), unless
// --virtual-local-rank hands each worker its own entry. The inventory keeps every entry (GPU
// placement and --virtual-local-rank go by it).
int UsableGpus(const LaunchConfig& c, const GpuInventory& g) {
  return IsMigList(g) && !c.virtual_local_rank ? std::min(g.count(), 1) : g.count();
}

}  // namespace

std::string MigListNotice(const LaunchConfig& c, const GpuInventory& g) {
  if (!IsMigList(g) || g.count() < 2 || c.virtual_local_rank || c.nproc_per_node < 1) return "";
  const std::string listed = "CUDA_VISIBLE_DEVICES lists " + std::to_string(g.count()) +
                             " MIG instances, and a CUDA process uses only the first";
  const std::string own = "--virtual-local-rank gives each worker its own instance";
  if (c.nproc.kind == NprocSpec::Kind::kCount) {
    if (c.nproc_per_node < 2) return "";
    return listed + ": the " + std::to_string(c.nproc_per_node) + " workers all see " + g.visible.front() +
           " as device 0, and a worker that picks device LOCAL_RANK finds none past it; " + own;
  }
  return listed + ": --nproc_per_node=" + std::string(c.nproc.kind == NprocSpec::Kind::kGpu ? "gpu" : "auto") +
         " starts 1 worker, as torchrun does; " + own;
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
      c->nproc_per_node = UsableGpus(*c, g);
      break;
    case NprocSpec::Kind::kAuto:
      c->nproc_per_node = g.count() > 0 ? UsableGpus(*c, g) : cpus;
      break;
  }
  if (c->nproc_per_node < 1) return Status::Error("--nproc_per_node resolved to 0 workers");
  if (static_cast<long long>(c->max_nodes) * c->nproc_per_node > std::numeric_limits<int>::max())
    return Status::Error("--nnodes=" + std::to_string(c->max_nodes) + " with --nproc_per_node=" +
                         std::to_string(c->nproc_per_node) + " makes more ranks than " +
                         std::to_string(std::numeric_limits<int>::max()));
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

bool HasShebang(const std::string& head) { return head.rfind("#!", 0) == 0; }

// The program of a #! line that runs Python ("python3", "/usr/bin/python3.11"); "" otherwise.
std::string ShebangPythonProgram(const std::string& head) {
  const std::optional<Shebang> s = ParseShebang(head);
  if (!s) return "";
  const std::string program = ShebangProgram(*s);
  return IsPythonProgram(program) ? program : "";
}

// Text (no NUL) that Python could run: no #! line, or one that names python.
bool IsPythonText(const std::string& head) {
  if (head.empty() || head.find('\0') != std::string::npos) return false;
  return !HasShebang(head) || !ShebangPythonProgram(head).empty();
}

}  // namespace

std::string ShebangPython(const std::string& script, const std::string* path) {
  const std::string program = ShebangPythonProgram(ReadFileHead(script, 256));
  return program.empty() ? "" : ResolveExecutable(program, path);
}

std::string ClassifyEntrypoint(LaunchConfig* c, const std::string* path) {
  c->python_text_entrypoint = false;
  c->python_shebang_entrypoint = false;
  if (c->no_python || c->module || UsesPython(*c)) return "";
  struct stat st;
  if (::stat(c->entrypoint.c_str(), &st) != 0) return "";
  if (S_ISDIR(st.st_mode)) {
    if (::access((c->entrypoint + "/__main__.py").c_str(), F_OK) != 0) return "";
    c->python_text_entrypoint = true;
    return c->entrypoint + " is a directory with a __main__.py: it runs under Python, as torchrun runs every entrypoint";
  }
  if (!S_ISREG(st.st_mode)) return "";
  const std::string head = ReadFileHead(c->entrypoint, 4096);
  if (head.rfind("PK\x03\x04", 0) == 0) {  // a zip archive without a #! line: Python runs its __main__.py
    c->python_text_entrypoint = true;
    return c->entrypoint + " is a zip archive (a zipapp): it runs under Python, as torchrun runs every entrypoint";
  }
  if (!IsPythonText(head)) return "";
  const bool executable = ::access(c->entrypoint.c_str(), X_OK) == 0;
  if (executable && HasShebang(head)) {
    // The kernel runs it with its interpreter; a bare name runs what PATH has, and one PATH lacks
    // is the working directory's script, which torchrun would run under Python.
    if (c->entrypoint.find('/') != std::string::npos || ResolveExecutable(c->entrypoint, path).find('/') != std::string::npos) {
      c->python_shebang_entrypoint = true;  // IsPythonText: the #! line names python
      return "";
    }
    c->python_text_entrypoint = true;
    return c->entrypoint + " is not in PATH; the working directory's Python script of that name runs under Python, "
                           "as torchrun runs every entrypoint (give it as ./" + c->entrypoint + " to run it by its #! line)";
  }
  c->python_text_entrypoint = true;
  if (executable)
    return c->entrypoint + " is a text file without a #! line (the kernel cannot execute it): it runs under "
                           "Python, as torchrun runs every entrypoint";
  return c->entrypoint + " is not executable and is a text file: it runs under Python, as torchrun runs "
                         "every entrypoint (chmod +x it, or --no-python, to execute it directly)";
}

std::string PythonNotice(const LaunchConfig& c, const std::string& python_exec, const Environment& env) {
  if (!UsesPython(c) || python_exec.empty()) return "";
  const std::string* chosen = env.Get("PYTHON_EXEC");
  if (chosen && !chosen->empty()) return "workers run under " + python_exec + " (PYTHON_EXEC)";
  return "workers run under " + python_exec + " (the first python3 on PATH; PYTHON_EXEC chooses another)";
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
    if (Status s = CheckExecutable(python_exec, python_exec); !s.ok()) {
      const std::string* chosen = env.Get("PYTHON_EXEC");
      return chosen && !chosen->empty() ? Status::Error(s.message() + " (the interpreter PYTHON_EXEC names)") : s;
    }
    // A script path with a placeholder (${local_rank}) names a file per worker: each worker's
    // interpreter reports its own if missing.
    if (!c.module && c.entrypoint.find('$') == std::string::npos) {
      struct stat st;
      if (::stat(c.entrypoint.c_str(), &st) != 0)
        return Status::Error("cannot open " + c.entrypoint + ": " + std::strerror(errno));
    }
    return python_exec;
  }
  std::string resolved = ResolveExecutable(c.entrypoint, env.Get("PATH"));
  // A directory (one with a __main__.py runs under Python: ClassifyEntrypoint), given as a path or
  // as a bare name that PATH lacks.
  struct stat st;
  const bool here = ::stat(c.entrypoint.c_str(), &st) == 0;
  if (here && S_ISDIR(st.st_mode) && (c.entrypoint.find('/') != std::string::npos || resolved.find('/') == std::string::npos))
    return Status::Error("cannot execute " + c.entrypoint + ": is a directory without a __main__.py");
  // A pipe (`/dev/stdin`, `<(...)`) or a device is no file to exec, and a pipe can be read once
  // while every worker (and every restart) needs the script.
  if (here && c.entrypoint.find('/') != std::string::npos && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
    return Status::Error("cannot execute " + c.entrypoint + ": " +
                         (S_ISFIFO(st.st_mode) ? "a pipe, which only one worker could read once: save the script to a file"
                                               : std::string("not a regular file")));
  if (resolved.find('/') == std::string::npos)
    return Status::Error("cannot execute " + c.entrypoint + ": command not found in PATH" +
                         (here && S_ISREG(st.st_mode) ? " (the working directory has one: give it as ./" + c.entrypoint + ")" : ""));
  if (Status s = CheckExecutable(c.entrypoint, resolved); !s.ok()) return s;
  return resolved;
}

std::string EventLogHandlerNotice(const LaunchConfig& c) {
  if (c.event_log_handler != "console") return "";
  return "--event-log-handler console: torchrun prints its agent's events there, ctrun does not; ctrun writes "
         "its own as JSON lines with --events-file PATH";
}

std::string MultiNodeRestartFlagsNotice(const LaunchConfig& c) {
  if (!c.rdzv.multi_node) return "";
  std::string what;
  if (c.restart_backoff > 0) what = "--restart-backoff";
  if (c.heartbeat_timeout > 0) what += std::string(what.empty() ? "" : " and ") + "the crash-loop guard (--crash-loop-limit)";
  if (what.empty()) return "";
  return what + ": ignored in a multi-node job, which restarts when its rendezvous says so (single node only)";
}

}  // namespace ctrun
