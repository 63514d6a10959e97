// SpawnThread: the thread PosixSpawner makes its vfork-style children on (process/vfork_clone.h).
// A vfork suspends the creating thread until the child has exec'd; on this thread, an exec that
// hangs (a binary on a dead network file system) holds this thread, not the agent's event loop,
// which waits only until its deadline.
//
// Contract:
//  - Used from one thread (the agent's). Run hands the thread one job and waits until the job is
//    done or `deadline` passes; jobs run one at a time. Post and Wait are Run's two halves, for a
//    caller with work of its own to do while the job runs (and feeds it, under the job's own lock).
//  - A job still running at the deadline keeps its thread: Run returns false and Current() makes
//    a fresh thread for the next job. The late job must own (shared_ptr) everything it and its
//    children touch, because it may run on after Run returned.
//  - The threads never exit, stuck or idle: PR_SET_PDEATHSIG kills a child when the *thread* that
//    created it ends, and every worker must live until ctrun itself is gone. Process exit ends
//    them with everything else.
//  - Every signal is blocked on these threads from their first instruction on: ctrun takes its
//    signals through a signalfd, and a thread with SIGCHLD unblocked would swallow it.
#pragma once

#include <functional>
#include <memory>

#include "base/clock.h"

namespace ctrun {

class SpawnThread {
 public:
  // The thread to use now (started on first use, replaced after a job overran its deadline);
  // null when no thread can be started (the caller forks instead).
  static SpawnThread* Current();

  // Runs `job` on the thread; true once it finished, false when `deadline` came first (the job
  // goes on; see the contract).
  bool Run(std::function<void()> job, TimePoint deadline);
  // Hands `job` to the thread and returns at once; Wait must follow before the next Post.
  void Post(std::function<void()> job);
  // Run's wait for the posted job.
  bool Wait(TimePoint deadline);

  struct State;  // shared with the thread, which outlives this handle when abandoned

 private:
  SpawnThread();
  bool Start();
  std::shared_ptr<State> state_;
};

}  // namespace ctrun
