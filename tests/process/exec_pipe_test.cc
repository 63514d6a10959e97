// The spawner's exec-confirmation pipe: every wait on it ends by its deadline.
#include "process/exec_pipe.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cerrno>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace ctrun {
namespace {

using namespace std::chrono_literals;

struct Pipe {
  Pipe() { EXPECT_EQ(pipe2(fds, O_CLOEXEC), 0); }
  ~Pipe() {
    CloseWrite();
    close(fds[0]);
  }
  void CloseWrite() {
    if (fds[1] >= 0) close(fds[1]);
    fds[1] = -1;
  }
  int fds[2] = {-1, -1};
};

TimePoint In(Duration d) { return std::chrono::steady_clock::now() + d; }

TEST(ExecPipe, ClosedWriteEndMeansExeced) {
  Pipe p;
  p.CloseWrite();
  ChildError e{};
  EXPECT_EQ(AwaitExec(p.fds[0], In(1s), &e), ExecOutcome::kExeced);
}

TEST(ExecPipe, RecordMeansFailedAndNamesTheStage) {
  Pipe p;
  const ChildError sent{ChildStage::kExec, ENOENT};
  ASSERT_EQ(write(p.fds[1], &sent, sizeof sent), static_cast<ssize_t>(sizeof sent));
  ChildError got{};
  EXPECT_EQ(AwaitExec(p.fds[0], In(1s), &got), ExecOutcome::kFailed);
  EXPECT_EQ(got.stage, ChildStage::kExec);
  EXPECT_EQ(got.err, ENOENT);
  EXPECT_STREQ(ChildStageName(ChildStage::kDup), "redirect stdio");
}

// An exec stuck in the kernel keeps the write end open and writes nothing: the wait ends at the
// deadline instead of blocking the agent's loop.
TEST(ExecPipe, OpenSilentWriteEndEndsAtTheDeadline) {
  Pipe p;
  ChildError e{};
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(AwaitExec(p.fds[0], In(50ms), &e), ExecOutcome::kUnconfirmed);
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, 45ms);
  EXPECT_LT(waited, 2s);
  EXPECT_EQ(AwaitExec(p.fds[0], In(-1s), &e), ExecOutcome::kUnconfirmed);  // past deadline: no wait
}

TEST(ExecPipe, ChildExitIsAwaitedOnlyUntilTheDeadline) {
  Pipe p;
  EXPECT_FALSE(AwaitChildExit(p.fds[0], In(30ms)));  // the "child" still holds the write end
  p.CloseWrite();
  EXPECT_TRUE(AwaitChildExit(p.fds[0], In(1s)));
}

TEST(ExecPipe, ReportChildFailureWritesTheRecordAndExits127) {
  Pipe p;
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    errno = EACCES;
    ReportChildFailure(p.fds[1], ChildStage::kSetpgid);
  }
  p.CloseWrite();
  ChildError e{};
  ASSERT_EQ(AwaitExec(p.fds[0], In(10s), &e), ExecOutcome::kFailed);
  EXPECT_EQ(e.stage, ChildStage::kSetpgid);
  EXPECT_EQ(e.err, EACCES);
  EXPECT_TRUE(AwaitChildExit(p.fds[0], In(10s)));
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 127);
}

TEST(ExecPipe, ExplainExecErrorNamesAMissingShebangInterpreter) {
  char dir[] = "/tmp/ctrun_exec_XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string script = std::string(dir) + "/run";
  {
    std::ofstream(script) << "#!  /no/such/interp -u\nprint(1)\n";
  }
  EXPECT_EQ(ExplainExecError(script, ENOENT), "the interpreter its #! line names, /no/such/interp: No such file or directory");
  EXPECT_EQ(ExplainExecError(script, EACCES), "Permission denied");  // only ENOENT is ambiguous
  EXPECT_EQ(ExplainExecError(std::string(dir) + "/missing", ENOENT), "No such file or directory");
  {
    std::ofstream(script) << "plain text\n";
  }
  EXPECT_EQ(ExplainExecError(script, ENOENT), "No such file or directory");
  ::unlink(script.c_str());
  ::rmdir(dir);
}

}  // namespace
}  // namespace ctrun
