#include "agent/stdin_forwarder.h"

#include <fcntl.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "sys/posix_util.h"

namespace ctrun {

std::unique_ptr<StdinForwarder> StdinForwarder::Create(EventLoop& loop, int stdin_fd) {
  if (!::isatty(stdin_fd)) return nullptr;
  const std::string self = "/proc/self/fd/" + std::to_string(stdin_fd);
  UniqueFd in(RetryOnEintr([&] { return ::open(self.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC); }));
  if (!in) return nullptr;
  return std::unique_ptr<StdinForwarder>(new StdinForwarder(loop, std::move(in)));
}

StdinForwarder::~StdinForwarder() {
  if (in_watched_) loop_.RemoveFd(in_.get());
  if (out_watched_) loop_.RemoveFd(target_.get());
}

void StdinForwarder::SetTarget(UniqueFd write_end) {
  ClearTarget();
  target_ = std::move(write_end);
  Update();
}

void StdinForwarder::ClearTarget() {
  if (out_watched_) loop_.RemoveFd(target_.get());
  out_watched_ = false;
  target_.reset();
  pending_.clear();
  Update();
}

void StdinForwarder::OnContinued() {
  background_ = false;
  Update();
}

namespace {
// Adds or removes fd's watch so that it matches `want`.
void Watch(EventLoop& loop, int fd, uint32_t events, bool want, bool* watched, EventLoop::FdHandler handler) {
  if (want == *watched) return;
  if (want) {
    *watched = loop.AddFd(fd, events, std::move(handler)).ok();
  } else {
    loop.RemoveFd(fd);
    *watched = false;
  }
}
}  // namespace

void StdinForwarder::Update() {
  const bool want_in = target_ && pending_.empty();
  const bool want_out = target_ && !pending_.empty();
  // In the background the terminal is watched edge-triggered: input for the shell wakes ctrun
  // once per arrival (a level-triggered watch would spin while it waits to be read by another).
  const uint32_t in_events = background_ ? EPOLLIN | EPOLLET : EPOLLIN;
  if (in_watched_ && in_events != in_events_) Watch(loop_, in_.get(), 0, false, &in_watched_, nullptr);
  in_events_ = in_events;
  Watch(loop_, in_.get(), in_events, want_in, &in_watched_, [this](uint32_t) { OnInput(); });
  Watch(loop_, target_.get(), EPOLLOUT, want_out, &out_watched_, [this](uint32_t) { OnTargetWritable(); });
}

void StdinForwarder::OnInput() {
  if (background_) {
    // `fg` gives ctrun the terminal without a SIGCONT when it was running in the background
    // (started with &, or after bg): the first input after that finds it in the foreground.
    if (::tcgetpgrp(in_.get()) != ::getpgrp()) return;
    background_ = false;
    Update();  // level-triggered again: fires at once for the input waiting
    return;
  }
  char buf[4096];
  ssize_t n = RetryOnEintr([&] { return ::read(in_.get(), buf, sizeof buf); });
  if (n > 0) {
    pending_.assign(buf, static_cast<size_t>(n));
    if (!Flush()) return;  // ClearTarget updated the watches
  } else if (n == 0) {
    ClearTarget();  // rank 0 reads end of file
    return;
  } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
    background_ = true;  // EIO: ctrun is in the background (see OnInput and OnContinued)
  }
  Update();
}

void StdinForwarder::OnTargetWritable() {
  if (Flush()) Update();
}

bool StdinForwarder::Flush() {
  while (!pending_.empty()) {
    ssize_t n = RetryOnEintr([&] { return ::write(target_.get(), pending_.data(), pending_.size()); });
    if (n > 0) {
      pending_.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
    ClearTarget();  // EPIPE: rank 0 closed its stdin or is gone
    return false;
  }
  return true;
}

}  // namespace ctrun
