// ConsoleWriter: the one writer of whole lines to one of ctrun's console fds (1 or 2), shared by
// the worker-output relay and ctrun's own diagnostics (logging.h), so that nothing ever lands in
// the middle of another line.
//
// Contract:
//  - Callers append WHOLE lines to buffer() while holding Lock(), then call Commit(): lines are
//    written in append order, never interleaved with another caller's bytes, even when the fd
//    takes them in pieces.
//  - The console fd itself is never switched to O_NONBLOCK: it is shared with the shell and other
//    programs. For a TTY, FIFO or character device the writer opens a private description of the
//    same file (/proc/self/fd/N, O_NONBLOCK) and waits for EPOLLOUT on the EventLoop; the
//    buffer is bounded by the relay: over high_water() it stops reading worker pipes (workers
//    block in write(2): slowed, never killed) until OnDrained fires. For a regular file, a socket,
//    or when reopening fails, writes are blocking on the original fd (disk speed is the limit;
//    a stalled socket then stalls the loop: the documented trade-off).
//  - EPIPE/EIO (reader gone, terminal hung up): the console is marked broken and all further
//    output is discarded, so workers are never blocked by a dead console.
//  - Threads: buffer access is guarded by the mutex; Commit/EPOLLOUT handling run on the loop's
//    thread. WriteDiagnostic may be called from any thread.
#pragma once

#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "base/clock.h"
#include "base/unique_fd.h"
#include "sys/event_loop.h"

namespace ctrun::logs {

class ConsoleWriter {
 public:
  // fd is not owned. loop may be null: then every Commit writes synchronously.
  ConsoleWriter(EventLoop* loop, int fd, size_t high_water = 1 << 20);
  ~ConsoleWriter();
  ConsoleWriter(const ConsoleWriter&) = delete;
  ConsoleWriter& operator=(const ConsoleWriter&) = delete;

  int fd() const { return fd_; }
  bool is_tty() const { return tty_; }
  bool nonblocking() const { return nb_fd_.valid(); }
  bool broken() const { return broken_; }

  std::unique_lock<std::mutex> Lock() { return std::unique_lock<std::mutex>(mu_); }
  // Under Lock(): the pending bytes; append whole lines only.
  std::string& buffer() { return buf_; }
  // Under Lock(): TTY only: the last unit written ended with a bare '\r' (a progress bar is
  // showing); the next writer of a line erases it first ("\x1b[K").
  bool& line_dirty() { return line_dirty_; }

  // Under Lock(), on the loop thread: writes what it can now; arms EPOLLOUT for the rest.
  void Commit(std::unique_lock<std::mutex>& lock);
  bool over_high_water() const { return buffered() > high_water_; }
  size_t buffered() const { return buf_.size() - head_; }
  size_t high_water() const { return high_water_; }
  // Called on the loop thread when the buffer falls below high_water/2 after being above it.
  void SetOnDrained(std::function<void()> fn) { on_drained_ = std::move(fn); }

  // Writes everything out, waiting (poll) at most until deadline. True when empty.
  bool Drain(TimePoint deadline);
  // One line from ctrun itself (no trailing newline needed); any thread.
  void WriteDiagnostic(std::string_view line);

 private:
  // Under mu_: one write attempt of the pending bytes (all of them when blocking).
  void WriteSomeLocked();
  void UpdateEpollLocked();
  void OnWritable();
  int out_fd() const { return nb_fd_.valid() ? nb_fd_.get() : fd_; }

  EventLoop* loop_;
  int fd_;
  UniqueFd nb_fd_;  // private O_NONBLOCK description of fd_, or invalid (blocking mode)
  bool tty_ = false;
  size_t high_water_;
  std::thread::id loop_thread_;

  std::mutex mu_;
  std::string buf_;   // pending bytes are buf_[head_..]
  size_t head_ = 0;
  bool line_dirty_ = false;
  bool broken_ = false;
  bool armed_ = false;     // EPOLLOUT registered
  bool was_high_ = false;  // went over high water; on_drained_ owed
  std::function<void()> on_drained_;
};

}  // namespace ctrun::logs
