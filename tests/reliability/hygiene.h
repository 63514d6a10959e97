// Hygiene checks the reliability scenarios run after every job: nothing of the job is left running,
// no zombie, no fd leaked by ctrun, no stray temporary file, a complete log directory.
//
// A job is found by a marker in the environment: every scenario starts ctrun with
// CTRUN_REL_JOB=<unique value>, which ctrun passes to every worker and the workers to their
// children, so /proc/<pid>/environ names every process of the job wherever it was reparented.
// (A process that clears its environment escapes this; the fake worker and the examples do not.)
#pragma once

#include <sys/types.h>

#include <set>
#include <string>
#include <vector>

namespace ctrun::reliability {

inline constexpr const char* kMarkerVar = "CTRUN_REL_JOB";

// A value no other job of this machine carries ("<pid>-<counter>-<random>").
std::string NewJobMarker();
// "CTRUN_REL_JOB=<marker>", for the extra environment of RunCommand/BackgroundProcess.
std::string MarkerEnv(const std::string& marker);

// Pids whose environment holds CTRUN_REL_JOB=<marker> (zombies included), except this process.
std::vector<pid_t> ProcessesOfJob(const std::string& marker);
// Waits (bounded) until no process of the job is left; returns the ones still there.
std::vector<pid_t> WaitJobGone(const std::string& marker, int timeout_ms = 10000);
// Zombie children of `parent` (state Z with that ppid).
std::vector<pid_t> ZombieChildren(pid_t parent);
// "fd -> target" of every open fd of pid (empty if it is gone).
std::set<std::string> OpenFds(pid_t pid);

// Entries of directory `dir` (names only, not recursive).
std::set<std::string> DirEntries(const std::string& dir);

// Every file and directory under root (relative paths), recursive.
std::vector<std::string> TreeOf(const std::string& root);

// The log directory of one run, `<base>/<run>_XXXXXX`: the attempts found, what is missing for
// `nproc` ranks in each attempt (stdout.log/stderr.log when `redirected`, else the rank dirs), and
// what else is in it (a tree made ahead for an attempt that never ran, say).
struct LogDirCheck {
  int attempts = 0;
  std::vector<std::string> missing;
  std::vector<std::string> unexpected;
};
LogDirCheck CheckLogDir(const std::string& run_dir, int nproc, bool redirected);

// Resident set size of pid in KiB (VmRSS), or the peak (VmHWM); -1 if unknown.
long RssKib(pid_t pid);
long PeakRssKib(pid_t pid);

// Live (not zombie) descendants of `ancestor` whose executable is `exe`.
std::vector<pid_t> DescendantsRunning(pid_t ancestor, const std::string& exe);
// The value of `name` in pid's environment ("" when unset or gone).
std::string EnvOf(pid_t pid, const std::string& name);

// A blocking TCP connection to 127.0.0.1:port (CLOEXEC), or -1.
int ConnectLoopback(int port);

// Text for a failed expectation: "pid 123 (cmd) state S" for each pid.
std::string Describe(const std::vector<pid_t>& pids);

}  // namespace ctrun::reliability
