#include "sys/event_loop.h"

#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "sys/posix_util.h"

namespace ctrun {
namespace {

// The epoll user data packs the fd (low 32 bits) with the registration generation (high 32),
// so events for an fd that was removed and re-added in the same batch are not misdelivered.
constexpr int kTimerTag = -2;
constexpr int kWakeTag = -3;

uint64_t Pack(int fd, uint64_t gen) { return (gen << 32) | static_cast<uint32_t>(fd); }

[[noreturn]] void Die(const char* what) {
  std::perror(what);
  std::abort();
}

}  // namespace

EventLoop::EventLoop() {
  epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_) Die("ctrun: epoll_create1");
  timer_fd_.reset(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!timer_fd_) Die("ctrun: timerfd_create");
  wake_fd_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_) Die("ctrun: eventfd");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = Pack(kTimerTag, 0);
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, timer_fd_.get(), &ev) != 0) Die("ctrun: epoll_ctl");
  ev.data.u64 = Pack(kWakeTag, 0);
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_fd_.get(), &ev) != 0) Die("ctrun: epoll_ctl");
}

EventLoop::~EventLoop() = default;

Status EventLoop::AddFd(int fd, uint32_t events, FdHandler handler) {
  if (fds_.count(fd)) return Status::Error("fd already registered");
  uint64_t gen = next_generation_++ & 0xffffffffu;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = Pack(fd, gen);
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) return Status::Errno("epoll_ctl ADD", errno);
  fds_.emplace(fd, FdEntry{std::move(handler), gen});
  return Status::Ok();
}

Status EventLoop::ModifyFd(int fd, uint32_t events) {
  auto it = fds_.find(fd);
  if (it == fds_.end()) return Status::Error("fd not registered");
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = Pack(fd, it->second.generation);
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, fd, &ev) != 0) return Status::Errno("epoll_ctl MOD", errno);
  return Status::Ok();
}

void EventLoop::RemoveFd(int fd) {
  auto it = fds_.find(fd);
  if (it == fds_.end()) return;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
  fds_.erase(it);
}

TimePoint EventLoop::Now() const { return std::chrono::steady_clock::now(); }

TimerQueue::TimerId EventLoop::AddTimer(TimePoint deadline, TimerHandler handler) {
  TimerId id = next_timer_++;
  auto it = deadlines_.emplace(deadline, id);
  timers_.emplace(id, std::make_pair(it, std::move(handler)));
  if (it == deadlines_.begin()) RearmTimerFd();
  return id;
}

void EventLoop::CancelTimer(TimerId id) {
  auto it = timers_.find(id);
  if (it == timers_.end()) return;
  bool was_first = it->second.first == deadlines_.begin();
  deadlines_.erase(it->second.first);
  timers_.erase(it);
  if (was_first) RearmTimerFd();
}

void EventLoop::RearmTimerFd() {
  itimerspec spec{};
  if (!deadlines_.empty()) {
    auto ns = deadlines_.begin()->first.time_since_epoch().count();
    if (ns <= 0) ns = 1;  // 0 would disarm
    spec.it_value.tv_sec = ns / 1000000000;
    spec.it_value.tv_nsec = ns % 1000000000;
  }
  // steady_clock is CLOCK_MONOTONIC on Linux, so its epoch matches the timerfd's.
  ::timerfd_settime(timer_fd_.get(), TFD_TIMER_ABSTIME, &spec, nullptr);
}

int EventLoop::RunDueTimers() {
  int ran = 0;
  TimePoint now = Now();
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    TimerId id = deadlines_.begin()->second;
    auto it = timers_.find(id);
    TimerHandler h = std::move(it->second.second);
    deadlines_.erase(deadlines_.begin());
    timers_.erase(it);
    h();
    ++ran;
  }
  RearmTimerFd();
  return ran;
}

int EventLoop::RunOnce(std::optional<Duration> max_wait) {
  int timeout_ms = -1;
  if (max_wait) {
    auto ms = std::chrono::ceil<std::chrono::milliseconds>(*max_wait).count();
    timeout_ms = ms < 0 ? 0 : static_cast<int>(ms);
  }
  epoll_event events[64];
  int n = RetryOnEintr([&] { return ::epoll_wait(epoll_.get(), events, 64, timeout_ms); });
  if (n < 0) return 0;
  int ran = 0;
  bool timers_due = false;
  for (int i = 0; i < n; ++i) {
    int fd = static_cast<int>(static_cast<uint32_t>(events[i].data.u64));
    uint64_t gen = events[i].data.u64 >> 32;
    if (fd == kTimerTag) {
      uint64_t expirations;
      (void)!::read(timer_fd_.get(), &expirations, sizeof expirations);
      timers_due = true;
      continue;
    }
    if (fd == kWakeTag) {
      uint64_t v;
      (void)!::read(wake_fd_.get(), &v, sizeof v);
      continue;
    }
    auto it = fds_.find(fd);
    if (it == fds_.end() || it->second.generation != gen) continue;  // removed meanwhile
    // Copy: the handler may remove itself (and destroy the std::function) while running.
    FdHandler h = it->second.handler;
    h(events[i].events);
    ++ran;
  }
  if (timers_due || (!deadlines_.empty() && deadlines_.begin()->first <= Now())) ran += RunDueTimers();
  return ran;
}

void EventLoop::Run() {
  stopped_ = false;
  while (!stopped_) RunOnce();
}

void EventLoop::Wake() {
  uint64_t one = 1;
  (void)!::write(wake_fd_.get(), &one, sizeof one);
}

}  // namespace ctrun
