// Clock: the injected source of time for every deadline in the agent (grace periods, heartbeats,
// rendezvous timeouts). RealClock reads CLOCK_MONOTONIC; tests use tests/fakes/fake_clock.h.
#pragma once

#include <chrono>

namespace ctrun {

using Duration = std::chrono::nanoseconds;
using TimePoint = std::chrono::time_point<std::chrono::steady_clock, Duration>;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimePoint Now() const = 0;
};

class RealClock final : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
};

inline Duration Seconds(double s) {
  return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s));
}
inline double ToSeconds(Duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace ctrun
