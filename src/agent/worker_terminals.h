// WorkerTerminals: the window size of the workers' pseudo-terminals (StdioTarget::kPty) follows
// ctrun's console. Each pty is sized at spawn (logs::WorkerWindow: the console less the rank's
// prefix); on SIGWINCH ctrun re-reads its console's size, resizes every live worker's pty and
// sends SIGWINCH to that worker's process group itself: the ptys are nobody's controlling
// terminal (process/spawn_spec.h), so the kernel does not. A worker that inherits ctrun's own
// terminal (kInherit, the console a terminal) sees the new size itself, but runs in a background
// process group of its own, which the kernel does not signal either: its group gets SIGWINCH too.
//
// Contract: holds a duplicate of each master (CLOEXEC) until Remove/Clear; a duplicate of the
// master does not keep the pty alive for the relay (its EOF is the slaves closing). Loop thread.
#pragma once

#include <sys/types.h>

#include <map>
#include <set>

#include "base/unique_fd.h"
#include "process/spawner.h"
#include "sys/pty.h"

namespace ctrun {

class WorkerTerminals {
 public:
  explicit WorkerTerminals(Spawner& spawner) : spawner_(spawner) {}
  // master: the worker's pty master (duplicated here); prefix_width: its console prefix's width.
  void Add(pid_t pgid, int master, size_t prefix_width);
  // A worker whose stdout or stderr is ctrun's own terminal.
  void AddInheriting(pid_t pgid) { inheriting_.insert(pgid); }
  void Remove(pid_t pgid);
  void Clear() {
    terminals_.clear();
    inheriting_.clear();
  }
  size_t size() const { return terminals_.size(); }
  // The console is now `console` large: resize each pty, then SIGWINCH its group.
  void Resize(WindowSize console);
  // The console changed size: SIGWINCH each group that inherits it.
  void TellInheriting();

 private:
  struct Terminal {
    UniqueFd master;
    size_t prefix_width = 0;
  };
  Spawner& spawner_;
  std::map<pid_t, Terminal> terminals_;
  std::set<pid_t> inheriting_;
};

}  // namespace ctrun
