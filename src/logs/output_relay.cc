#include "logs/output_relay.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "logs/log_dir.h"
#include "logs/logging.h"
#include "logs/prefix.h"
#include "sys/posix_util.h"

namespace ctrun::logs {

struct OutputRelay::StreamState {
  int local_rank;
  Stream stream;
  UniqueFd fd;
  UniqueFd file;
  ConsoleWriter* writer = nullptr;  // null: no console sink
  std::string prefix;               // coloured when the console is
  LineSplitter splitter;
  std::optional<DuplicateTap> tap;  // --duplicate-*-filters
  bool registered = false;          // in the EventLoop (false while paused)
  size_t pipe_bytes = 0;            // counted in OutputRelay::pipe_bytes_
  std::optional<TimerQueue::TimerId> show_timer;  // TTY: draws the pending partial line
  StreamState(size_t max_line) : splitter(max_line) {}
};

namespace {

bool SameFile(int a, int b) {
  if (a == b) return true;
  struct stat sa {}, sb {};
  if (::fstat(a, &sa) != 0 || ::fstat(b, &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino && sa.st_rdev == sb.st_rdev;
}

bool ColorWanted(ConsoleOptions::Color c, bool tty) {
  if (c == ConsoleOptions::Color::kAlways) return true;
  if (c == ConsoleOptions::Color::kNever || !tty) return false;
  const char* no_color = std::getenv("NO_COLOR");
  const char* term = std::getenv("TERM");
  if (no_color != nullptr && *no_color != '\0') return false;
  return term == nullptr || std::strcmp(term, "dumb") != 0;
}

// memcpy for the short pieces of a console line (prefixes, typical log lines): inline overlapping
// 16/8/4-byte moves instead of a library call per piece.
inline __attribute__((always_inline)) char* CopyShort(char* o, const char* src, size_t n) {
  if (n > 128) {
    std::memcpy(o, src, n);
  } else if (n >= 16) {
    uint64_t a, b;
    for (size_t i = 0; i + 16 <= n; i += 16) {
      std::memcpy(&a, src + i, 8);
      std::memcpy(&b, src + i + 8, 8);
      std::memcpy(o + i, &a, 8);
      std::memcpy(o + i + 8, &b, 8);
    }
    std::memcpy(&a, src + n - 16, 8);
    std::memcpy(&b, src + n - 8, 8);
    std::memcpy(o + n - 16, &a, 8);
    std::memcpy(o + n - 8, &b, 8);
  } else if (n >= 8) {
    uint64_t a, b;
    std::memcpy(&a, src, 8);
    std::memcpy(&b, src + n - 8, 8);
    std::memcpy(o, &a, 8);
    std::memcpy(o + n - 8, &b, 8);
  } else if (n >= 4) {
    uint32_t a, b;
    std::memcpy(&a, src, 4);
    std::memcpy(&b, src + n - 4, 4);
    std::memcpy(o, &a, 4);
    std::memcpy(o + n - 4, &b, 4);
  } else {
    for (size_t i = 0; i < n; ++i) o[i] = src[i];
  }
  return o + n;
}

// The console state one unit is rendered against (ConsoleWriter's, under its lock), and the
// stream rendering it.
struct RenderTarget {
  OutBuffer& b;
  bool& dirty;          // a TTY progress bar is showing (cursor at col 0)
  const void*& open;    // not a TTY: the stream whose cut line is open (ConsoleWriter::open_cut)
  bool tty;
  const void* self;
};

// Appends one unit as a console line. Off a TTY a line over max_line goes out piece after piece
// with nothing added, byte for byte as the worker wrote it, as long as nothing else comes between
// its pieces; whatever does first closes the open piece with kCutMark, and the
// next piece then starts a prefixed line of its own. On a TTY every cut piece carries the mark.
// The relay's hot loop (once per line): one capacity check, then raw copies.
inline __attribute__((always_inline)) void Render(const RenderTarget& t, std::string_view prefix, const LineUnit& u) {
  if (u.end == LineEnd::kReturn && u.text.empty()) return;
  char* const start = t.b.Room(3 + 2 + prefix.size() + u.text.size() + 2);
  char* o = start;
  if (t.dirty) {
    std::memcpy(o, "\x1b[K", 3);
    o += 3;
    t.dirty = false;
  }
  const bool continues = t.open == t.self && u.continuation;
  if (t.open != nullptr && !continues) o = CopyShort(o, kCutMark.data(), kCutMark.size());
  t.open = nullptr;
  if (!continues) o = CopyShort(o, prefix.data(), prefix.size());
  o = CopyShort(o, u.text.data(), u.text.size());
  switch (u.end) {
    case LineEnd::kNewline:
    case LineEnd::kEof:
      *o++ = '\n';
      break;
    case LineEnd::kCut:
      if (t.tty) {
        o = CopyShort(o, kCutMark.data(), kCutMark.size());
      } else {
        t.open = t.self;
      }
      break;
    case LineEnd::kReturn:
      if (t.tty) {
        *o++ = '\r';
        t.dirty = true;
      } else {
        *o++ = '\n';
      }
      break;
  }
  t.b.Grow(static_cast<size_t>(o - start));
}

// Under w's lock; `stream`: the stream's identity (its state's address).
RenderTarget TargetOf(ConsoleWriter& w, const void* stream) {
  return RenderTarget{w.buffer(), w.line_dirty(), w.open_cut(), w.is_tty(), stream};
}

}  // namespace

OutputRelay::OutputRelay(EventLoop& loop, ConsoleOptions options)
    : loop_(loop),
      opt_(options),
      scratch_size_(options.read_size < 4096 ? 4096 : options.read_size) {
  scratch_.reset(new char[scratch_size_]);
  out_ = std::make_unique<ConsoleWriter>(&loop_, opt_.stdout_fd, opt_.high_water);
  if (!SameFile(opt_.stdout_fd, opt_.stderr_fd)) {
    err_ = std::make_unique<ConsoleWriter>(&loop_, opt_.stderr_fd, opt_.high_water);
  }
  color_ = ColorWanted(opt_.color, out_->is_tty());
  out_->SetOnDrained([this] { ResumeFor(out_.get()); });
  if (err_) err_->SetOnDrained([this] { ResumeFor(err_.get()); });
  if (opt_.route_diagnostics) RouteDiagnostics(&stderr_console());
}

OutputRelay::~OutputRelay() {
  if (opt_.route_diagnostics) UnrouteDiagnostics(&stderr_console());
  for (auto& [key, s] : streams_) {
    if (s->registered) loop_.RemoveFd(s->fd.get());
    if (s->show_timer) loop_.CancelTimer(*s->show_timer);
  }
}

OutputRelay::StreamState* OutputRelay::Find(int local_rank, Stream stream) {
  auto it = streams_.find({local_rank, static_cast<int>(stream)});
  return it == streams_.end() ? nullptr : it->second.get();
}

Status OutputRelay::AddStream(int local_rank, Stream stream, UniqueFd read_end, Sinks sinks) {
  if (!read_end) return Status::Error("AddStream: invalid fd");
  // The previous attempt's stream, still open: its worker is gone, but its last words may still
  // be in the pipe (paused behind a slow console, or the restart came in the same loop turn).
  if (StreamState* old = Find(local_rank, stream)) DrainAndClose(*old);
  if (!SetNonBlocking(read_end.get(), true)) return Status::Errno("fcntl O_NONBLOCK", errno);
  auto s = std::make_unique<StreamState>(opt_.max_line);
  struct stat fd_stat {};
  const bool is_pipe = ::fstat(read_end.get(), &fd_stat) == 0 && S_ISFIFO(fd_stat.st_mode);  // not a pty master
  if (opt_.pipe_size > 0 && is_pipe) {
    size_t want = pipe_bytes_ + opt_.pipe_size <= opt_.pipe_budget ? opt_.pipe_size : opt_.pipe_size_over_budget;
    int got = want > 0 ? ::fcntl(read_end.get(), F_SETPIPE_SZ, static_cast<int>(want)) : -1;
    if (got < 0 && want > opt_.pipe_size_over_budget && opt_.pipe_size_over_budget > 0) {
      // e.g. over /proc/sys/fs/pipe-max-size or the user's pipe limits
      got = ::fcntl(read_end.get(), F_SETPIPE_SZ, static_cast<int>(opt_.pipe_size_over_budget));
    }
    if (got < 0) got = ::fcntl(read_end.get(), F_GETPIPE_SZ);
    s->pipe_bytes = got > 0 ? static_cast<size_t>(got) : 0;
    pipe_bytes_ += s->pipe_bytes;
  }
  s->local_rank = local_rank;
  s->stream = stream;
  s->fd = std::move(read_end);
  s->file = std::move(sinks.file);
  if (sinks.duplicate) s->tap.emplace(std::move(sinks.duplicate), std::move(sinks.duplicate_prefix), opt_.max_line);
  if (sinks.console) {
    s->writer = stream == Stream::kStdout ? out_.get() : &stderr_console();
    s->prefix = color_ && s->writer->is_tty() ? ColorizePrefix(sinks.prefix, sinks.color_key) : sinks.prefix;
  }
  if (stream == Stream::kStderr) tails_[local_rank].clear();
  StreamState* raw = s.get();
  streams_[{local_rank, static_cast<int>(stream)}] = std::move(s);
  if (raw->writer == nullptr || !raw->writer->over_high_water()) {
    Status st = loop_.AddFd(raw->fd.get(), EPOLLIN, [this, raw](uint32_t) { OnReadable(*raw); });
    if (!st.ok()) {
      pipe_bytes_ -= raw->pipe_bytes;
      streams_.erase({local_rank, static_cast<int>(stream)});
      return st;
    }
    raw->registered = true;
  }
  return Status::Ok();
}

void OutputRelay::Process(StreamState& s, std::string_view data) {
  if (s.file && !WriteAll(s.file.get(), data.data(), data.size())) {
    int err = errno;
    LogWarning("log file of local rank " + std::to_string(s.local_rank) + ": write: " + std::strerror(err) +
               "; no more output goes to it");
    s.file.reset();
  }
  if (s.stream == Stream::kStderr) {
    std::string& tail = tails_[s.local_rank];
    size_t cap = opt_.stderr_tail_bytes;
    std::string_view last = data.size() > cap ? data.substr(data.size() - cap) : data;
    tail.append(last);
    if (tail.size() > 2 * cap) tail.erase(0, tail.size() - cap);
  }
  if (s.tap) s.tap->Feed(data);
  if (s.writer == nullptr) return;
  ConsoleWriter& w = *s.writer;
  auto lock = w.Lock();
  const RenderTarget t = TargetOf(w, &s);
  if (!t.tty) {
    s.splitter.Feed(data, [&](const LineUnit& u) __attribute__((always_inline)) { Render(t, s.prefix, u); });
  } else {
    // Coalesce: a '\r' update followed by any later unit of the same read is never visible.
    std::string held;
    bool has_held = false;
    s.splitter.Feed(data, [&](const LineUnit& u) {
      has_held = false;
      if (u.end == LineEnd::kReturn) {
        held.assign(u.text);
        has_held = !held.empty();
        return;
      }
      Render(t, s.prefix, u);
    });
    if (has_held) Render(t, s.prefix, LineUnit{held, LineEnd::kReturn, false});
    if (!s.splitter.pending().empty() && !s.show_timer) {
      int rank = s.local_rank;
      Stream stream = s.stream;
      s.show_timer = loop_.AddTimerAfter(opt_.pending_show, [this, rank, stream] { ShowPending(rank, stream); });
    }
  }
  w.Commit(lock);
}

void OutputRelay::ShowPending(int local_rank, Stream stream) {
  StreamState* s = Find(local_rank, stream);
  if (s == nullptr) return;
  s->show_timer.reset();
  std::string_view text = s->splitter.pending();
  if (text.empty() || s->writer == nullptr) return;
  ConsoleWriter& w = *s->writer;
  auto lock = w.Lock();
  // Drawn like a '\r' update: the next line from anyone (this line, completed, included) erases it.
  Render(TargetOf(w, s), s->prefix, LineUnit{text, LineEnd::kReturn, false});
  w.Commit(lock);
}

bool OutputRelay::ReadOnce(StreamState& s) {
  ssize_t n = RetryOnEintr([&] { return ::read(s.fd.get(), scratch_.get(), scratch_size_); });
  if (n > 0) {
    if (on_output_) on_output_(s.local_rank);
    Process(s, std::string_view(scratch_.get(), static_cast<size_t>(n)));
    // The console's reader is gone (`ctrun ... | head`): a worker writing there itself would now
    // get EPIPE (and SIGPIPE), as under torchrun; so it does, through its own pipe, when the
    // console was the stream's only destination. (A terminal hung up or a full disk only drop.)
    if (s.writer != nullptr && s.writer->reader_gone() && !s.file && !s.tap) {
      Close(s, /*notify=*/true);
      return false;
    }
    if (s.writer != nullptr && s.writer->over_high_water()) PauseFor(s.writer);
    return true;
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
  Close(s, /*notify=*/true);  // EOF, or an error that ends the stream all the same
  return false;
}

void OutputRelay::OnReadable(StreamState& s) { ReadOnce(s); }

void OutputRelay::Close(StreamState& s, bool notify) {
  if (s.tap) s.tap->Finish();
  if (s.writer != nullptr) {
    ConsoleWriter& w = *s.writer;
    auto lock = w.Lock();
    const RenderTarget t = TargetOf(w, &s);
    s.splitter.Finish([&](const LineUnit& u) { Render(t, s.prefix, u); });
    if (t.open == &s) {  // never left open by Finish (a cut leaves bytes for it); never dangling
      t.b.push_back('\n');
      t.open = nullptr;
    }
    w.Commit(lock);
  }
  if (s.registered) loop_.RemoveFd(s.fd.get());
  if (s.show_timer) loop_.CancelTimer(*s.show_timer);
  int rank = s.local_rank;
  pipe_bytes_ -= s.pipe_bytes;
  streams_.erase({rank, static_cast<int>(s.stream)});  // destroys s
  if (notify && on_drained_ && WorkerDrained(rank)) on_drained_(rank);
}

void OutputRelay::PauseFor(ConsoleWriter* w) {
  for (auto& [key, s] : streams_) {
    if (s->writer == w && s->registered) {
      loop_.RemoveFd(s->fd.get());
      s->registered = false;
    }
  }
}

void OutputRelay::ResumeFor(ConsoleWriter* w) {
  for (auto& [key, s] : streams_) {
    if (s->writer == w && !s->registered) {
      StreamState* raw = s.get();
      s->registered = loop_.AddFd(s->fd.get(), EPOLLIN, [this, raw](uint32_t) { OnReadable(*raw); }).ok();
    }
  }
}

bool OutputRelay::WorkerDrained(int local_rank) const {
  auto it = streams_.lower_bound({local_rank, 0});
  return it == streams_.end() || it->first.first != local_rank;
}

void OutputRelay::CatchUp(int local_rank) {
  for (int k = 0; k < 2; ++k) {
    // Bounded like DrainAndClose's reads: a descendant still writing cannot hold the loop here.
    for (int i = 0; i < 64; ++i) {
      StreamState* s = Find(local_rank, static_cast<Stream>(k));  // gone once EOF closed it
      if (s == nullptr || (s->writer != nullptr && s->writer->over_high_water())) break;
      if (!ReadOnce(*s) || !s->registered) break;
      pollfd p{s->fd.get(), POLLIN, 0};
      if (RetryOnEintr([&] { return ::poll(&p, 1, 0); }) <= 0) break;  // EAGAIN next: nothing more now
    }
  }
}

void OutputRelay::DrainAndClose(StreamState& s) {
  // What is in the pipe now is all that will be read; bounded so a busy writer (a descendant
  // still holding the pipe) cannot hold us.
  for (int i = 0; i < 64; ++i) {
    ssize_t n = RetryOnEintr([&] { return ::read(s.fd.get(), scratch_.get(), scratch_size_); });
    if (n <= 0) break;
    Process(s, std::string_view(scratch_.get(), static_cast<size_t>(n)));
  }
  Close(s, /*notify=*/false);
}

size_t OutputRelay::FlushAll(TimePoint deadline, int interrupt, TimePoint console_deadline) {
  auto now = [] { return TimePoint(std::chrono::steady_clock::now()); };
  std::vector<pollfd> fds;
  std::vector<std::pair<int, int>> keys;
  while (!streams_.empty()) {
    for (ConsoleWriter* w : {out_.get(), err_.get()}) {
      if (w != nullptr && w->over_high_water()) w->Drain(deadline);
    }
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now()).count();
    if (left <= 0) break;
    fds.clear();
    keys.clear();
    for (auto& [key, s] : streams_) {
      fds.push_back(pollfd{s->fd.get(), POLLIN, 0});
      keys.push_back(key);
    }
    int n = RetryOnEintr([&] { return ::poll(fds.data(), fds.size(), static_cast<int>(left)); });
    if (n < 0) break;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      auto it = streams_.find(keys[i]);
      if (it != streams_.end()) ReadOnce(*it->second);
    }
  }
  while (!streams_.empty()) DrainAndClose(*streams_.begin()->second);
  size_t lost = 0;
  for (ConsoleWriter* w : {out_.get(), err_.get()}) {
    if (w == nullptr) continue;
    // What a cut wait left is given up now, so that the next lines (the summary, the note of
    // the loss) go out first instead of queueing behind it.
    if (!w->Drain(console_deadline, interrupt)) w->Abandon();
    auto lock = w->Lock();
    lost += w->dropped();
  }
  return lost;
}

bool OutputRelay::Idle() const {
  return streams_.empty() && out_->buffered() == 0 && (!err_ || err_->buffered() == 0);
}

std::string OutputRelay::StderrTail(int local_rank, const std::string& fallback_file) const {
  auto it = tails_.find(local_rank);
  if (it == tails_.end() || it->second.empty()) {
    return fallback_file.empty() ? std::string() : ReadFileTail(fallback_file, opt_.stderr_tail_bytes,
                                                                 opt_.stderr_tail_lines);
  }
  std::string_view t = it->second;
  if (t.size() > opt_.stderr_tail_bytes) {
    t = t.substr(t.size() - opt_.stderr_tail_bytes);
    size_t nl = t.find('\n');
    if (nl != std::string_view::npos && nl + 1 < t.size()) t.remove_prefix(nl + 1);
  }
  return LastLines(t, opt_.stderr_tail_lines);
}

}  // namespace ctrun::logs
