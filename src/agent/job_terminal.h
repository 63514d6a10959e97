// JobTerminal: what ctrun does for a job run from a terminal, in one place.
//  - Output: with --tty=auto (ctrun's stdout is a terminal) or always, each worker's console
//    stdout is a pseudo-terminal (logs/output_plan.h), sized like the console less the prefix and
//    resized on SIGWINCH (agent/worker_terminals.h).
//  - Input: when ctrun's stdin is a terminal, local rank 0 reads it through ctrun
//    (agent/stdin_forwarder.h); the other ranks read /dev/null.
//  - Job control (Ctrl-Z) is the runner's SuspendJob: the agent stops and continues the worker
//    groups (Agent::SuspendWorkers/ResumeWorkers), ctrun stops itself in between.
// Loop thread only.
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>

#include "agent/stdin_forwarder.h"
#include "agent/worker_terminals.h"
#include "config/launch_config.h"
#include "logs/output_plan.h"
#include "sys/event_loop.h"
#include "sys/pty.h"

namespace ctrun {

class JobTerminal {
 public:
  // console_fd: ctrun's stdout (the terminal whose size the ptys follow); stdin_fd: its stdin.
  JobTerminal(TtyMode mode, EventLoop& loop, Spawner& spawner, int console_fd = 1, int stdin_fd = 0);

  // Sets PlanInputs::pty_window, forward_stdin and the console streams' terminal flags for the
  // coming attempt.
  void FillPlanInputs(logs::PlanInputs* in) const;
  // A worker started: keep its pty master for resizes, give local rank 0's stdin pipe to the
  // forwarder.
  void OnWorkerStarted(int local_rank, const logs::WorkerOutputPlan& plan, SpawnedProcess& proc);
  void OnGroupGone(pid_t pgid) { terminals_.Remove(pgid); }
  void OnNewAttempt();
  // SIGWINCH: the console's size changed.
  void OnWindowChanged();
  // SIGCONT: ctrun was continued. A resize while it was stopped (which sent it no SIGWINCH) is
  // passed on now.
  void OnContinued();
  bool uses_pty() const { return window_.has_value(); }

 private:
  int console_fd_;
  bool console_tty_;  // ctrun's stdout is a terminal: workers that inherit it get SIGWINCH from here
  bool stderr_tty_;   // ctrun's stderr is a terminal
  std::optional<WindowSize> window_;  // set when workers get ptys
  std::optional<WindowSize> last_size_;  // the console's size when last looked at
  std::optional<WindowSize> ConsoleSize() const;
  std::unique_ptr<StdinForwarder> forwarder_;
  WorkerTerminals terminals_;
};

}  // namespace ctrun
