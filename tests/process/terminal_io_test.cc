// The terminal pieces against real kernel objects: pty pairs (exact bytes, EIO after the output
// when the worker is gone, window size), the spawner's kPty and stdin pipe, and the forwarding of
// terminal input to rank 0's pipe.
#include <fcntl.h>
#include <signal.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>

#include <gtest/gtest.h>

#include "agent/stdin_forwarder.h"
#include "helpers/loop_util.h"
#include "process/spawner.h"
#include "sys/posix_util.h"
#include "sys/pty.h"

namespace ctrun {
namespace {

using namespace std::chrono_literals;
using testing::RunUntil;

// Everything readable from fd until EOF/EIO (blocking reads; the writer is done).
std::string ReadToEnd(int fd, int* last_errno) {
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = RetryOnEintr([&] { return ::read(fd, buf, sizeof buf); });
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
      continue;
    }
    *last_errno = n == 0 ? 0 : errno;
    return out;
  }
}

TEST(Pty, BytesArriveUnchangedAndEioFollowsTheLastOneAfterTheSlaveCloses) {
  auto p = OpenPty(WindowSize{30, 100});
  ASSERT_TRUE(p.ok()) << p.message();
  EXPECT_EQ(::fcntl(p->master.get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  EXPECT_EQ(::fcntl(p->slave.get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  EXPECT_EQ(GetWindowSize(p->slave.get()), (WindowSize{30, 100}));
  const std::string text = "line one\nno newline \r progress\t\x1b[1mbold\x1b[0m";
  ASSERT_TRUE(WriteAll(p->slave.get(), text.data(), text.size()));
  p->slave.reset();  // the worker is gone
  int err = -1;
  EXPECT_EQ(ReadToEnd(p->master.get(), &err), text);  // no "\r\n" for "\n": OPOST is off
  EXPECT_EQ(err, EIO);
}

TEST(Pty, SpawnerGivesTheChildAPtyAsStdoutAndAPipeAsStdin) {
  PosixSpawner spawner;
  SpawnSpec spec;
  spec.argv = {"/bin/sh", "-c",
               "exec 3>&1; read line; [ -t 1 ] && echo \"tty $line $(stty size <&3)\"; [ -t 0 ] || echo pipe-in"};
  spec.stdin_target = StdioTarget::Pipe();
  spec.stdout_target = StdioTarget::Pty(33, 77);
  SpawnedProcess proc;
  SpawnError error;
  ASSERT_TRUE(spawner.Spawn(spec, &proc, &error)) << error.message;
  ASSERT_TRUE(proc.stdin_pipe.valid());
  ASSERT_TRUE(proc.stdout_pipe.valid());
  ASSERT_TRUE(WriteAll(proc.stdin_pipe.get(), "hi\n", 3));
  proc.stdin_pipe.reset();
  int err = -1;
  EXPECT_EQ(ReadToEnd(proc.stdout_pipe.get(), &err), "tty hi 33 77\npipe-in\n");
  EXPECT_EQ(err, EIO);
  int st;
  ASSERT_EQ(::waitpid(proc.pid, &st, 0), proc.pid);
  EXPECT_TRUE(WIFEXITED(st));
  // Still its own process group in ctrun's session: no setsid.
  // (The child is gone; its pgid was checked by the spawner's contract tests: pid == pgid.)
}

// A pty slave plays ctrun's terminal stdin; the test types on the master.
struct FakeTerminal {
  FakeTerminal() {
    auto p = OpenPty(WindowSize{24, 80});
    EXPECT_TRUE(p.ok());
    master = std::move(p->master);
    slave = std::move(p->slave);
  }
  void Type(const std::string& s) { EXPECT_TRUE(WriteAll(master.get(), s.data(), s.size())); }
  UniqueFd master, slave;
};

struct Pipe {
  Pipe() {
    int fds[2];
    EXPECT_EQ(::pipe2(fds, O_CLOEXEC | O_NONBLOCK), 0);
    read_end.reset(fds[0]);
    write_end.reset(fds[1]);
  }
  std::string ReadNow() {
    char buf[4096];
    ssize_t n = ::read(read_end.get(), buf, sizeof buf);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  }
  UniqueFd read_end, write_end;
};

TEST(StdinForwarder, NotATerminalNoForwarder) {
  EventLoop loop;
  Pipe p;
  EXPECT_EQ(StdinForwarder::Create(loop, p.read_end.get()), nullptr);
}

// A forwarder reading a fake terminal, and rank 0's stdin pipe.
struct ForwarderTest : ::testing::Test {
  void SetUp() override {
    fwd = StdinForwarder::Create(loop, term.slave.get());
    ASSERT_NE(fwd, nullptr);
  }
  // Runs the loop until rank 0 has read `want` in all.
  bool Rank0Reads(const std::string& want) {
    std::string got;
    return RunUntil(loop, [&] { return (got += rank0.ReadNow()) == want; }, 5s);
  }
  EventLoop loop;
  FakeTerminal term;
  std::unique_ptr<StdinForwarder> fwd;
  Pipe rank0;
};

TEST_F(ForwarderTest, TypedLinesReachTheTargetAndCtrlDClosesIt) {
  fwd->SetTarget(std::move(rank0.write_end));
  term.Type("c\n");
  ASSERT_TRUE(Rank0Reads("c\n"));
  term.Type("\x04");  // Ctrl-D at the start of a line: end of file
  ASSERT_TRUE(RunUntil(loop, [&] { return !fwd->has_target(); }, 5s));
  char c;
  EXPECT_EQ(::read(rank0.read_end.get(), &c, 1), 0);  // rank 0 reads EOF
}

TEST_F(ForwarderTest, NothingIsConsumedWithoutATarget) {
  term.Type("early\n");
  testing::RunFor(loop, 50ms);
  fwd->SetTarget(std::move(rank0.write_end));  // e.g. the restarted rank 0
  ASSERT_TRUE(Rank0Reads("early\n"));
}

TEST_F(ForwarderTest, AGoneReaderDropsTheTarget) {
  ::signal(SIGPIPE, SIG_IGN);  // as in ctrun (BlockAgentSignals): EPIPE, not a dead process
  fwd->SetTarget(std::move(rank0.write_end));
  rank0.read_end.reset();  // rank 0 exited
  term.Type("x\n");
  EXPECT_TRUE(RunUntil(loop, [&] { return !fwd->has_target(); }, 5s));
}

// `ctrun ... &`, then `fg`: the shell gives ctrun's process group the terminal and sends no
// SIGCONT (the job was running). The forwarder's read had failed (EIO) in the background; the
// next input finds ctrun in the foreground again, and what was typed reaches rank 0. The child
// plays ctrun: a session of its own on the pty, with a stand-in shell's group in the foreground
// first.
TEST(StdinForwarderJobControl, ForegroundAgainWithoutSigcontResumesReading) {
  FakeTerminal term;
  Pipe from_child;
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto run = [&]() -> int {
      ::signal(SIGTTIN, SIG_IGN);  // as blocked in ctrun: a background read fails with EIO
      ::signal(SIGTTOU, SIG_IGN);
      if (::setsid() < 0 || ::ioctl(term.slave.get(), TIOCSCTTY, 0) != 0) return 10;
      const pid_t shell = ::fork();
      if (shell == 0) {
        ::setpgid(0, 0);
        ::pause();
        ::_exit(0);
      }
      ::setpgid(shell, shell);
      struct KillShell {
        pid_t pid;
        ~KillShell() { ::kill(pid, SIGKILL); }
      } kill_shell{shell};
      if (::tcsetpgrp(term.slave.get(), shell) != 0) return 11;  // ctrun is in the background
      EventLoop loop;
      auto fwd = StdinForwarder::Create(loop, term.slave.get());
      if (!fwd) return 12;
      Pipe rank0;
      fwd->SetTarget(std::move(rank0.write_end));
      if (::write(from_child.write_end.get(), "r", 1) != 1) return 13;  // parent types "a\n" now
      if (!RunUntil(loop, [&] { return fwd->in_background(); }, 5s)) return 14;
      if (::tcsetpgrp(term.slave.get(), ::getpgrp()) != 0) return 15;  // `fg`: no SIGCONT
      if (::write(from_child.write_end.get(), "f", 1) != 1) return 16;  // parent types "b\n" now
      std::string got;
      if (!RunUntil(loop, [&] { return (got += rank0.ReadNow()) == "a\nb\n"; }, 5s)) return 17;
      return 0;
    };
    ::_exit(run());
  }
  auto wait_for = [&](char want) {
    pollfd p{from_child.read_end.get(), POLLIN, 0};
    char c = 0;
    return ::poll(&p, 1, 10000) == 1 && ::read(from_child.read_end.get(), &c, 1) == 1 && c == want;
  };
  ASSERT_TRUE(wait_for('r'));
  term.Type("a\n");
  ASSERT_TRUE(wait_for('f'));
  term.Type("b\n");
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace ctrun
