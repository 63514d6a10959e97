// ConsoleWriter: the one writer of whole lines to one of ctrun's console fds (1 or 2), shared by
// the worker-output relay and ctrun's own diagnostics (logging.h), so that nothing ever lands in
// the middle of another line.
//
// Contract:
//  - Callers append WHOLE lines to buffer() while holding Lock(), then call Commit() (the one
//    exception, a cut piece of a long line, is open_cut()'s, and the next writer closes it): lines are
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
//    output is discarded, so workers are never blocked by a dead console; dropped() counts it.
//  - Threads: buffer access is guarded by the mutex; Commit/EPOLLOUT handling run on the loop's
//    thread. WriteDiagnostic may be called from any thread.
#pragma once

#include <cerrno>

#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "base/clock.h"
#include "base/unique_fd.h"
#include "sys/event_loop.h"

namespace ctrun::logs {

// What ends a piece of a worker line over the relay's limit when something else comes between its
// pieces (and every piece on a terminal): a backslash, then the newline.
inline constexpr std::string_view kCutMark = "\\\n";

// The console's pending bytes: a plain growable byte array. Unlike std::string it can hand out
// uninitialised room at its end (Room/Grow), so the relay's hot loop renders lines with raw
// memcpy and one capacity check per line, without zero-filling or per-append checks.
class OutBuffer {
 public:
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const char* data() const { return p_.get(); }
  void clear() { size_ = 0; }
  // At least n writable bytes after size(); write them, then Grow(k) with k <= n.
  char* Room(size_t n) {
    if (cap_ - size_ < n) Reallocate(n);
    return p_.get() + size_;
  }
  void Grow(size_t k) { size_ += k; }
  void append(const char* s, size_t n) {
    if (n == 0) return;
    std::memcpy(Room(n), s, n);
    size_ += n;
  }
  void append(std::string_view s) { append(s.data(), s.size()); }
  OutBuffer& operator+=(std::string_view s) {
    append(s);
    return *this;
  }
  void push_back(char c) {
    *Room(1) = c;
    ++size_;
  }
  void erase_front(size_t n) {
    std::memmove(p_.get(), p_.get() + n, size_ - n);
    size_ -= n;
  }
  std::string_view view() const { return std::string_view(p_.get(), size_); }

 private:
  void Reallocate(size_t n) {
    size_t cap = cap_ < 4096 ? 4096 : cap_;
    while (cap - size_ < n) cap *= 2;
    std::unique_ptr<char[]> p(new char[cap]);
    if (size_ > 0) std::memcpy(p.get(), p_.get(), size_);
    p_ = std::move(p);
    cap_ = cap;
  }
  std::unique_ptr<char[]> p_;
  size_t size_ = 0;
  size_t cap_ = 0;
};

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
  // Broken because its reader went away (EPIPE): a writer there would get EPIPE/SIGPIPE itself.
  bool reader_gone() const { return broken_ && broken_errno_ == EPIPE; }

  std::unique_lock<std::mutex> Lock() { return std::unique_lock<std::mutex>(mu_); }
  // Under Lock(): the pending bytes; append whole lines only.
  OutBuffer& buffer() { return buf_; }
  // Under Lock(): TTY only: the last unit written ended with a bare '\r' (a progress bar is
  // showing); the next writer of a line erases it first ("\x1b[K").
  bool& line_dirty() { return line_dirty_; }
  // Under Lock(): not a TTY only: the stream (an opaque owner) whose line over max_line was cut
  // and whose last piece went out without an end, so that its next piece continues it byte for
  // byte; null when none. Whatever else is written first closes it with kCutMark.
  const void*& open_cut() { return open_cut_; }

  // Under Lock(), on the loop thread: writes what it can now; arms EPOLLOUT for the rest.
  void Commit(std::unique_lock<std::mutex>& lock);
  bool over_high_water() const { return buffered() > high_water_; }
  size_t buffered() const { return buf_.size() - head_; }
  size_t high_water() const { return high_water_; }
  // Called on the loop thread when the buffer falls below high_water/2 after being above it.
  void SetOnDrained(std::function<void()> fn) { on_drained_ = std::move(fn); }

  // Writes everything out, waiting (poll) at most until deadline, or until `interrupt` (an fd,
  // say ctrun's signalfd; -1 none) is readable. True when empty.
  bool Drain(TimePoint deadline, int interrupt = -1);
  // Gives up on the pending bytes (the wait for this console was cut short): they count as
  // dropped(), and what is written next starts a line of its own, even when the last write ended
  // in the middle of one. Any thread.
  void Abandon();
  // Bytes discarded because the console broke (see the contract) or were abandoned, so that the
  // end of the run can say so. Under Lock(), or once no other thread writes.
  size_t dropped() const { return dropped_; }
  // One line from ctrun itself (no trailing newline needed); any thread.
  void WriteDiagnostic(std::string_view line);

 private:
  // Under mu_: one write attempt of the pending bytes (all of them when blocking).
  void WriteSomeLocked();
  // Under mu_: drops the pending bytes, counted in dropped_ (an owed newline is not).
  void DiscardPendingLocked();
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
  OutBuffer buf_;     // pending bytes are buf_[head_..]
  size_t head_ = 0;
  bool line_dirty_ = false;
  const void* open_cut_ = nullptr;
  bool broken_ = false;
  int broken_errno_ = 0;  // the write error that broke it
  size_t dropped_ = 0;     // discarded because broken_, or abandoned
  bool written_mid_line_ = false;  // the last byte written was not a newline
  bool newline_owed_ = false;      // buf_ starts with a newline Abandon put there (see Abandon)
  bool armed_ = false;     // EPOLLOUT registered
  bool was_high_ = false;  // went over high water; on_drained_ owed
  std::function<void()> on_drained_;
};

}  // namespace ctrun::logs
