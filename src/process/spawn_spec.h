// SpawnSpec: everything needed to start one worker, built before fork (nothing is computed in the
// child). The spawner turns it into fork/exec; the fake spawner records it.
#pragma once

#include <string>
#include <vector>

namespace ctrun {

// What a worker's fd 1 or fd 2 becomes.
struct StdioTarget {
  enum class Kind {
    kInherit,  // ctrun's own fd 1/2 (the console), untouched
    kPipe,     // a pipe; the parent keeps the read end (SpawnedProcess::stdout_pipe/stderr_pipe)
    kFile,     // open(path, O_WRONLY|O_CREAT|O_TRUNC) in the child's place, by the parent
    kDevNull,  // /dev/null
  };
  Kind kind = Kind::kInherit;
  std::string path;  // kFile

  static StdioTarget Inherit() { return {}; }
  static StdioTarget Pipe() { return {Kind::kPipe, {}}; }
  static StdioTarget File(std::string p) { return {Kind::kFile, std::move(p)}; }
  static StdioTarget DevNull() { return {Kind::kDevNull, {}}; }
};

// Every worker also: leads its own process group (setpgid), gets PR_SET_PDEATHSIG(SIGKILL), keeps
// ctrun's stdin and working directory, and sees no fd but 0, 1 and 2.
struct SpawnSpec {
  std::string executable;         // the file execve runs, PATH already searched by whoever built the
                                  // spec (the spawner reads no environment); "": argv[0] as a path
  std::vector<std::string> argv;  // argv[0] is what the program sees as its name
  std::vector<std::string> env;   // complete environment, "K=V", exactly as execve gets it
  StdioTarget stdout_target;
  StdioTarget stderr_target;
  std::vector<int> cpu_affinity;  // CPUs the worker may run on (sched_setaffinity before exec);
                                  // empty: ctrun's own affinity, inherited
  bool stop_before_exec = false;  // raise SIGSTOP just before exec, for a debugger to attach;
                                  // Spawn does not wait for such an exec (a late failure shows
                                  // only as the worker's exit)
};

}  // namespace ctrun
