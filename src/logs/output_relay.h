// OutputRelay: copies workers' piped stdout/stderr to ctrun's console (prefixed, whole lines)
// and/or to per-rank log files (raw bytes), on the agent's EventLoop. No threads, no tailing.
//
// Contract:
//  - Each stream is read non-blocking, at most read_size bytes per readiness event (fair across
//    ranks), cut into units by a LineSplitter, and every console unit is written as one whole
//    prefixed line through a ConsoleWriter: lines of different ranks are never split or merged.
//    Per-stream order is kept; order across ranks is arrival order.
//  - A partial last line is emitted at EOF (worker exit, crash, SIGKILL): nothing is lost.
//  - '\r' progress updates are their own units. On a TTY: an update is drawn as
//    "prefix text\r", the next line from anyone first erases it ("\x1b[K"), and a burst of
//    updates from one read is coalesced to the last one; empty updates are dropped. Elsewhere a
//    bare '\r' becomes '\n' (each update one prefixed line; line tools see one rank per line).
//    On a TTY a partial line still pending after pending_show is drawn as a transient status
//    line (erased by the next line), so the current progress bar is visible at once.
//  - Lines over max_line are taken in max_line pieces (memory per stream is bounded). Off a TTY
//    the pieces are written with nothing added while nothing else comes between them, so the
//    console gets the worker's bytes; whatever comes between (another stream's unit, a
//    diagnostic) first ends the open piece with the cut mark ("\\" newline), and the next piece
//    starts a prefixed line. On a TTY every piece ends with the mark.
//  - Back-pressure: when a console buffer is over its high water mark, the streams feeding it are
//    removed from the loop (their workers block in write(2)) until it drains. Memory stays under
//    high_water + read_size * (1 + prefix/line) per console.
//  - The file sink receives exactly the bytes the worker wrote (like torchrun's files).
//  - A stream may be a pty master instead of a pipe (StdioTarget::kPty): read alike; its EIO
//    (every slave closed) is its end of file, after everything buffered has been read.
//  - With a duplicate sink (--duplicate-*-filters) the stream's matching lines are also copied
//    to the shared filtered file (logs/duplicate_filter.h), prefixed, whatever the other sinks.
//  - The last stderr_tail_bytes of every relayed stderr stream are kept for the failure
//    summary (StderrTail), and survive the stream's EOF until the rank's next AddStream.
//  - Not thread-safe (loop thread only); callbacks run on the loop thread.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "logs/console_writer.h"
#include "logs/duplicate_filter.h"
#include "logs/line_splitter.h"
#include "sys/event_loop.h"

namespace ctrun::logs {

enum class Stream { kStdout = 0, kStderr = 1 };

struct ConsoleOptions {
  int stdout_fd = 1;
  int stderr_fd = 2;
  enum class Color { kAuto, kAlways, kNever };
  Color color = Color::kAuto;  // kAuto: on a TTY, unless NO_COLOR is set or TERM=dumb
  size_t high_water = 1 << 20;      // per console buffer
  size_t read_size = 256 << 10;     // max bytes per read(2)
  size_t max_line = 64 << 10;       // longer lines are cut
  // F_SETPIPE_SZ on each read end (0: leave as is). A large pipe lets a worker keep writing while
  // the relay is busy with other ranks (fewer blocked writers, wake-ups and context switches:
  // 8 x 200 MB bench, relay sys time 1.1 s -> 0.8 s with 1 MiB instead of 256 KiB). Pipe memory
  // counts against the user's pipe-user-pages-soft (64 MiB by default; over it new pipes get 2
  // pages), so streams get pipe_size only while the relay's pipes total at most pipe_budget,
  // and pipe_size_over_budget after that.
  size_t pipe_size = 1 << 20;
  size_t pipe_budget = 16 << 20;
  size_t pipe_size_over_budget = 256 << 10;
  size_t stderr_tail_bytes = 8192;
  int stderr_tail_lines = 20;
  bool route_diagnostics = false;   // send ctrun's spdlog output through the stderr writer
  Duration pending_show = std::chrono::milliseconds(50);  // TTY only, see above
};

struct Sinks {
  bool console = false;
  std::string prefix;  // plain text (PrefixFormat::Render); coloured here when the console is
  int color_key = 0;   // the global rank: picks the colour
  UniqueFd file;       // raw copy (tee); opened by the agent (O_WRONLY|O_CREAT|O_TRUNC|O_CLOEXEC)
  std::shared_ptr<DuplicateFile> duplicate;  // matching lines, prefixed; null: none
  std::string duplicate_prefix;              // plain prefix for the duplicate file
};

class OutputRelay {
 public:
  OutputRelay(EventLoop& loop, ConsoleOptions options = {});
  ~OutputRelay();  // unregisters everything; does not drain (call FlushAll first)
  OutputRelay(const OutputRelay&) = delete;
  OutputRelay& operator=(const OutputRelay&) = delete;

  // Takes the read end of a worker's pipe. A still-open stream of the same rank and kind (the
  // previous attempt's) is read first, as far as it holds bytes now (bounded), then closed: none
  // of a crashed worker's last words is lost at a restart. Adding stderr resets that rank's
  // StderrTail.
  Status AddStream(int local_rank, Stream stream, UniqueFd read_end, Sinks sinks);

  // Called on every read that got bytes from one of the rank's streams (hang detection's
  // "output seen"; must be cheap).
  void SetOnOutput(std::function<void(int local_rank)> fn) { on_output_ = std::move(fn); }
  // Called once per rank when the last of its added streams reaches EOF.
  void SetOnWorkerDrained(std::function<void(int local_rank)> fn) { on_drained_ = std::move(fn); }
  bool WorkerDrained(int local_rank) const;  // true when the rank has no open stream

  // Reads what the rank's streams hold now, as the loop would (up to EOF, which closes the stream,
  // or EAGAIN; stopping at the console's high water): for a worker that has just exited, whose
  // every write is in its pipes already, so that its last lines reach the console before ctrun's
  // words about its exit.
  void CatchUp(int local_rank);
  // Shutdown: reads all streams to EOF until `deadline` at most (streams still open then, held by
  // an escaped descendant, are dropped), then writes everything read to the consoles, waiting as
  // long as their readers take (a slow pipe reader or a paused terminal loses nothing, as workers
  // writing there directly would not), unless `interrupt` (ctrun's signalfd; -1 none) becomes
  // readable, `console_deadline` passes (a run that a signal already stopped: the reader may be
  // what stalled it) or a console breaks. What is still unwritten then is given up, so that
  // ctrun's next lines go out first. Returns the bytes given up or discarded since the start.
  // Runs its own poll(), not the EventLoop.
  size_t FlushAll(TimePoint deadline, int interrupt = -1, TimePoint console_deadline = TimePoint::max());
  // No open stream and nothing buffered for the console.
  bool Idle() const;

  // Last lines of the rank's relayed stderr; if none was relayed and fallback_file is given
  // (stderr went straight to a file), the file's tail.
  std::string StderrTail(int local_rank, const std::string& fallback_file = "") const;

  ConsoleWriter& stdout_console() { return *out_; }
  ConsoleWriter& stderr_console() { return err_ ? *err_ : *out_; }
  bool console_is_tty() const { return out_->is_tty(); }

 private:
  struct StreamState;
  void OnReadable(StreamState& s);
  void ShowPending(int local_rank, Stream stream);
  void Process(StreamState& s, std::string_view data);
  void Close(StreamState& s, bool notify);
  // Reads what the stream holds now (bounded, never blocks), then closes it without notifying.
  void DrainAndClose(StreamState& s);
  void PauseFor(ConsoleWriter* w);
  void ResumeFor(ConsoleWriter* w);
  bool ReadOnce(StreamState& s);  // false at EOF/error (stream closed)
  StreamState* Find(int local_rank, Stream stream);

  EventLoop& loop_;
  ConsoleOptions opt_;
  std::unique_ptr<ConsoleWriter> out_;
  std::unique_ptr<ConsoleWriter> err_;  // null when fd 2 is the same file as fd 1
  bool color_ = false;
  std::map<std::pair<int, int>, std::unique_ptr<StreamState>> streams_;  // (rank, stream), open
  std::map<int, std::string> tails_;  // local rank -> last stderr bytes
  // One read's buffer. Not value-initialised: zero-filling 256 KiB touched 64 pages at every
  // start; untouched, the kernel maps them only when a read first fills them.
  std::unique_ptr<char[]> scratch_;
  size_t scratch_size_ = 0;
  size_t pipe_bytes_ = 0;  // sum of the open streams' pipe sizes (after F_SETPIPE_SZ)
  std::function<void(int)> on_drained_;
  std::function<void(int)> on_output_;
};

}  // namespace ctrun::logs
