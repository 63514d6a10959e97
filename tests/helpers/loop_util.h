// Driving a real EventLoop from a test: run until a condition holds (against a deadline, never
// sleep-and-hope), run for an observation window, and capture asynchronous results.
#pragma once

#include <functional>
#include <optional>

#include "base/status.h"
#include "sys/event_loop.h"

namespace ctrun::testing {

// Runs the loop until pred() holds or `timeout` passes; returns pred().
inline bool RunUntil(EventLoop& loop, const std::function<bool()>& pred, Duration timeout) {
  const TimePoint deadline = loop.Now() + timeout;
  while (!pred()) {
    const TimePoint now = loop.Now();
    if (now >= deadline) return pred();
    loop.RunOnce(deadline - now);
  }
  return true;
}

// Runs the loop for `d` (an observation window: "nothing happens meanwhile").
inline void RunFor(EventLoop& loop, Duration d) {
  RunUntil(loop, [] { return false; }, d);
}

// A callback that stores its result in *out.
template <typename T>
auto Into(std::optional<StatusOr<T>>* out) {
  return [out](StatusOr<T> r) { out->emplace(std::move(r)); };
}
inline auto IntoStatus(std::optional<Status>* out) {
  return [out](Status s) { out->emplace(std::move(s)); };
}

}  // namespace ctrun::testing
