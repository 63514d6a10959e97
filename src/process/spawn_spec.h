// SpawnSpec: everything needed to start one worker, built before fork (nothing is computed in the
// child). The spawner turns it into fork/exec; the fake spawner records it.
#pragma once

#include <sys/types.h>

#include <csignal>
#include <string>
#include <vector>

#include "base/unique_fd.h"

namespace ctrun {

// What a worker's fd 1 or fd 2 becomes.
struct StdioTarget {
  enum class Kind {
    kInherit,  // ctrun's own fd 1/2 (the console), untouched
    kPipe,     // a pipe; the parent keeps the read end (SpawnedProcess::stdout_pipe/stderr_pipe)
    kFile,     // open(path, O_WRONLY|O_CREAT|O_TRUNC or O_APPEND) in the child's place, by the parent
    kDevNull,  // /dev/null
  };
  Kind kind = Kind::kInherit;
  std::string path;     // kFile
  bool append = false;  // kFile

  static StdioTarget Inherit() { return {}; }
  static StdioTarget Pipe() { return {Kind::kPipe, {}, false}; }
  static StdioTarget File(std::string p, bool append = false) { return {Kind::kFile, std::move(p), append}; }
  static StdioTarget DevNull() { return {Kind::kDevNull, {}, false}; }
};

struct SpawnSpec {
  std::vector<std::string> argv;  // argv[0] is resolved through PATH when it has no '/'
  std::vector<std::string> env;   // complete environment, "K=V"
  std::string cwd;                // empty: inherit
  StdioTarget stdout_target;
  StdioTarget stderr_target;
  bool stdin_devnull = false;     // workers other than local rank 0 could get /dev/null
  bool new_process_group = true;  // setpgid(0,0): the worker leads its own group
  int parent_death_signal = SIGKILL;  // 0: none
  std::vector<int> keep_fds;      // fds inherited on purpose (dup'd to the same number); rest closed
};

}  // namespace ctrun
