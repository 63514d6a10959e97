#include "process/exec_pipe.h"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

#include "base/shebang.h"
#include "sys/posix_util.h"

namespace ctrun {
namespace {

// Waits until fd is readable (data, EOF or an error) or the deadline passes; false on timeout.
bool WaitReadable(int fd, TimePoint deadline) {
  for (;;) {
    const Duration left = deadline - std::chrono::steady_clock::now();
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(std::max(left, Duration::zero())).count();
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(ms, 1 << 30)));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return true;  // a broken fd: let read() report it
  }
}

}  // namespace

void ReportChildFailure(int pipe_fd, ChildStage stage) {
  ChildError e{stage, errno};
  (void)!::write(pipe_fd, &e, sizeof e);  // nothing left to do if the parent is gone
  ExitChild(127);
}

void ExitChild(int code) {
  for (;;) ::syscall(SYS_exit_group, code);
}

ExecOutcome AwaitExec(int pipe_fd, TimePoint deadline, ChildError* error) {
  if (!WaitReadable(pipe_fd, deadline)) return ExecOutcome::kUnconfirmed;
  // A record is 8 bytes, written at once (< PIPE_BUF): it arrives whole or not at all.
  const ssize_t n = RetryOnEintr([&] { return ::read(pipe_fd, error, sizeof *error); });
  return n == static_cast<ssize_t>(sizeof *error) ? ExecOutcome::kFailed : ExecOutcome::kExeced;
}

bool AwaitChildExit(int pipe_fd, TimePoint deadline) {
  char byte;
  for (;;) {
    if (!WaitReadable(pipe_fd, deadline)) return false;
    const ssize_t r = RetryOnEintr([&] { return ::read(pipe_fd, &byte, 1); });
    if (r == 0) return true;   // EOF: the child closed its files
    if (r < 0) return false;   // cannot tell: the caller leaves the child to the reaper
  }
}

std::string ExplainExecError(const std::string& exe, int err) {
  const std::string plain = std::strerror(err);
  if (err != ENOENT || exe.empty()) return plain;
  const std::string head = ReadFileHead(exe, 256);  // "": the file itself is missing, ENOENT says it
  if (head.rfind("\x7f" "ELF", 0) == 0) return plain + " (its ELF interpreter, the dynamic loader it names, is missing)";
  const std::optional<Shebang> shebang = ParseShebang(head);
  if (!shebang) return plain;
  return "the interpreter its #! line names, " + shebang->interpreter + ": " + plain;
}

const char* ChildStageName(ChildStage stage) {
  switch (stage) {
    case ChildStage::kSetpgid: return "setpgid";
    case ChildStage::kDup: return "redirect stdio";
    case ChildStage::kPdeathsig: return "prctl(PR_SET_PDEATHSIG)";
    case ChildStage::kAffinity: return "sched_setaffinity";
    case ChildStage::kUnshareFiles: return "take a file descriptor table of its own";
    case ChildStage::kExec: break;
  }
  return "exec";
}

}  // namespace ctrun
