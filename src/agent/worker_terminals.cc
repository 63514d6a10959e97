#include "agent/worker_terminals.h"

#include <fcntl.h>

#include <csignal>

#include "logs/output_plan.h"

namespace ctrun {

void WorkerTerminals::Add(pid_t pgid, int master, size_t prefix_width) {
  UniqueFd dup(::fcntl(master, F_DUPFD_CLOEXEC, 3));
  if (!dup) return;  // the worker keeps the size it started with
  terminals_[pgid] = Terminal{std::move(dup), prefix_width};
}

void WorkerTerminals::Remove(pid_t pgid) {
  terminals_.erase(pgid);
  inheriting_.erase(pgid);
}

void WorkerTerminals::TellInheriting() {
  for (pid_t pgid : inheriting_) spawner_.SignalGroup(pgid, SIGWINCH);
}

void WorkerTerminals::Resize(WindowSize console) {
  for (auto& [pgid, t] : terminals_) {
    if (SetWindowSize(t.master.get(), logs::WorkerWindow(console, t.prefix_width)))
      spawner_.SignalGroup(pgid, SIGWINCH);
  }
}

}  // namespace ctrun
