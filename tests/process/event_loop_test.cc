// EventLoop and PosixSpawner against the real kernel.
#include "sys/event_loop.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "process/reaper.h"
#include "process/spawn_methods.h"
#include "process/spawner.h"
#include "sys/posix_util.h"

namespace ctrun {
namespace {

using namespace std::chrono_literals;

TEST(EventLoop, TimersFireInDeadlineOrderAndCancel) {
  EventLoop loop;
  std::vector<int> order;
  auto now = loop.Now();
  loop.AddTimer(now + 3ms, [&] { order.push_back(3); });
  auto id = loop.AddTimer(now + 2ms, [&] { order.push_back(2); });
  loop.AddTimer(now + 1ms, [&] { order.push_back(1); });
  loop.AddTimer(now + 4ms, [&] { loop.Stop(); });
  loop.CancelTimer(id);
  loop.Run();
  EXPECT_EQ(order, (std::vector<int>{1, 3}));
}

TEST(EventLoop, FdHandlerCanRemoveItself) {
  EventLoop loop;
  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC | O_NONBLOCK), 0);
  int calls = 0;
  ASSERT_TRUE(loop.AddFd(p[0], EPOLLIN, [&](uint32_t) {
    ++calls;
    loop.RemoveFd(p[0]);
  }).ok());
  ASSERT_EQ(write(p[1], "x", 1), 1);
  loop.RunOnce(100ms);
  loop.RunOnce(10ms);
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(loop.HasFd(p[0]));
  close(p[0]);
  close(p[1]);
}

TEST(EventLoop, RunOnceHonoursMaxWait) {
  EventLoop loop;
  auto t0 = loop.Now();
  EXPECT_EQ(loop.RunOnce(20ms), 0);
  EXPECT_GE(loop.Now() - t0, 19ms);
}

// Each spawner test runs once per way of making children: vfork-style and fork.
class PosixSpawnerMethods : public ::testing::TestWithParam<PosixSpawner::Method> {};

INSTANTIATE_TEST_SUITE_P(Methods, PosixSpawnerMethods, SpawnMethods(), SpawnMethodName);

TEST_P(PosixSpawnerMethods, ExecFailureIsReportedWith127) {
  PosixSpawner sp(PosixSpawner::kDefaultExecWait, GetParam());
  SpawnSpec spec;
  spec.argv = {"/nonexistent/prog"};
  SpawnedProcess proc;
  SpawnError err;
  ASSERT_FALSE(sp.Spawn(spec, &proc, &err));
  EXPECT_EQ(err.shell_code, 127);
  EXPECT_EQ(err.err, ENOENT);
  EXPECT_EQ(err.message, "cannot execute /nonexistent/prog: No such file or directory");
}

TEST_P(PosixSpawnerMethods, NotExecutableIs126) {
  PosixSpawner sp(PosixSpawner::kDefaultExecWait, GetParam());
  SpawnSpec spec;
  spec.argv = {"/etc/hostname"};
  SpawnedProcess proc;
  SpawnError err;
  ASSERT_FALSE(sp.Spawn(spec, &proc, &err));
  EXPECT_EQ(err.shell_code, 126);
}

TEST_P(PosixSpawnerMethods, PipesAndProcessGroupAndEnv) {
  PosixSpawner sp(PosixSpawner::kDefaultExecWait, GetParam());
  SpawnSpec spec;
  spec.executable = "/bin/sh";  // the caller searches PATH, never the spawner
  spec.argv = {"sh", "-c", "echo out:$FOO; echo err >&2; ps -o pgid= -p $$"};
  spec.env = {"FOO=bar", "PATH=/usr/bin:/bin"};
  spec.stdout_target = StdioTarget::Pipe();
  spec.stderr_target = StdioTarget::Pipe();
  SpawnedProcess proc;
  SpawnError err;
  ASSERT_TRUE(sp.Spawn(spec, &proc, &err)) << err.message;
  EXPECT_TRUE(proc.pidfd.valid());
  int st;
  ASSERT_EQ(waitpid(proc.pid, &st, 0), proc.pid);
  SetNonBlocking(proc.stdout_pipe.get(), false);
  std::string out;
  char buf[256];
  ssize_t n;
  while ((n = read(proc.stdout_pipe.get(), buf, sizeof buf)) > 0) out.append(buf, n);
  EXPECT_EQ(out.substr(0, 8), "out:bar\n");
  EXPECT_EQ(std::stoi(out.substr(8)), proc.pid);  // leads its own process group
}

TEST_P(PosixSpawnerMethods, FileTargetsAreWrittenDirectly) {
  char tmpl[] = "/tmp/ctrun_spawn_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  std::string path = std::string(tmpl) + "/out.log";
  PosixSpawner sp(PosixSpawner::kDefaultExecWait, GetParam());
  SpawnSpec spec;
  spec.argv = {"/bin/echo", "hello"};
  spec.stdout_target = StdioTarget::File(path);
  SpawnedProcess proc;
  SpawnError err;
  ASSERT_TRUE(sp.Spawn(spec, &proc, &err));
  int st;
  waitpid(proc.pid, &st, 0);
  std::string got;
  ASSERT_TRUE(ReadFile(path, &got));
  EXPECT_EQ(got, "hello\n");
  unlink(path.c_str());
  rmdir(tmpl);
}

TEST(Reaper, DrainReportsExitStatuses) {
  pid_t a = fork();
  if (a == 0) _exit(4);
  int st;
  // Wait until it is a zombie, then drain.
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, a, &info, WEXITED | WNOWAIT), 0);
  std::vector<std::pair<pid_t, ExitStatus>> got;
  DrainExitedChildren([&](pid_t p, ExitStatus s) { got.emplace_back(p, s); });
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].first, a);
  EXPECT_EQ(got[0].second, ExitStatus::Exited(4));
  (void)st;
}

}  // namespace
}  // namespace ctrun
