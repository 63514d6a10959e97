#include "logs/console_writer.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>

#include "sys/posix_util.h"

namespace ctrun::logs {

ConsoleWriter::ConsoleWriter(EventLoop* loop, int fd, size_t high_water)
    : loop_(loop), fd_(fd), high_water_(high_water), loop_thread_(std::this_thread::get_id()) {
  tty_ = ::isatty(fd) == 1;
  struct stat st {};
  if (loop_ != nullptr && ::fstat(fd, &st) == 0 && (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode))) {
    // A new open file description: O_NONBLOCK on it does not touch the shell's terminal.
    std::string path = "/proc/self/fd/" + std::to_string(fd);
    nb_fd_.reset(RetryOnEintr(
        [&] { return ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY); }));
  }
}

ConsoleWriter::~ConsoleWriter() {
  if (armed_ && loop_ != nullptr) loop_->RemoveFd(nb_fd_.get());
}

void ConsoleWriter::WriteSomeLocked() {
  if (broken_) {
    DiscardPendingLocked();
    return;
  }
  while (head_ < buf_.size()) {
    ssize_t n = RetryOnEintr([&] { return ::write(out_fd(), buf_.data() + head_, buf_.size() - head_); });
    if (n > 0) {
      head_ += static_cast<size_t>(n);  // short write: try again (non-blocking: until EAGAIN)
      written_mid_line_ = buf_.data()[head_ - 1] != '\n';
      newline_owed_ = false;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    broken_ = true;  // EPIPE, EIO, ENOSPC...: discard from now on rather than block workers
    broken_errno_ = errno;
    DiscardPendingLocked();
    return;
  }
  if (head_ == buf_.size()) {
    buf_.clear();
    head_ = 0;
  } else if (head_ > (1u << 20) && head_ * 2 > buf_.size()) {
    buf_.erase_front(head_);
    head_ = 0;
  }
}

void ConsoleWriter::DiscardPendingLocked() {
  dropped_ += buffered() - (newline_owed_ ? 1 : 0);  // an owed newline is ctrun's, not output
  newline_owed_ = false;
  buf_.clear();
  head_ = 0;
}

void ConsoleWriter::UpdateEpollLocked() {
  if (loop_ == nullptr || !nb_fd_.valid()) return;
  bool want = buffered() > 0;
  if (want == armed_) return;
  if (want) {
    armed_ = loop_->AddFd(nb_fd_.get(), EPOLLOUT, [this](uint32_t) { OnWritable(); }).ok();
  } else {
    loop_->RemoveFd(nb_fd_.get());
    armed_ = false;
  }
}

void ConsoleWriter::Commit(std::unique_lock<std::mutex>& lock) {
  (void)lock;
  WriteSomeLocked();
  if (over_high_water()) was_high_ = true;
  UpdateEpollLocked();
}

void ConsoleWriter::OnWritable() {
  std::function<void()> notify;
  {
    auto lock = Lock();
    WriteSomeLocked();
    UpdateEpollLocked();
    if (was_high_ && buffered() <= high_water_ / 2) {
      was_high_ = false;
      notify = on_drained_;
    }
  }
  if (notify) notify();
}

bool ConsoleWriter::Drain(TimePoint deadline, int interrupt) {
  std::function<void()> notify;
  bool empty;
  {
    auto lock = Lock();
    for (;;) {
      WriteSomeLocked();
      if (buffered() == 0) break;
      auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p[2] = {{out_fd(), POLLOUT, 0}, {interrupt, POLLIN, 0}};
      const int wait_ms = static_cast<int>(std::min<std::chrono::milliseconds::rep>(left.count(), 60'000));
      RetryOnEintr([&] { return ::poll(p, interrupt >= 0 ? 2 : 1, wait_ms); });
      if (interrupt >= 0 && (p[1].revents & POLLIN) != 0) break;
    }
    empty = buffered() == 0;
    if (std::this_thread::get_id() == loop_thread_) UpdateEpollLocked();
    if (was_high_ && buffered() <= high_water_ / 2) {
      was_high_ = false;
      notify = on_drained_;
    }
  }
  if (notify && std::this_thread::get_id() == loop_thread_) notify();
  return empty;
}

void ConsoleWriter::Abandon() {
  auto lock = Lock();
  if (buffered() == 0) return;
  DiscardPendingLocked();
  line_dirty_ = false;
  open_cut_ = nullptr;  // its piece is cut short below; the next worker piece starts a line of its own
  // The console's last line was cut short: a newline ends that piece first, so the next line
  // (ctrun's note of the loss, say) is not glued to it. Owed until written, across Abandons.
  newline_owed_ = written_mid_line_;
  if (newline_owed_) buf_.push_back('\n');
  WriteSomeLocked();
  if (std::this_thread::get_id() == loop_thread_) UpdateEpollLocked();
}

void ConsoleWriter::WriteDiagnostic(std::string_view line) {
  auto lock = Lock();
  if (broken_) return;
  bool was_empty = buffered() == 0;
  if (tty_ && line_dirty_) {
    buf_ += "\r\x1b[K";  // erase a progress bar left by a '\r' unit
    line_dirty_ = false;
  }
  if (open_cut_ != nullptr) {
    buf_.append(kCutMark);  // a worker's cut line was open: closed as the relay closes it
    open_cut_ = nullptr;
  }
  buf_.append(line);
  if (line.empty() || line.back() != '\n') buf_.push_back('\n');
  if (!was_empty) return;  // queued behind worker lines; EPOLLOUT is armed already
  WriteSomeLocked();
  if (buffered() == 0) return;
  if (std::this_thread::get_id() == loop_thread_) {
    UpdateEpollLocked();
    return;
  }
  // Another thread: wait (bounded) for the console rather than touch the loop.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (buffered() > 0 && !broken_ && std::chrono::steady_clock::now() < deadline) {
    pollfd p{out_fd(), POLLOUT, 0};
    RetryOnEintr([&] { return ::poll(&p, 1, 100); });
    WriteSomeLocked();
  }
}

}  // namespace ctrun::logs
