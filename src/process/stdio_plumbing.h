// The parent-side pieces of starting a worker that other ways of starting one (the warm spawner,
// src/warm) share with the fork/exec spawner.
#pragma once

#include <signal.h>

#include <string>

#include "base/unique_fd.h"
#include "process/spawn_spec.h"

namespace ctrun {

// Parent-side plumbing for one of fd 1/2: the fd the child dup2s onto it, and our read end.
struct StdioPlumbing {
  UniqueFd child_end;  // -1: inherit
  UniqueFd parent_end;
};

// Opens what `t` asks for (a CLOEXEC pipe whose read end is non-blocking, a file, /dev/null).
// On failure returns false with the failing step in *what and errno set.
bool PrepareStdio(const StdioTarget& t, StdioPlumbing* p, std::string* what);

// Marks every fd >= 3 close-on-exec; async-signal-safe (called between fork and exec).
void CloexecFrom3();

// Between fork and exec: SIG_IGN dispositions back to default, `mask` as the signal mask.
void ResetChildSignals(const sigset_t& mask);

}  // namespace ctrun
