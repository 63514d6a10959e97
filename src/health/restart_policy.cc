#include "health/restart_policy.h"

#include <algorithm>

namespace ctrun::health {

RestartDecision RestartPolicy::OnFailedAttempt(AttemptBeats beats) {
  const std::optional<uint64_t> max_step = beats.max_step;
  const bool progress = options_.heartbeats && max_step && (!previous_step_ || *max_step > *previous_step_);
  const bool unjudged = options_.heartbeats && !max_step && beats.beat;
  const std::optional<uint64_t> before = previous_step_;
  if (max_step) previous_step_ = std::max(*max_step, previous_step_.value_or(0));
  if (progress) {
    without_progress_ = 0;
    next_delay_ = options_.initial;
  } else if (unjudged) {
    without_progress_ = 0;  // it ran and beat: the attempts before it are no longer "in a row"
  } else {
    ++without_progress_;
  }
  RestartDecision d;
  if (options_.heartbeats && options_.crash_loop_limit > 0 && without_progress_ >= options_.crash_loop_limit) {
    d.crash_loop = true;
    d.why = "crash loop: " + std::to_string(without_progress_) + " attempt" + (without_progress_ == 1 ? "" : "s") +
            " in a row failed without progress (" +
            (before ? "no heartbeat step beyond " + std::to_string(*before)
                    : std::string(max_step ? "no heartbeat step beyond " + std::to_string(*max_step) : "no heartbeat")) +
            "); not restarting again (--crash-loop-limit)";
    return d;
  }
  const Duration cap = std::max(options_.max, options_.initial);
  d.delay = std::min(next_delay_, cap);
  next_delay_ = std::min(next_delay_ * 2, cap);
  return d;
}

}  // namespace ctrun::health
