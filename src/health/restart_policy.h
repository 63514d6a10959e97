// RestartPolicy: what happens after a failed attempt that still has restarts left: how long to wait
// before the next one (exponential back-off), or whether to stop because the job is in a crash
// loop. Pure: the agent asks once per failed attempt and runs the delay on its TimerQueue.
//
// Back-off: the first restart waits `initial`, each further restart in a row twice the previous
// delay, at most `max`; an attempt that made progress brings the delay back to `initial`.
// Progress: the attempt's highest comparable heartbeat step is beyond every earlier attempt's (any
// step counts when no earlier attempt reported one). An attempt that beat without a comparable step
// (lines without a number, or the worker library's beat counter, which starts again at 1 in every
// process) cannot be judged: it is no crash-loop attempt (the count starts again after it), but it
// does not bring the back-off delay back to `initial` either. A `max` below `initial`
// is taken as `initial`. Without heartbeats there is no progress to measure: the delay only grows,
// and the crash-loop guard is off.
// Crash loop: with the guard on (crash_loop_limit > 0, heartbeats in use), `crash_loop_limit`
// failed attempts in a row without progress end the run instead of a restart: attempts that made
// no step beyond the best one, or never beat at all.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "base/clock.h"

namespace ctrun::health {

struct RestartPolicyOptions {
  Duration initial{0};
  Duration max{0};
  bool heartbeats = false;   // steps are measured
  int crash_loop_limit = 0;  // 0: guard off
};

// What the heartbeats of a failed attempt tell about its progress.
struct AttemptBeats {
  std::optional<uint64_t> max_step;  // the highest comparable step any rank reported; nullopt: none
  bool beat = false;                 // some rank beat, with or without a comparable step
};

struct RestartDecision {
  bool crash_loop = false;  // stop: `why` says so
  Duration delay{0};        // before the next attempt (when !crash_loop)
  std::string why;
};

class RestartPolicy {
 public:
  explicit RestartPolicy(RestartPolicyOptions options) : options_(options), next_delay_(options.initial) {}

  // An attempt failed; `beats`: what its ranks' heartbeats said.
  RestartDecision OnFailedAttempt(AttemptBeats beats);

  int attempts_without_progress() const { return without_progress_; }

 private:
  RestartPolicyOptions options_;
  Duration next_delay_;
  int without_progress_ = 0;
  std::optional<uint64_t> previous_step_;
};

}  // namespace ctrun::health
