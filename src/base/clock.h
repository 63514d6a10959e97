// Time types for every deadline in the agent (grace periods, spawn waits, rendezvous timeouts):
// CLOCK_MONOTONIC (steady_clock) at nanosecond resolution. Code that must be testable without
// waiting takes its time from a TimerQueue (sys/event_loop.h), which tests replace with a fake.
#pragma once

#include <chrono>

namespace ctrun {

using Duration = std::chrono::nanoseconds;
using TimePoint = std::chrono::time_point<std::chrono::steady_clock, Duration>;

inline Duration Seconds(double s) {
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s));
}
inline double ToSeconds(Duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace ctrun
