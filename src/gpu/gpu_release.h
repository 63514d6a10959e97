// GpuReleaseWaiter: before a restart, waits until the previous attempt's processes are gone from
// every GPU the job uses, so the new attempt does not start on GPUs whose memory is still held
// (the driver releases a context some time after its process died).
//
// NVML has no event for "a context went away", so the wait is a bounded series of timer-driven
// checks on the agent's event loop (never a sleep): one now, then every `interval` until
// `timeout`. A process counts as the previous attempt's when its pid is one of the attempt's
// worker pids, or /proc shows it in one of their process groups (every worker leads its own);
// other users' processes on the same GPUs are ignored. A listed worker pid that /proc no longer
// shows is a context still being torn down: waited for like a live one.
// At the deadline, what is still there is reported by pid (uninterruptible "D" state said: such
// a process cannot be killed) and the restart is refused (done gets an error).
// A GPU whose processes NVML cannot list (e.g. NO_PERMISSION on a MIG-enabled GPU for a user
// other than root) is not waited for: the first time, one warning line names the GPU and NVML's
// reason, so a restart that then meets the GPU still held is not a mystery.
//
// Limitation: NVML reports host pids; inside a PID namespace (a container) they do not match the
// workers' pids, and the wait ends at once.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/status.h"
#include "gpu/gpu_device.h"
#include "sys/event_loop.h"

namespace ctrun {

// What /proc/<pid>/stat says; exists == false when there is no such process.
struct ProcState {
  bool exists = false;
  char state = '?';  // R, S, D, Z, T, ...
  pid_t pgrp = 0;
};
using ProcStateReader = std::function<ProcState(pid_t)>;
ProcState ReadProcState(pid_t pid);

class GpuReleaseWaiter {
 public:
  struct Options {
    Duration timeout = std::chrono::seconds(15);
    Duration interval = std::chrono::milliseconds(50);
    // Where the warnings go, one line each; ctrun's log (spdlog::warn) when empty.
    std::function<void(const std::string&)> warn;
  };
  // devices: the NVML indices of the job's GPUs. Not owned: driver, timers.
  GpuReleaseWaiter(GpuDriver& driver, std::vector<int> devices, TimerQueue& timers, ProcStateReader proc,
                   Options options);
  ~GpuReleaseWaiter();
  GpuReleaseWaiter(const GpuReleaseWaiter&) = delete;
  GpuReleaseWaiter& operator=(const GpuReleaseWaiter&) = delete;

  // Starts a wait for the processes of the attempt whose workers had `worker_pids` (a pending
  // wait is cancelled). `done` runs exactly once, from Wait itself when nothing is held, else
  // from a timer; never after the waiter is destroyed.
  void Wait(std::vector<pid_t> worker_pids, std::function<void(Status)> done);

 private:
  // The previous attempt's processes still on the GPUs, as "pid 123 (GPU 0)" descriptions.
  std::vector<std::string> Holders(bool* any_d_state);
  void Check();

  GpuDriver& driver_;
  std::vector<int> devices_;
  TimerQueue& timers_;
  ProcStateReader proc_;
  Options options_;
  std::vector<pid_t> ours_;
  std::function<void(Status)> done_;
  TimePoint deadline_{};
  std::optional<TimerQueue::TimerId> timer_;
  std::set<int> unlistable_;  // GPUs already warned about: their processes cannot be listed
};

}  // namespace ctrun
