// Process-level tests of OutputRelay: real pipes, forked writer processes, a slow console pipe,
// and a pseudo-terminal. Every wait polls against a deadline.
#include "logs/output_relay.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "logs/logging.h"
#include "helpers/test_util.h"
#include "sys/posix_util.h"
#include "sys/pty.h"

namespace ctrun::logs {
namespace {

using ctrun::testing::TempDir;
using namespace std::chrono_literals;

struct Pipe {
  UniqueFd r, w;
  Pipe() {
    int fds[2];
    EXPECT_EQ(::pipe2(fds, O_CLOEXEC), 0);
    r.reset(fds[0]);
    w.reset(fds[1]);
  }
};

// Forks a child that runs body(fd) on the pipe's write end and _exits 0; the parent keeps only
// the read end.
pid_t ForkWriter(Pipe& p, const std::function<void(int)>& body) {
  pid_t pid = ::fork();
  if (pid == 0) {
    body(p.w.get());
    ::_exit(0);
  }
  p.w.reset();
  return pid;
}

// Writes n numbered lines "w<rank> <i>" in ~3000-byte writes, so lines straddle write(2) calls.
void WriteNumbered(int fd, int rank, int n, int pad = 0) {
  std::string buf;
  std::string filler(static_cast<size_t>(pad), '.');
  for (int i = 0; i < n; ++i) {
    char line[64];
    int len = std::snprintf(line, sizeof line, "w%d %d", rank, i);
    buf.append(line, static_cast<size_t>(len));
    buf += filler;
    buf.push_back('\n');
    if (buf.size() >= 3000) {
      WriteAll(fd, buf.data(), buf.size());
      buf.clear();
    }
  }
  WriteAll(fd, buf.data(), buf.size());
}

bool RunUntil(EventLoop& loop, const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    loop.RunOnce(10ms);
  }
  return true;
}

int PipeBytes(int fd) {
  int n = 0;
  ::ioctl(fd, FIONREAD, &n);
  return n;
}

void ExpectChildOk(pid_t pid) {
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// Checks that `text` holds exactly n lines "[r<k>] w<k> <i>..." per rank k < ranks, in order.
void CheckNumbered(const std::string& text, int ranks, int n) {
  std::vector<int> next(static_cast<size_t>(ranks), 0);
  size_t pos = 0, lines = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    ASSERT_NE(nl, std::string::npos) << "unterminated output line at " << pos;
    std::string line = text.substr(pos, nl - pos);
    pos = nl + 1;
    int pr = -1, wr = -1, i = -1;
    ASSERT_EQ(std::sscanf(line.c_str(), "[r%d] w%d %d", &pr, &wr, &i), 3) << line;
    ASSERT_EQ(pr, wr) << "line under the wrong prefix: " << line;
    ASSERT_TRUE(wr >= 0 && wr < ranks) << line;
    ASSERT_EQ(i, next[static_cast<size_t>(wr)]) << "lost, duplicated or reordered: " << line;
    ++next[static_cast<size_t>(wr)];
    ++lines;
  }
  for (int r = 0; r < ranks; ++r) EXPECT_EQ(next[static_cast<size_t>(r)], n) << "rank " << r;
  EXPECT_EQ(lines, static_cast<size_t>(ranks) * static_cast<size_t>(n));
}

std::string Slurp(const std::string& path) { return ctrun::testing::ReadFileOr(path); }

// A relay whose console is two regular files (or one, when shared) in a temp dir.
struct FileConsole {
  TempDir tmp;
  UniqueFd out, err;
  ConsoleOptions opt;
  explicit FileConsole(bool shared = false) {
    out.reset(::open((tmp / "out").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    err.reset(shared ? ::dup(out.get())
                     : ::open((tmp / "err").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    opt.stdout_fd = out.get();
    opt.stderr_fd = err.get();
  }
  std::string Out() const { return Slurp(tmp / "out"); }
  std::string Err() const { return Slurp(tmp / "err"); }
};

Sinks ConsoleSink(int rank) {
  Sinks s;
  s.console = true;
  s.prefix = "[r" + std::to_string(rank) + "] ";
  s.color_key = rank;
  return s;
}

TEST(OutputRelay, EightWritersEveryLineOnceInPerRankOrder) {
  FileConsole console;
  EventLoop loop;
  OutputRelay relay(loop, console.opt);
  int drained = 0;
  relay.SetOnWorkerDrained([&](int) { ++drained; });
  constexpr int kRanks = 8, kLines = 100000;
  std::vector<pid_t> pids;
  for (int r = 0; r < kRanks; ++r) {
    Pipe p;
    pids.push_back(ForkWriter(p, [r](int fd) { WriteNumbered(fd, r, kLines); }));
    ASSERT_TRUE(relay.AddStream(r, Stream::kStdout, std::move(p.r), ConsoleSink(r)).ok());
  }
  ASSERT_TRUE(RunUntil(loop, [&] { return drained == kRanks; }, 50s));
  for (pid_t pid : pids) ExpectChildOk(pid);
  EXPECT_TRUE(relay.Idle());
  CheckNumbered(console.Out(), kRanks, kLines);
  EXPECT_EQ(console.Err(), "");
}

TEST(OutputRelay, CrashingWorkersLastPartialLineIsKept) {
  FileConsole console;
  const TempDir& tmp = console.tmp;
  EventLoop loop;
  OutputRelay relay(loop, console.opt);
  std::vector<int> drained;
  relay.SetOnWorkerDrained([&](int r) { drained.push_back(r); });

  Pipe po, pe;
  const std::string said = "Traceback (most recent call last):\n  File x\nRuntimeError: CUDA error: boom";
  pid_t pid = ::fork();
  if (pid == 0) {
    WriteAll(po.w.get(), "step 1\nstep", 11);
    WriteAll(pe.w.get(), said.data(), said.size());
    ::kill(::getpid(), SIGKILL);
  }
  po.w.reset();
  pe.w.reset();
  Sinks se = ConsoleSink(3);
  se.file.reset(::open((tmp / "stderr.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  ASSERT_TRUE(relay.AddStream(3, Stream::kStdout, std::move(po.r), ConsoleSink(3)).ok());
  ASSERT_TRUE(relay.AddStream(3, Stream::kStderr, std::move(pe.r), std::move(se)).ok());
  EXPECT_FALSE(relay.WorkerDrained(3));
  ASSERT_TRUE(RunUntil(loop, [&] { return !drained.empty(); }, 10s));
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_EQ(drained, std::vector<int>{3});
  EXPECT_TRUE(relay.WorkerDrained(3));
  EXPECT_EQ(console.Out(), "[r3] step 1\n[r3] step\n");
  EXPECT_EQ(console.Err(),
            "[r3] Traceback (most recent call last):\n[r3]   File x\n[r3] RuntimeError: CUDA error: boom\n");
  EXPECT_EQ(Slurp(tmp / "stderr.log"), said);  // the file gets the raw bytes
  EXPECT_EQ(relay.StderrTail(3), said);
  EXPECT_EQ(relay.StderrTail(5), "");
}

TEST(OutputRelay, PtyStreamOfACrashingWriterIsReadToTheEndAndDuplicated) {
  FileConsole console;
  const TempDir& tmp = console.tmp;
  EventLoop loop;
  OutputRelay relay(loop, console.opt);
  std::vector<int> drained;
  relay.SetOnWorkerDrained([&](int r) { drained.push_back(r); });
  auto pty = OpenPty(WindowSize{24, 80});
  ASSERT_TRUE(pty.ok()) << pty.message();
  pid_t pid = ::fork();
  if (pid == 0) {
    for (int i = 0; i < 2000; ++i) {  // more than a pty buffer holds: the writer blocks meanwhile
      char line[64];
      int len = std::snprintf(line, sizeof line, "w1 %d\n", i);
      WriteAll(pty->slave.get(), line, static_cast<size_t>(len));
    }
    WriteAll(pty->slave.get(), "loss 0.5 last words", 19);
    ::kill(::getpid(), SIGKILL);
  }
  pty->slave.reset();
  Sinks s = ConsoleSink(1);
  s.file.reset(::open((tmp / "stdout.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  s.duplicate = std::make_shared<DuplicateFile>(
      UniqueFd(::open((tmp / "filtered").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)),
      std::vector<std::string>{"loss", "w1 1999"}, tmp / "filtered");
  s.duplicate_prefix = "[r1] ";
  ASSERT_TRUE(relay.AddStream(1, Stream::kStdout, std::move(pty->master), std::move(s)).ok());
  ASSERT_TRUE(RunUntil(loop, [&] { return !drained.empty(); }, 20s));  // EIO ends the stream
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  const std::string out = console.Out();
  EXPECT_NE(out.find("[r1] w1 1999\n[r1] loss 0.5 last words\n"), std::string::npos);
  EXPECT_EQ(out.find("\r"), std::string::npos);  // no "\r\n" from the pty
  EXPECT_EQ(Slurp(tmp / "stdout.log").size(), out.size() - 2001 * 5 - 1);  // raw: no prefixes, no added newline
  EXPECT_EQ(Slurp(tmp / "filtered"), "[r1] w1 1999\n[r1] loss 0.5 last words\n");
}

TEST(OutputRelay, SlowConsoleSlowsWritersAndBoundsMemory) {
  Pipe console;
  int flags_before = ::fcntl(console.w.get(), F_GETFL);
  EventLoop loop;
  ConsoleOptions opt;
  opt.stdout_fd = console.w.get();
  opt.stderr_fd = console.w.get();
  opt.high_water = 64 << 10;
  opt.read_size = 16 << 10;
  OutputRelay relay(loop, opt);
  ASSERT_TRUE(relay.stdout_console().nonblocking());
  int drained = 0;
  relay.SetOnWorkerDrained([&](int) { ++drained; });
  constexpr int kRanks = 4, kLines = 20000;  // ~100-byte lines: 8 MB in all
  std::vector<pid_t> pids;
  for (int r = 0; r < kRanks; ++r) {
    Pipe p;
    pids.push_back(ForkWriter(p, [r](int fd) { WriteNumbered(fd, r, kLines, 90); }));
    ASSERT_TRUE(relay.AddStream(r, Stream::kStdout, std::move(p.r), ConsoleSink(r)).ok());
  }
  // The slow consumer: 32 KiB per millisecond at most. Its read must not block: it runs inside
  // the loop, so an empty pipe (a writer descheduled under load) would stop the relay that fills
  // it, and the test would hang instead of failing.
  ASSERT_TRUE(SetNonBlocking(console.r.get(), true));
  std::string got;
  size_t max_buffered = 0;
  bool saw_full = false;
  std::vector<char> buf(32 << 10);
  std::function<void()> consume = [&] {
    size_t b = relay.stdout_console().buffered();
    max_buffered = std::max(max_buffered, b);
    saw_full = saw_full || relay.stdout_console().over_high_water();
    ssize_t n = ::read(console.r.get(), buf.data(), buf.size());
    if (n > 0) got.append(buf.data(), static_cast<size_t>(n));
    loop.AddTimerAfter(1ms, consume);
  };
  loop.AddTimerAfter(1ms, consume);
  ASSERT_TRUE(RunUntil(loop, [&] {
    max_buffered = std::max(max_buffered, relay.stdout_console().buffered());
    return drained == kRanks && relay.Idle();
  }, 60s));
  for (ssize_t n; (n = ::read(console.r.get(), buf.data(), buf.size())) > 0;) got.append(buf.data(), static_cast<size_t>(n));
  for (pid_t pid : pids) ExpectChildOk(pid);
  EXPECT_TRUE(saw_full) << "back-pressure never engaged";
  // Bounded: high water + one read (16 KiB of ~100-byte lines gains ~5% of prefix).
  EXPECT_LE(max_buffered, opt.high_water + 2 * opt.read_size);
  EXPECT_EQ(::fcntl(console.w.get(), F_GETFL), flags_before) << "the console fd's flags were changed";
  CheckNumbered(got, kRanks, kLines);
}

TEST(OutputRelay, DiagnosticsNeverLandInsideAWorkerLine) {
  FileConsole console(/*shared=*/true);  // same file: one writer for both streams
  ASSERT_TRUE(SetupLogging(LogLevel::kInfo).ok());
  EventLoop loop;
  ConsoleOptions opt = console.opt;
  opt.route_diagnostics = true;
  {
    OutputRelay relay(loop, opt);
    EXPECT_EQ(&relay.stdout_console(), &relay.stderr_console());
    Pipe p;
    ASSERT_TRUE(relay.AddStream(0, Stream::kStderr, std::move(p.r), ConsoleSink(0)).ok());
    WriteAll(p.w.get(), "par", 3);
    ASSERT_TRUE(RunUntil(loop, [&] { return PipeBytes(p.r.valid() ? p.r.get() : -1) == 0; }, 5s));
    loop.RunOnce(0ms);
    spdlog::info("diagnostic {}", 42);
    WriteAll(p.w.get(), "tial\n", 5);
    p.w.reset();
    ASSERT_TRUE(RunUntil(loop, [&] { return relay.WorkerDrained(0); }, 5s));
  }
  spdlog::info("after the relay");
  std::string text = console.Out();
  auto lines = std::vector<std::string>();
  for (size_t pos = 0, nl; (nl = text.find('\n', pos)) != std::string::npos; pos = nl + 1) lines.push_back(text.substr(pos, nl - pos));
  ASSERT_EQ(lines.size(), 2u) << text;
  EXPECT_EQ(lines[0].rfind("[ctrun] I ", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find("diagnostic 42"), std::string::npos);
  EXPECT_EQ(lines[1], "[r0] partial");
  ASSERT_TRUE(SetupLogging(LogLevel::kOff).ok());
}

// A pseudo-terminal in raw mode: what the user's terminal would receive.
struct Pty {
  UniqueFd master, slave;
  Pty() {
    master.reset(::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
    if (!master || ::grantpt(master.get()) != 0 || ::unlockpt(master.get()) != 0) return;
    slave.reset(::open(::ptsname(master.get()), O_RDWR | O_NOCTTY | O_CLOEXEC));
    termios t{};
    if (slave && ::tcgetattr(slave.get(), &t) == 0) {
      ::cfmakeraw(&t);
      ::tcsetattr(slave.get(), TCSANOW, &t);
    }
  }
  // Both console fds on the terminal, no colours.
  ConsoleOptions Options() const {
    ConsoleOptions opt;
    opt.stdout_fd = slave.get();
    opt.stderr_fd = slave.get();
    opt.color = ConsoleOptions::Color::kNever;
    return opt;
  }
  // Reads until `want` bytes arrived or the deadline passed.
  std::string Read(size_t want, std::chrono::milliseconds timeout) {
    std::string s;
    auto deadline = std::chrono::steady_clock::now() + timeout;
    char buf[4096];
    while (s.size() < want && std::chrono::steady_clock::now() < deadline) {
      pollfd p{master.get(), POLLIN, 0};
      if (::poll(&p, 1, 20) == 1) {
        ssize_t n = ::read(master.get(), buf, sizeof buf);
        if (n > 0) s.append(buf, static_cast<size_t>(n));
      }
    }
    return s;
  }
};

TEST(OutputRelay, ProgressBarsOnATerminalStayOnTheirOwnLine) {
  Pty pty;
  if (!pty.slave) GTEST_SKIP() << "no pseudo-terminal available";
  EventLoop loop;
  ConsoleOptions opt = pty.Options();
  opt.pending_show = std::chrono::hours(1);  // no transient partial lines in this test
  OutputRelay relay(loop, opt);
  ASSERT_TRUE(relay.console_is_tty());
  Pipe p0, p1;
  int r0 = p0.r.get(), r1 = p1.r.get();
  ASSERT_TRUE(relay.AddStream(0, Stream::kStderr, std::move(p0.r), ConsoleSink(0)).ok());
  ASSERT_TRUE(relay.AddStream(1, Stream::kStdout, std::move(p1.r), ConsoleSink(1)).ok());
  auto settle = [&](int fd) { ASSERT_TRUE(RunUntil(loop, [&] { return PipeBytes(fd) == 0; }, 5s)); loop.RunOnce(0ms); };

  WriteAll(p0.w.get(), "\r 10%\r 20%\r 30%", 15);  // a tqdm burst: only " 20%" is complete
  settle(r0);
  WriteAll(p1.w.get(), "hello\n", 6);
  settle(r1);
  WriteAll(p0.w.get(), "\r100%\n", 6);
  settle(r0);
  const std::string want = "[r0]  20%\r\x1b[K[r1] hello\n[r0] 100%\n";
  EXPECT_EQ(pty.Read(want.size(), 5s), want);
}

TEST(OutputRelay, PendingProgressBarIsShownAtOnceOnATerminal) {
  Pty pty;
  if (!pty.slave) GTEST_SKIP() << "no pseudo-terminal available";
  EventLoop loop;
  ConsoleOptions opt = pty.Options();
  opt.pending_show = 10ms;
  OutputRelay relay(loop, opt);
  Pipe p;
  ASSERT_TRUE(relay.AddStream(0, Stream::kStderr, std::move(p.r), ConsoleSink(0)).ok());
  WriteAll(p.w.get(), "\r 42%", 5);  // tqdm: the bar follows the '\r', no terminator yet
  std::string got;
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (got.find("42%") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    loop.RunOnce(5ms);
    got += pty.Read(1, 1ms);
  }
  EXPECT_EQ(got, "[r0]  42%\r");  // transient: drawn, cursor back at column 0
  WriteAll(p.w.get(), "\n", 1);
  p.w.reset();
  ASSERT_TRUE(RunUntil(loop, [&] { return relay.WorkerDrained(0); }, 5s));
  const std::string rest = "\x1b[K[r0]  42%\n";
  EXPECT_EQ(pty.Read(rest.size(), 5s), rest);
}

TEST(OutputRelay, FlushAllHonoursItsDeadlineAndFlushesPartials) {
  FileConsole console(/*shared=*/true);
  EventLoop loop;
  OutputRelay relay(loop, console.opt);
  Pipe held;  // like a pipe kept open by an orphaned grandchild: never EOF
  ASSERT_TRUE(relay.AddStream(0, Stream::kStderr, std::move(held.r), ConsoleSink(0)).ok());
  WriteAll(held.w.get(), "line\nno newline", 15);
  auto start = std::chrono::steady_clock::now();
  relay.FlushAll(TimePoint(start + 300ms));
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took, 3s);
  EXPECT_TRUE(relay.Idle());
  EXPECT_EQ(console.Out(), "[r0] line\n[r0] no newline\n");
  EXPECT_EQ(relay.StderrTail(0), "line\nno newline");

  // A restart re-adds the rank: the old tail is gone, the new stream works.
  Pipe again;
  ASSERT_TRUE(relay.AddStream(0, Stream::kStderr, std::move(again.r), ConsoleSink(0)).ok());
  EXPECT_EQ(relay.StderrTail(0), "");
  WriteAll(again.w.get(), "second\n", 7);
  again.w.reset();
  ASSERT_TRUE(RunUntil(loop, [&] { return relay.WorkerDrained(0); }, 5s));
  EXPECT_EQ(relay.StderrTail(0), "second\n");
  EXPECT_EQ(relay.StderrTail(1, console.tmp / "out"), "[r0] line\n[r0] no newline\n[r0] second\n");
}

// The next attempt's stream replaces a rank's stream that still holds the crashed worker's last
// bytes (not read yet: the console was over its high water, or the restart came in the same loop
// turn): they reach the console and the rank's file first, none is dropped with the old pipe.
TEST(OutputRelay, ReplacingAStreamFirstReadsWhatTheOldPipeStillHolds) {
  FileConsole console;
  EventLoop loop;
  OutputRelay relay(loop, console.opt);
  Pipe crashed;
  Sinks with_file = ConsoleSink(1);
  with_file.file.reset(::open((console.tmp / "stderr.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  ASSERT_TRUE(relay.AddStream(1, Stream::kStderr, std::move(crashed.r), std::move(with_file)).ok());
  const std::string last = "Traceback (most recent call last):\nRuntimeError: boom\nno newline";
  WriteAll(crashed.w.get(), last.data(), last.size());
  crashed.w.reset();
  Pipe next;
  ASSERT_TRUE(relay.AddStream(1, Stream::kStderr, std::move(next.r), ConsoleSink(1)).ok());
  WriteAll(next.w.get(), "attempt 1\n", 10);
  next.w.reset();
  ASSERT_TRUE(RunUntil(loop, [&] { return relay.WorkerDrained(1); }, 5s));
  EXPECT_EQ(console.Err(), "[r1] Traceback (most recent call last):\n[r1] RuntimeError: boom\n[r1] no newline\n"
                           "[r1] attempt 1\n");
  EXPECT_EQ(Slurp(console.tmp / "stderr.log"), last);
  EXPECT_EQ(relay.StderrTail(1), "attempt 1\n");
}

// A stopping signal cuts the final wait for a console whose reader is away: what the relay still
// held is given up at once (counted), and the next line, ctrun's own, goes out before it, on a
// line of its own although the last write ended inside a worker's line.
TEST(OutputRelay, ACutFinalWaitGivesUpThePendingBytesSoTheNextLineGoesFirst) {
  Pipe console;
  ASSERT_EQ(::fcntl(console.w.get(), F_SETPIPE_SZ, 4096), 4096);
  EventLoop loop;
  ConsoleOptions opt;
  opt.stdout_fd = console.w.get();
  opt.stderr_fd = console.w.get();
  OutputRelay relay(loop, opt);
  std::string sent;
  Pipe worker;
  for (int i = 0; i < 100; ++i) {
    const std::string line = "line " + std::to_string(i) + std::string(90, '.') + "\n";
    WriteAll(worker.w.get(), line.data(), line.size());
    sent += "[r0] " + line;
  }
  worker.w.reset();
  ASSERT_TRUE(relay.AddStream(0, Stream::kStdout, std::move(worker.r), ConsoleSink(0)).ok());
  Pipe signalled;  // readable: the signal came
  WriteAll(signalled.w.get(), "x", 1);
  const auto start = std::chrono::steady_clock::now();
  const size_t lost = relay.FlushAll(TimePoint(start + 5s), signalled.r.get());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s) << "the cut wait was waited out";
  EXPECT_EQ(lost, sent.size() - 4096);
  // ctrun's summary, cut short the same way: it counts; the newline owed to the cut line does not.
  relay.stderr_console().WriteDiagnostic("all workers finished");
  EXPECT_EQ(relay.FlushAll(TimePoint(start + 5s), signalled.r.get()), sent.size() - 4096 + 21);
  relay.stderr_console().WriteDiagnostic("lost some");
  std::string got;
  ASSERT_TRUE(SetNonBlocking(console.r.get(), true));
  const auto read_some = [&] {
    char buf[8192];
    for (ssize_t n; (n = ::read(console.r.get(), buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  };
  read_some();
  ASSERT_EQ(got, sent.substr(0, 4096));
  ASSERT_NE(got.back(), '\n') << "the pipe's size should cut a line";
  EXPECT_TRUE(relay.stderr_console().Drain(TimePoint(std::chrono::steady_clock::now() + 5s)));
  read_some();
  EXPECT_EQ(got, sent.substr(0, 4096) + "\nlost some\n");
}

// The console's options with 1 KiB pieces for long lines.
ConsoleOptions KiBPieces(ConsoleOptions opt) {
  opt.max_line = 1024;
  return opt;
}

// Off a terminal a line over max_line reaches the console byte for byte, prefixed once, when
// nothing comes between its pieces (a script parsing one long JSON line still can); binary and
// invalid UTF-8 bytes pass through.
TEST(OutputRelay, LongAndBinaryLinesPassThroughByteForByteOffATerminal) {
  FileConsole console(/*shared=*/true);
  EventLoop loop;
  OutputRelay relay(loop, KiBPieces(console.opt));
  Pipe p;
  std::string big(5000, 'x');
  std::string bin("\xff\x00\xfe\x80 ok", 7);
  pid_t pid = ForkWriter(p, [&](int fd) {
    WriteAll(fd, big.data(), big.size());
    WriteAll(fd, "\n", 1);
    WriteAll(fd, bin.data(), bin.size());
    WriteAll(fd, "\n", 1);
  });
  ASSERT_TRUE(relay.AddStream(0, Stream::kStdout, std::move(p.r), ConsoleSink(0)).ok());
  ASSERT_TRUE(RunUntil(loop, [&] { return relay.WorkerDrained(0); }, 5s));
  ExpectChildOk(pid);
  EXPECT_EQ(console.Out(), "[r0] " + big + "\n[r0] " + bin + "\n");
}

// Rank 0's long line is open (two pieces out, the rest pending) when rank 1's line and one of
// ctrun's own come: each first closes the open piece with the cut mark, so no line lands inside
// another, and rank 0's next piece starts a prefixed line of its own.
TEST(OutputRelay, WhatComesBetweenTheCutPiecesOfALongLineClosesTheOpenPieceWithTheMark) {
  FileConsole console(/*shared=*/true);
  EventLoop loop;
  OutputRelay relay(loop, KiBPieces(console.opt));
  Pipe a, b;
  int wa = a.w.get(), wb = b.w.get();
  ASSERT_TRUE(relay.AddStream(0, Stream::kStdout, std::move(a.r), ConsoleSink(0)).ok());
  ASSERT_TRUE(relay.AddStream(1, Stream::kStdout, std::move(b.r), ConsoleSink(1)).ok());
  const auto drained = [&] { return relay.stderr_console().Drain(TimePoint(std::chrono::steady_clock::now() + 5s)); };
  const auto shows = [&](const std::string& tail) {
    return RunUntil(loop, [&] {
      (void)drained();
      const std::string out = console.Out();
      return out.size() >= tail.size() && out.compare(out.size() - tail.size(), tail.size(), tail) == 0;
    }, 5s);
  };
  WriteAll(wa, std::string(2500, 'x').data(), 2500);  // two 1024-byte pieces out, 452 bytes pending
  ASSERT_TRUE(shows(std::string(2048, 'x')));
  WriteAll(wb, "hello\n", 6);
  ASSERT_TRUE(shows("[r1] hello\n"));
  WriteAll(wa, std::string(1500, 'y').data(), 1500);  // 452 x + 572 y out as a piece, 928 y pending
  ASSERT_TRUE(shows(std::string(572, 'y')));
  relay.stderr_console().WriteDiagnostic("[ctrun] a note");
  WriteAll(wa, "z\n", 2);
  a.w.reset();
  b.w.reset();
  ASSERT_TRUE(RunUntil(loop, [&] { return relay.WorkerDrained(0) && relay.WorkerDrained(1); }, 5s));
  ASSERT_TRUE(drained());
  EXPECT_EQ(console.Out(), "[r0] " + std::string(2048, 'x') + "\\\n[r1] hello\n[r0] " + std::string(452, 'x') +
                               std::string(572, 'y') + "\\\n[ctrun] a note\n[r0] " + std::string(928, 'y') + "z\n");
}

// On a terminal every cut piece keeps the mark (a reader sees where the line was cut).
TEST(OutputRelay, OnATerminalEveryCutPieceEndsWithTheMark) {
  Pty pty;
  if (!pty.slave) GTEST_SKIP() << "no pseudo-terminal available";
  EventLoop loop;
  ConsoleOptions opt = KiBPieces(pty.Options());
  opt.pending_show = std::chrono::hours(1);  // no transient partial lines
  OutputRelay relay(loop, opt);
  ASSERT_TRUE(relay.console_is_tty());
  Pipe p;
  ASSERT_TRUE(relay.AddStream(0, Stream::kStdout, std::move(p.r), ConsoleSink(0)).ok());
  WriteAll(p.w.get(), (std::string(2100, 'x') + "\n").data(), 2101);
  p.w.reset();
  ASSERT_TRUE(RunUntil(loop, [&] { return relay.WorkerDrained(0); }, 5s));
  const std::string piece = "[r0] " + std::string(1024, 'x') + "\\\n";
  const std::string want = piece + piece + "[r0] " + std::string(52, 'x') + "\n";
  EXPECT_EQ(pty.Read(want.size(), 5s), want);
}

TEST(OutputRelay, PipesAreEnlargedWithinABudget) {
  long max_size = std::strtol(Slurp("/proc/sys/fs/pipe-max-size").c_str(), nullptr, 10);
  if (max_size < (1 << 20) && ::geteuid() != 0) GTEST_SKIP() << "pipe-max-size below 1 MiB";
  FileConsole console;
  console.opt.pipe_size = 1 << 20;
  console.opt.pipe_budget = 2 << 20;
  console.opt.pipe_size_over_budget = 128 << 10;
  EventLoop loop;
  OutputRelay relay(loop, console.opt);
  Pipe a, b, c;
  int wa = a.w.get(), wb = b.w.get(), wc = c.w.get();
  ASSERT_TRUE(relay.AddStream(0, Stream::kStdout, std::move(a.r), ConsoleSink(0)).ok());
  ASSERT_TRUE(relay.AddStream(0, Stream::kStderr, std::move(b.r), ConsoleSink(0)).ok());
  ASSERT_TRUE(relay.AddStream(1, Stream::kStdout, std::move(c.r), ConsoleSink(1)).ok());
  EXPECT_EQ(::fcntl(wa, F_GETPIPE_SZ), 1 << 20);
  EXPECT_EQ(::fcntl(wb, F_GETPIPE_SZ), 1 << 20);
  EXPECT_EQ(::fcntl(wc, F_GETPIPE_SZ), 128 << 10) << "over the budget";
  a.w.reset();
  b.w.reset();
  ASSERT_TRUE(RunUntil(loop, [&] { return relay.WorkerDrained(0); }, 10s));
  Pipe d;  // rank 0's pipes were closed: their bytes are back in the budget
  ASSERT_TRUE(relay.AddStream(2, Stream::kStdout, std::move(d.r), ConsoleSink(2)).ok());
  EXPECT_EQ(::fcntl(d.w.get(), F_GETPIPE_SZ), 1 << 20);
}

}  // namespace
}  // namespace ctrun::logs
