// Test helpers shared by process and e2e tests: deadline polling (never sleep-and-hope), temp dirs,
// running a command and capturing its output, process liveness checks.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace ctrun::testing {

// Polls pred() every ~2 ms until it returns true or `timeout` passes. Returns the last result.
bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout);

// A fresh directory under $TMPDIR (or /tmp), removed recursively by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct RunResult {
  int exit_code = -1;   // shell code: exit status, or 128+signal
  std::string out;      // stdout
  std::string err;      // stderr
  double seconds = 0;
};

// Runs argv with `extra_env` ("K=V") added to the current environment; captures stdout/stderr.
// Kills the process group and fails the result (exit_code -1) after `timeout`.
// Unless extra_env sets PET_MASTER_PORT, it is set to a free port: a ctrun started without
// --standalone or --master_port would otherwise bind torchrun's default 29500, which another test
// running at the same moment (ctest -j) may hold. A --master_port flag still wins over it.
RunResult RunCommand(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env = {},
              std::chrono::milliseconds timeout = std::chrono::seconds(60));

// Whether /usr/bin/python3 (Debian's, where python3-torch lives) can import `module`; asked once
// per module and test process. Tests that run real PyTorch skip without it.
bool PythonCanImport(const std::string& module);

// A child started in the background (own process group) with stdout/stderr to files.
class BackgroundProcess {
 public:
  BackgroundProcess(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env,
                    const std::string& out_path, const std::string& err_path);
  ~BackgroundProcess();  // SIGKILLs the group if still running
  pid_t pid() const { return pid_; }
  void Signal(int sig);
  // Waits for exit up to timeout; returns shell code or -1 on timeout.
  int Wait(std::chrono::milliseconds timeout);

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = 0;
};

bool ProcessAlive(pid_t pid);  // exists and is not a zombie
pid_t ParentOf(pid_t pid);     // its parent's pid; 0 when it is gone or a zombie
// The live processes below `ancestor` (children, grandchildren, ...), read from /proc now.
std::vector<pid_t> LiveDescendants(pid_t ancestor);
// ctrun's watchdog among the live processes below `ctrun` (its name is ct-watchdog, the
// program's from its exec, a forked one's a moment after the fork); 0 when there is none yet.
pid_t WatchdogBelow(pid_t ctrun);
std::string ReadFileOr(const std::string& path, const std::string& fallback = "");
// gdb's `thread apply all bt` (or eu-stack's) output folded to one line a thread: its id, its name
// and its frames' function names, innermost first ("?? (libfoo.so)" for a frame without symbols),
// with arguments, templates and repeats dropped; threads of identical stacks share a line. A hung
// test's dump then fits where a CI log shows only the start and the end of a failure.
std::string CompactStacks(const std::string& backtraces);
std::vector<std::string> SplitLines(const std::string& s);
// The workers' cgroup directory a --log-level=debug ctrun named ("workers run in cgroup DIR");
// "" when it ran without one.
std::string WorkersCgroupFromLog(const std::string& log);
// How many times `needle` occurs in `hay` (overlapping occurrences count).
int CountOf(const std::string& hay, const std::string& needle);
// "K=V" lines of a file (the fake worker's --env-file) as a map; empty if missing.
std::map<std::string, std::string> ReadEnvFile(const std::string& path);
// Pids (one per line) from a file written by the fake worker; empty if missing.
std::vector<pid_t> ReadPids(const std::string& path);

}  // namespace ctrun::testing
