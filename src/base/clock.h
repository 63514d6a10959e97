// Time types for every deadline in the agent (grace periods, spawn waits, rendezvous timeouts):
// CLOCK_MONOTONIC (steady_clock) at nanosecond resolution. Code that must be testable without
// waiting takes its time from a TimerQueue (sys/event_loop.h), which tests replace with a fake.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace ctrun {

using Duration = std::chrono::nanoseconds;
using TimePoint = std::chrono::time_point<std::chrono::steady_clock, Duration>;

inline Duration Seconds(double s) {
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s));
}
inline double ToSeconds(Duration d) { return std::chrono::duration<double>(d).count(); }

// A number of seconds for messages: "30 s", "0.5 s", "1.25 s" (no trailing zeros).
inline std::string FormatSeconds(double s) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.6g s", s);
  return buf;
}

}  // namespace ctrun
