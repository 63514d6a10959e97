// The parent-side pieces of starting a worker that other ways of starting one (the warm spawner,
// src/warm) share with the fork/exec spawner.
#pragma once

#include <signal.h>

#include <string>

#include "base/unique_fd.h"
#include "process/spawn_spec.h"

namespace ctrun {

// Parent-side plumbing for one of fd 0/1/2: the fd the child dup2s onto it, and our end.
struct StdioPlumbing {
  UniqueFd child_end;  // -1: inherit
  UniqueFd parent_end;
};

// Opens what `t` asks for (a CLOEXEC pipe whose parent end is non-blocking, a pty, a file,
// /dev/null). `input`: fd 0 (the parent keeps a pipe's write end instead of its read end). On
// failure returns false with the failing step in *what and errno set.
bool PrepareStdio(const StdioTarget& t, bool input, StdioPlumbing* p, std::string* what);

// Marks every fd >= 3 close-on-exec; async-signal-safe (called between fork and exec).
void CloexecFrom3();

// The signals whose disposition is SIG_IGN now. Called in the parent before making children (a
// child copies the dispositions at its creation), so that each child resets only those instead
// of reading all 64 dispositions itself.
sigset_t IgnoredSignals();

// Between fork and exec: the dispositions in `ignored` (IgnoredSignals) back to default, `mask`
// as the signal mask. One of those signals raised in the child meanwhile (queued while blocked)
// is discarded, as it was ignored when raised.
void ResetChildSignals(const sigset_t& ignored, const sigset_t& mask);

}  // namespace ctrun
