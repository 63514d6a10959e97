// ExecPipe: how a forked child tells the parent whether its exec happened. The parent creates a
// CLOEXEC pipe before fork; the child keeps the write end. Exec succeeding closes it (EOF for the
// parent); a failure on the way is written as one ChildError record, then the child _exits.
//
// Contract:
//  - ReportChildFailure is async-signal-safe (the child calls it between fork and exec).
//  - AwaitExec never waits past its deadline: an exec stuck in the kernel (a binary on a hung
//    network file system) must not freeze the agent's event loop. kUnconfirmed means neither EOF
//    nor a record arrived in time; the child may still exec, fail later, or hang.
//  - Only the child holds the write end (the parent closes its copy right after fork), so EOF
//    after a record means the child has closed its files, i.e. it is exiting.
#pragma once

#include <string>

#include "base/clock.h"

namespace ctrun {

// The step of the child's set-up that failed.
enum class ChildStage : int { kSetpgid = 1, kDup, kExec, kPdeathsig, kAffinity, kUnshareFiles };

// The record the child writes before _exit: the failing step and its errno.
struct ChildError {
  ChildStage stage;
  int err;
};

// Child side: writes {stage, errno} to the pipe and exits with 127 (ExitChild).
[[noreturn]] void ReportChildFailure(int pipe_fd, ChildStage stage);

// Child side, before exec: ends the process at once through the exit_group system call. Not
// _exit: a sanitizer's _exit interceptor runs its leak check, which in a vfork-style child (our
// memory, our locks) takes the parent's sanitizer locks and can leave them held.
[[noreturn]] void ExitChild(int code);

enum class ExecOutcome {
  kExeced,       // EOF: the exec succeeded (or the read failed: treated alike, as before)
  kFailed,       // a ChildError record was read into *error
  kUnconfirmed,  // the deadline passed first
};

// Parent side: waits on the pipe's read end (blocking or not) until `deadline`.
ExecOutcome AwaitExec(int pipe_fd, TimePoint deadline, ChildError* error);

// Waits until the child that wrote a record has closed the pipe (it is exiting); false when the
// deadline passed first.
bool AwaitChildExit(int pipe_fd, TimePoint deadline);

// "setpgid", "redirect stdio", "prctl(PR_SET_PDEATHSIG)", "exec", "sched_setaffinity".
const char* ChildStageName(ChildStage stage);

// Why execve(exe) failed with `err`, for the user: strerror(err), except for ENOENT on a file that
// exists, where the missing file is the interpreter its #! line names ("the interpreter its #!
// line names, /x/y: No such file or directory") or, for an ELF binary, its dynamic loader. Reads
// the file's first bytes: parent side only, after the exec failed.
std::string ExplainExecError(const std::string& exe, int err);

}  // namespace ctrun
