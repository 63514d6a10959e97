// ExitStatus: how one process ended, as a value (folly ProcessReturnCode, tini exit codes).
// The summary, the error file and ctrun's own exit code all derive from this one type.
#pragma once

#include <string>

namespace ctrun {

class ExitStatus {
 public:
  enum class Kind { kExited, kSignaled };

  static ExitStatus Exited(int code) { return ExitStatus(Kind::kExited, code, false); }
  static ExitStatus Signaled(int sig, bool core = false) { return ExitStatus(Kind::kSignaled, sig, core); }
  // From a waitpid()/waitid() status word.
  static ExitStatus FromWaitStatus(int status);

  Kind kind() const { return kind_; }
  bool exited() const { return kind_ == Kind::kExited; }
  bool signaled() const { return kind_ == Kind::kSignaled; }
  bool success() const { return exited() && value_ == 0; }
  int exit_code() const { return exited() ? value_ : -1; }
  int signal() const { return signaled() ? value_ : 0; }
  bool core_dumped() const { return core_; }

  // Shell convention: the exit code, or 128+signal.
  int ShellCode() const { return exited() ? value_ : 128 + value_; }
  // torchrun's convention: exit code, or -signal.
  int TorchCode() const { return exited() ? value_ : -value_; }
  // "exited with code 3", "killed by signal 9 (SIGKILL)", "... (core dumped)".
  std::string ToString() const;

  bool operator==(const ExitStatus& o) const = default;

 private:
  ExitStatus(Kind k, int v, bool core) : kind_(k), value_(v), core_(core) {}
  Kind kind_;
  int value_;
  bool core_;
};

// "SIGKILL" for 9; "SIG42" when unnamed. Async-signal-unsafe (string).
std::string SignalName(int sig);
// Parses "SIGTERM", "TERM", "sigterm" or "15"; returns 0 when unknown.
int SignalFromName(const std::string& name);

}  // namespace ctrun
