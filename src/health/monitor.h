// health::Monitor: what the Agent sees of hang detection and stack capture. The agent calls it at
// the points of an attempt's life; the monitor calls back on_hang when a rank misses a deadline.
// HealthMonitor (health_monitor.h) is the real one (heartbeat sockets, HangWatcher, StackCapture);
// tests use a fake that reports hangs on demand.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "health/native_stack.h"
#include "health/restart_policy.h"
#include "health/stack_summary.h"
#include "process/spawn_spec.h"

namespace ctrun::health {

class Monitor {
 public:
  // local_rank: the rank blamed (silent first); also_silent: the other ranks silent for at least
  // half the same timeout (see hang_watcher.h).
  using OnHang =
      std::function<void(int local_rank, const std::string& why, const std::vector<int>& also_silent)>;
  using OnStacks = std::function<void(const StackSummary& summary)>;
  virtual ~Monitor() = default;

  // Where hang verdicts go (set once, before the first attempt).
  virtual void SetOnHang(OnHang on_hang) = 0;
  // Before a worker of attempt `attempt` is spawned: gives it its heartbeat channel (an
  // environment variable and SpawnSpec::extra_fd) when heartbeats are in use.
  virtual void PrepareWorker(int attempt, int local_rank, SpawnSpec* spec) = 0;
  // The attempt's nranks workers were spawned: the deadlines start now. judge false: no verdict in
  // this attempt (beats and steps are still read), for a job with a rank under a debugger.
  virtual void AttemptStarted(int nranks, bool judge) = 0;
  // The whole job stood still (Ctrl-Z, then fg) for `suspended_for`: every deadline moves by it.
  virtual void Resumed(Duration suspended_for) = 0;
  virtual void WorkerExited(int local_rank) = 0;
  // The attempt is being stopped: no more verdicts (steps already seen are kept).
  virtual void StopWatching() = 0;
  // What the heartbeats of the current (or last) attempt said (restart_policy.h). Reads the beats
  // still queued first (a worker's last beats and its exit can reach the loop in any order).
  virtual AttemptBeats AttemptProgress() = 0;
  // Saves the stacks of every process of the rank's group (pgid); done(summary) once, later,
  // from the loop, within the capture's bound. Captures of several ranks run at once.
  virtual void CaptureStacks(int local_rank, pid_t pgid, OnStacks done) = 0;
  // After a capture of the rank's group: where the main thread of process `pid` waited, from its
  // saved native stacks (kUnknown when there are none).
  virtual MainThreadWait MainThreadOf(int local_rank, pid_t pid) = 0;
};

}  // namespace ctrun::health
