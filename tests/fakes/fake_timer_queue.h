// FakeTimerQueue: a TimerQueue whose time moves only when the test calls Advance().
#pragma once

#include <map>

#include "sys/event_loop.h"

namespace ctrun::testing {

class FakeTimerQueue final : public TimerQueue {
 public:
  TimePoint Now() const override { return now_; }
  TimerId AddTimer(TimePoint deadline, TimerHandler h) override {
    TimerId id = next_++;
    timers_.emplace(id, std::make_pair(deadline, std::move(h)));
    return id;
  }
  void CancelTimer(TimerId id) override { timers_.erase(id); }
  size_t pending() const { return timers_.size(); }
  // Moves time forward without running any timer: the process was stopped (SIGSTOP) meanwhile;
  // the timers that fell due run at the next Advance.
  void Jump(Duration d) { now_ += d; }
  // Moves time forward, firing due timers in deadline order (timers added while firing count).
  void Advance(Duration d) {
    TimePoint target = now_ + d;
    for (;;) {
      auto best = timers_.end();
      for (auto it = timers_.begin(); it != timers_.end(); ++it)
        if (it->second.first <= target && (best == timers_.end() || it->second.first < best->second.first)) best = it;
      if (best == timers_.end()) break;
      now_ = std::max(now_, best->second.first);
      auto h = std::move(best->second.second);
      timers_.erase(best);
      h();
    }
    now_ = target;
  }

 private:
  TimePoint now_{};
  TimerId next_ = 1;
  std::map<TimerId, std::pair<TimePoint, TimerHandler>> timers_;
};

}  // namespace ctrun::testing
