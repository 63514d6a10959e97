// Heartbeats: off by default; FILE and FD modes write the documented records.
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "helpers/test_util.h"

namespace ctrun::worker {
namespace {

using ctrun::testing::ReadFileOr;
using ctrun::testing::RunCommand;
using ctrun::testing::RunResult;
using ctrun::testing::TempDir;

TEST(Heartbeat, NoOpWithoutLauncherRequest) {
  auto r = RunCommand({WORKER_HELPER, "heartbeat", "5"}, {"CTRUN_HEARTBEAT_FILE=", "CTRUN_HEARTBEAT_FD="});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "0\n");
}

TEST(Heartbeat, FileModeRewritesOneFixedWidthRecord) {
  TempDir dir;
  const std::string path = dir / "hb";
  auto r = RunCommand({WORKER_HELPER, "heartbeat", "7"}, {"CTRUN_HEARTBEAT_FILE=" + path});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "7\n");
  const std::string rec = ReadFileOr(path);
  ASSERT_EQ(rec.size(), 42u) << rec;
  EXPECT_TRUE(std::regex_match(rec, std::regex("00000000000000000007 [0-9]{20}\n"))) << rec;
  const double ns = std::stod(rec.substr(21, 20));
  EXPECT_NEAR(ns / 1e9, static_cast<double>(std::time(nullptr)), 60.0);
}

// All that is buffered in a non-blocking fd now (the writer has exited).
std::string Drain(int fd) {
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  return out;
}

// CTRUN_HEARTBEAT_FILE names a regular file only: a FIFO (without a reader: a blocking open
// would wait for one for ever; with one: it is not a file to rewrite) or a symbolic link leaves
// beats off, and the worker goes on at once.
TEST(Heartbeat, FileModeTakesOnlyARegularFileAndNeverBlocks) {
  TempDir dir;
  const std::string fifo = dir / "hb.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto r = RunCommand({WORKER_HELPER, "heartbeat", "3"}, {"CTRUN_HEARTBEAT_FILE=" + fifo, "CTRUN_HEARTBEAT_FD="},
                      std::chrono::seconds(30));
  ASSERT_EQ(r.exit_code, 0) << "blocked (-1) or failed: " << r.err;
  EXPECT_EQ(r.out, "0\n");
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(reader, 0);
  r = RunCommand({WORKER_HELPER, "heartbeat", "3"}, {"CTRUN_HEARTBEAT_FILE=" + fifo, "CTRUN_HEARTBEAT_FD="},
                 std::chrono::seconds(30));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "0\n");
  EXPECT_EQ(Drain(reader), "");
  ::close(reader);
  const std::string target = dir / "target";
  std::ofstream(target) << "keep";
  const std::string link = dir / "hb.link";
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  r = RunCommand({WORKER_HELPER, "heartbeat", "3"}, {"CTRUN_HEARTBEAT_FILE=" + link, "CTRUN_HEARTBEAT_FD="},
                 std::chrono::seconds(30));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "0\n");
  EXPECT_EQ(ReadFileOr(target), "keep");
}

struct FifoRun {
  RunResult run;
  std::vector<std::string> beats;  // the lines the helper wrote to its channel
};

// Runs the helper in `mode` with CTRUN_HEARTBEAT_FD=9 on a FIFO whose read end the test holds
// (ctrun gives a socket; a pipe or FIFO works the same). Opening the read end non-blocking lets
// the shell's open for writing proceed at once; a few short lines fit the pipe buffer.
FifoRun RunOnFifo(const std::string& mode) {
  TempDir dir;
  const std::string path = dir / "hb.fifo";
  FifoRun out;
  if (::mkfifo(path.c_str(), 0600) != 0) return out;
  const int reader = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (reader < 0) return out;
  out.run = RunCommand({"/bin/sh", "-c", "exec 9>" + path + "; exec \"$0\" " + mode, WORKER_HELPER},
                       {"CTRUN_HEARTBEAT_FD=9"});
  out.beats = ctrun::testing::SplitLines(Drain(reader));
  ::close(reader);
  return out;
}

// heartbeat() without a step sends its counter marked "counter" (ctrun does not compare it across
// attempts: it starts again at 1 in every process).
TEST(Heartbeat, FdModeWritesOneLinePerBeat) {
  const FifoRun r = RunOnFifo("heartbeat 3");
  ASSERT_EQ(r.run.exit_code, 0) << r.run.err;
  EXPECT_EQ(r.run.out, "3\n");
  ASSERT_EQ(r.beats.size(), 3u);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_TRUE(std::regex_match(r.beats[i], std::regex(std::to_string(i + 1) + " [0-9]+ counter"))) << r.beats[i];
}

// A process the worker forks (a data loader, a helper) inherits the channel but is not the rank:
// its beats would keep a hung rank looking alive. Only the worker's own beats arrive.
TEST(Heartbeat, AForkedChildOfTheWorkerSendsNoBeats) {
  const FifoRun r = RunOnFifo("heartbeat-fork");
  ASSERT_EQ(r.run.exit_code, 0) << r.run.err;
  EXPECT_EQ(r.run.out, "child 0 0\nparent 2\n");
  ASSERT_EQ(r.beats.size(), 2u);
  EXPECT_TRUE(std::regex_match(r.beats[0], std::regex("1 [0-9]+ counter"))) << r.beats[0];
  EXPECT_TRUE(std::regex_match(r.beats[1], std::regex("2 [0-9]+ counter"))) << r.beats[1];
}

// The same for helpers a worker starts before its first beat: a forked one sends no beats, and an
// exec'd one does not inherit the channel.
TEST(Heartbeat, HelpersStartedBeforeTheFirstBeatDoNotGetTheChannel) {
  const FifoRun r = RunOnFifo("heartbeat-early");
  ASSERT_EQ(r.run.exit_code, 0) << r.run.err;
  EXPECT_EQ(r.run.out, "exec closed\nchild 0 0\nparent 1\n");
  ASSERT_EQ(r.beats.size(), 1u);
  EXPECT_TRUE(std::regex_match(r.beats[0], std::regex("1 [0-9]+ counter"))) << r.beats[0];
}

// (The worker library's tests see only its public headers: a minimal owner for fds.)
struct Fd {
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd; }
  void reset() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  int fd;
};

// A stream socket may take part of a line when its buffer fills (the reader is behind). The rest
// goes out before the next line: every complete line the reader gets is one whole beat, never two
// glued together. The worker fills the socket (a TCP loopback one with small buffers, where sends
// are cut), the test drains it, and the worker beats on.
TEST(Heartbeat, StreamSocketLinesNeverMerge) {
  Fd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const int send_buffer = 4096, receive_buffer = 1024;
  ASSERT_EQ(::setsockopt(listener.get(), SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof receive_buffer), 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t alen = sizeof a;
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(listener.get(), 1), 0);
  ASSERT_EQ(::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&a), &alen), 0);
  Fd writer(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_EQ(::setsockopt(writer.get(), SOL_SOCKET, SO_SNDBUF, &send_buffer, sizeof send_buffer), 0);
  ASSERT_EQ(::connect(writer.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  Fd reader(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_GE(reader.get(), 0);
  int to_child[2], from_child[2];
  ASSERT_EQ(::pipe2(to_child, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe2(from_child, O_CLOEXEC), 0);
  Fd to_w(to_child[1]), to_r(to_child[0]), from_w(from_child[1]), from_r(from_child[0]);
  const int beats = 20000;
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::dup2(to_r.get(), 0);
    ::dup2(from_w.get(), 1);
    ::dup2(writer.get(), 9);
    ::setenv("CTRUN_HEARTBEAT_FD", "9", 1);
    ::execl(WORKER_HELPER, WORKER_HELPER, "heartbeat-pause", std::to_string(beats).c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  writer.reset();
  to_r.reset();
  from_w.reset();
  char said[16] = {};
  ASSERT_GT(::read(from_r.get(), said, sizeof said - 1), 0);
  ASSERT_STREQ(said, "paused\n");
  std::string got;
  char buf[65536];
  for (ssize_t n; (n = ::recv(reader.get(), buf, sizeof buf, MSG_DONTWAIT)) > 0;) got.append(buf, static_cast<size_t>(n));
  ASSERT_EQ(::write(to_w.get(), "\n", 1), 1);
  for (ssize_t n; (n = ::recv(reader.get(), buf, sizeof buf, 0)) > 0;) got.append(buf, static_cast<size_t>(n));
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  const std::vector<std::string> lines = ctrun::testing::SplitLines(got.substr(0, got.rfind('\n') + 1));
  ASSERT_GT(lines.size(), 10u);
  long long last = 0;
  for (const std::string& line : lines) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, std::regex("([0-9]+) [0-9]{19} counter"))) << line;
    const long long step = std::stoll(m[1]);
    EXPECT_GT(step, last) << line;
    EXPECT_LE(step, 2 * beats) << line;
    last = step;
  }
}

// CTRUN_HEARTBEAT_ID's value for `fd`, as a launcher sets it: "<st_dev>:<st_ino>".
std::string IdOf(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return "";
  return std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
}

// A datagram socketpair the test owns: the helper sends on `end`, the test reads `peer`.
struct Channel {
  Channel() {
    int sv[2] = {-1, -1};
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv), 0);
    peer.fd = sv[0];
    end.fd = sv[1];
  }
  // The datagrams waiting on `peer`.
  int Received() const {
    char buf[256];
    int n = 0;
    while (::recv(peer.get(), buf, sizeof buf, MSG_DONTWAIT) >= 0) ++n;
    return n;
  }
  Fd peer{-1};
  Fd end{-1};
};

// Runs the helper's `heartbeat-flags 3` with `channel` inherited (a copy without CLOEXEC, at a
// number of its own) and named by CTRUN_HEARTBEAT_FD, and with CTRUN_HEARTBEAT_ID=`id` (nullopt:
// unset). The copy shares the test's open file description, so its O_NONBLOCK is `channel`'s.
RunResult RunOnChannel(int channel, const std::optional<std::string>& id) {
  Fd inherited(::fcntl(channel, F_DUPFD, 10));
  std::vector<std::string> argv{"/usr/bin/env"};
  if (!id) argv.insert(argv.end(), {"-u", "CTRUN_HEARTBEAT_ID"});
  argv.insert(argv.end(), {WORKER_HELPER, "heartbeat-flags", "3"});
  std::vector<std::string> env{"CTRUN_HEARTBEAT_FD=" + std::to_string(inherited.get()), "CTRUN_HEARTBEAT_FILE="};
  if (id) env.push_back("CTRUN_HEARTBEAT_ID=" + *id);
  return RunCommand(argv, env);
}

bool NonBlocking(int fd) { return (::fcntl(fd, F_GETFL) & O_NONBLOCK) != 0; }

// A process the worker starts inherits the variables but not the (CLOEXEC) fd, and its own first
// socket() may get the number: a socket like ours, which the kind of fd cannot tell apart. When
// CTRUN_HEARTBEAT_ID names another file, the fd is a stranger's: no beat goes into it, and neither
// the load-time guard nor the first beat changes its flags (not CLOEXEC, not O_NONBLOCK). The
// socket the ID names gets every beat.
TEST(Heartbeat, OnlyTheSocketTheIdNamesGetsBeats) {
  Channel ours, stranger;
  const std::string id = IdOf(ours.end.get());
  ASSERT_NE(id, "");
  RunResult r = RunOnChannel(stranger.end.get(), id);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "0 cloexec=0 nonblock=0\n");
  EXPECT_EQ(stranger.Received(), 0);
  EXPECT_FALSE(NonBlocking(stranger.end.get()));
  r = RunOnChannel(ours.end.get(), id);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "3 cloexec=1 nonblock=1\n");
  EXPECT_EQ(ours.Received(), 3);
  EXPECT_EQ(stranger.Received(), 0);
}

// Without CTRUN_HEARTBEAT_ID (an older launcher, or a user's own channel; an empty value reads as
// unset) the kind of fd alone decides, as before: a socket gets beats (a regular file does not,
// RegularFileFdIsNotWrittenTo). A value that does not parse names no fd.
TEST(Heartbeat, WithoutAnIdTheKindOfFdDecides) {
  Channel channel;
  RunResult r = RunOnChannel(channel.end.get(), std::nullopt);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "3 cloexec=1 nonblock=1\n");
  EXPECT_EQ(channel.Received(), 3);
  r = RunOnChannel(channel.end.get(), "");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "3 cloexec=1 nonblock=1\n");
  EXPECT_EQ(channel.Received(), 3);
  Channel other;
  const std::string id = IdOf(other.end.get());
  for (const std::string& bad : {std::string("garbage"), id + "x", id.substr(0, id.find(':')), ":" + id}) {
    r = RunOnChannel(other.end.get(), bad);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "0 cloexec=0 nonblock=0\n") << bad;
    EXPECT_EQ(other.Received(), 0) << bad;
  }
}

// A regular file is never a launcher's channel: it is what a child process that inherited the
// variable but not the (CLOEXEC) fd finds at that number after its own first open().
TEST(Heartbeat, RegularFileFdIsNotWrittenTo) {
  TempDir dir;
  const std::string path = dir / "unrelated.txt";
  auto r = RunCommand({"/bin/sh", "-c", std::string("exec 9>") + path + "; exec \"$0\" heartbeat 3", WORKER_HELPER},
                      {"CTRUN_HEARTBEAT_FD=9", "CTRUN_HEARTBEAT_FILE="});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "0\n");  // disabled
  EXPECT_EQ(ReadFileOr(path, "missing"), "");
}

TEST(Heartbeat, ClosedPipeReaderDoesNotKillTheWorker) {
  // fd 9 is a pipe whose read end is already closed: every beat gets EPIPE, never SIGPIPE.
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  ::close(p[0]);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::dup2(p[1], 9);  // dup2 clears CLOEXEC on the new fd
    ::setenv("CTRUN_HEARTBEAT_FD", "9", 1);
    ::execl(WORKER_HELPER, WORKER_HELPER, "heartbeat", "3", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(p[1]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace ctrun::worker
