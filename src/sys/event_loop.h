// EventLoop: ctrun's single-threaded reactor. One epoll set over fds (pidfds, signalfd, pipes,
// sockets) plus one CLOCK_MONOTONIC timerfd that carries every deadline. Nothing polls: the loop
// sleeps in epoll_wait until an fd is ready or the earliest timer is due.
//
// Contract:
//  - Handlers run on the loop's thread, one at a time. A handler may add/remove fds and timers,
//    including its own; removal takes effect at once (a removed fd's pending events are dropped).
//  - Timers are one-shot. CancelTimer on a fired or unknown id is a no-op.
//  - The loop is not thread-safe; the only cross-thread entry is Wake() (eventfd).
#pragma once

#include <sys/epoll.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>

#include "base/clock.h"
#include "base/status.h"
#include "base/unique_fd.h"

namespace ctrun {

// Timer scheduling seen by pure logic (agent state machine, rendezvous). EventLoop implements it
// against the real clock; tests/fakes/fake_timer_queue.h implements it against a FakeClock.
class TimerQueue {
 public:
  using TimerId = uint64_t;
  using TimerHandler = std::function<void()>;
  virtual ~TimerQueue() = default;
  virtual TimePoint Now() const = 0;
  virtual TimerId AddTimer(TimePoint deadline, TimerHandler handler) = 0;
  virtual void CancelTimer(TimerId id) = 0;
  TimerId AddTimerAfter(Duration d, TimerHandler h) { return AddTimer(Now() + d, std::move(h)); }
};

class EventLoop final : public TimerQueue {
 public:
  using FdHandler = std::function<void(uint32_t events)>;

  // Aborts the process on failure to create epoll/timerfd/eventfd (out of fds at start-up).
  EventLoop();
  ~EventLoop() override;
  EventLoop(const EventLoop&) = delete;
  EventLoop& operator=(const EventLoop&) = delete;

  // Registers fd (not owned) for `events` (EPOLLIN, EPOLLOUT, ...). One handler per fd.
  Status AddFd(int fd, uint32_t events, FdHandler handler);
  Status ModifyFd(int fd, uint32_t events);
  void RemoveFd(int fd);
  bool HasFd(int fd) const { return fds_.count(fd) != 0; }

  TimePoint Now() const override;
  TimerId AddTimer(TimePoint deadline, TimerHandler handler) override;
  void CancelTimer(TimerId id) override;

  // Waits for events (at most max_wait, or forever when empty) and dispatches them.
  // Returns the number of handlers run (fds + timers).
  int RunOnce(std::optional<Duration> max_wait = std::nullopt);
  // Runs until Stop() is called from a handler.
  void Run();
  void Stop() { stopped_ = true; }
  bool stopped() const { return stopped_; }
  // Thread-safe: interrupts a blocking RunOnce.
  void Wake();

 private:
  struct FdEntry {
    FdHandler handler;
    uint64_t generation;
  };
  void RearmTimerFd();
  int RunDueTimers();

  UniqueFd epoll_;
  UniqueFd timer_fd_;
  UniqueFd wake_fd_;
  std::unordered_map<int, FdEntry> fds_;
  uint64_t next_generation_ = 1;
  std::multimap<TimePoint, TimerId> deadlines_;
  std::unordered_map<TimerId, std::pair<std::multimap<TimePoint, TimerId>::iterator, TimerHandler>>
      timers_;
  TimerId next_timer_ = 1;
  bool stopped_ = false;
};

}  // namespace ctrun
