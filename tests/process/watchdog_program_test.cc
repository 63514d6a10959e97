// The ct-watchdog program (src/process/watchdog_helper.c) as Watchdog::Start starts it, and its
// contract on its own: groups killed when the pipe ends without 'Q', nothing killed after one,
// the cleanup exec through fd 4. ctrun's SIGKILL tests (tests/reliability/hygiene_test.cc) run it
// and the forked watchdog end to end.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "helpers/test_util.h"
#include "process/watchdog.h"

namespace ctrun {
namespace {

using namespace std::chrono_literals;
using ctrun::testing::ProcessAlive;
using ctrun::testing::ReadFileOr;
using ctrun::testing::WaitFor;

#ifdef CT_WATCHDOG
constexpr const char* kProgram = CT_WATCHDOG;
#else
constexpr const char* kProgram = nullptr;
#endif

// A child of this process leading a group of its own, asleep until killed.
pid_t SleepingGroup() {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    for (;;) ::pause();
  }
  ::setpgid(pid, pid);
  return pid;
}

// Whether `pid`, a child of this process, has exited, reaping it if so; false while it runs.
bool Exited(pid_t pid, int* status = nullptr) {
  int st = 0;
  if (::waitpid(pid, &st, WNOHANG) != pid) return false;
  if (status) *status = st;
  return true;
}

void Kill(pid_t pid) {
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

std::set<int> OpenFds(pid_t pid) {
  std::set<int> fds;
  for (const auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd"))
    fds.insert(std::stoi(e.path().filename().string()));
  return fds;
}

// The SigIgn mask of /proc/PID/status (bit N-1 for signal N); 0 when unreadable.
unsigned long long IgnoredSignals(pid_t pid) {
  const std::string status = ReadFileOr("/proc/" + std::to_string(pid) + "/status");
  const size_t at = status.find("SigIgn:\t");
  return at == std::string::npos ? 0 : std::stoull(status.substr(at + 8, 16), nullptr, 16);
}

class WatchdogProgram : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kProgram == nullptr) GTEST_SKIP() << "ct-watchdog is not built on this architecture";
    // As in ctrun: a watchdog gone too early fails an expectation instead of killing the test
    // at the write of 'Q'.
    ::signal(SIGPIPE, SIG_IGN);
  }
};

TEST_F(WatchdogProgram, IsWhatStartRunsInAGroupOfItsOwnWithOnlyItsPipe) {
  pid_t pid = -1;
  {
    auto w = Watchdog::Start(kProgram, {});
    ASSERT_TRUE(w.ok()) << w.message();
    pid = w->pid();
    EXPECT_EQ(w->why_forked(), "");
    // posix_spawn returns once the exec has replaced the child's memory, a moment before the
    // kernel renames it; the group and the fds are the program's first steps.
    const std::string proc = "/proc/" + std::to_string(pid);
    EXPECT_TRUE(WaitFor([&] { return ReadFileOr(proc + "/comm") == "ct-watchdog\n"; }, 5s)) << ReadFileOr(proc + "/comm");
    EXPECT_EQ(std::filesystem::read_symlink(proc + "/exe"), std::filesystem::canonical(kProgram));
    // In its own group before its first instruction (POSIX_SPAWN_SETPGROUP).
    EXPECT_EQ(::getpgid(pid), pid);
    EXPECT_TRUE(WaitFor([&] { return OpenFds(pid) == std::set<int>{0, 1, 2, 3}; }, 5s));
    // What a terminal or a killpg aimed at ctrun sends does not take it, once it has said so.
    const unsigned long long hup_int_term = (1ull << (SIGHUP - 1)) | (1ull << (SIGINT - 1)) | (1ull << (SIGTERM - 1));
    ASSERT_TRUE(WaitFor([&] { return (IgnoredSignals(pid) & hup_int_term) == hup_int_term; }, 5s))
        << std::hex << IgnoredSignals(pid);
    ASSERT_EQ(::kill(pid, SIGTERM), 0);
    ASSERT_EQ(::kill(pid, SIGINT), 0);
    ASSERT_EQ(::kill(pid, SIGHUP), 0);
    EXPECT_FALSE(WaitFor([&] { return !ProcessAlive(pid); }, 200ms));
  }  // clean shutdown: 'Q', then EOF
  int status = 0;
  ASSERT_TRUE(WaitFor([&] { return Exited(pid, &status); }, 5s));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST_F(WatchdogProgram, AfterACleanShutdownNoRegisteredGroupIsKilled) {
  const pid_t group = SleepingGroup();
  pid_t pid = -1;
  {
    auto w = Watchdog::Start(kProgram, {});
    ASSERT_TRUE(w.ok()) << w.message();
    pid = w->pid();
    AnnounceGroup(w->fd(), group);
  }
  ASSERT_TRUE(WaitFor([&] { return Exited(pid); }, 5s));
  EXPECT_TRUE(ProcessAlive(group));
  Kill(group);
}

// The agent's death, without a SIGKILL of this test: a child "agent" starts the watchdog,
// registers two groups, removes one, and _exits without its clean shutdown.
TEST_F(WatchdogProgram, WhenTheAgentDiesItKillsEveryGroupStillRegistered) {
  const pid_t kept = SleepingGroup(), removed = SleepingGroup();
  int report[2];
  ASSERT_EQ(::pipe(report), 0);
  const pid_t agent = ::fork();
  if (agent == 0) {
    auto w = Watchdog::Start(kProgram, {});
    if (!w.ok() || !w->why_forked().empty()) ::_exit(1);
    AnnounceGroup(w->fd(), kept);
    AnnounceGroup(w->fd(), removed);
    w->RemoveGroup(removed);
    const pid_t wd = w->pid();
    (void)::write(report[1], &wd, sizeof wd);
    ::_exit(0);  // no 'Q': as if SIGKILLed
  }
  ::close(report[1]);
  pid_t watchdog = 0;
  ASSERT_EQ(::read(report[0], &watchdog, sizeof watchdog), static_cast<ssize_t>(sizeof watchdog));
  ::close(report[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(agent, &status, 0), agent);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_TRUE(WaitFor([&] { return Exited(kept); }, 5s)) << "the registered group runs on";
  EXPECT_TRUE(ProcessAlive(removed)) << "a removed group was killed";
  Kill(removed);
  if (!Exited(kept)) Kill(kept);
}

// The program started by hand the way Start does: fd 3 the pipe, fd 4 a program to exec after
// the kill (here /bin/sh, where ctrun passes itself), argv[1...] its argv.
pid_t SpawnProgram(int pipe_read, int exe_fd, const std::vector<std::string>& cleanup_argv) {
  posix_spawn_file_actions_t actions;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_adddup2(&actions, pipe_read, 3);
  ::posix_spawn_file_actions_adddup2(&actions, exe_fd, 4);
  std::vector<std::string> args{"ct-watchdog"};
  args.insert(args.end(), cleanup_argv.begin(), cleanup_argv.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int err = ::posix_spawn(&pid, kProgram, &actions, nullptr, argv.data(), environ);
  ::posix_spawn_file_actions_destroy(&actions);
  return err == 0 ? pid : -1;
}

TEST_F(WatchdogProgram, RunsTheCleanupOnlyAfterAnEndWithoutQuit) {
  ctrun::testing::TempDir dir;
  for (const bool quit : {true, false}) {
    SCOPED_TRACE(quit ? "with Q" : "without Q");
    const std::string marker = dir / (quit ? "after-quit" : "after-death");
    int fds[2];
    ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
    const int r = ::fcntl(fds[0], F_DUPFD_CLOEXEC, 10), exe = ::open("/bin/sh", O_PATH | O_CLOEXEC);
    const int exe_high = ::fcntl(exe, F_DUPFD_CLOEXEC, 10);
    ::close(fds[0]);
    ::close(exe);
    const pid_t pid = SpawnProgram(r, exe_high, {"sh", "-c", "echo \"$0\" > \"$1\"", "cleanup", marker});
    ::close(r);
    ::close(exe_high);
    ASSERT_GT(pid, 0);
    if (quit) {
      const WatchdogMessage m{'Q', 0};
      ASSERT_EQ(::write(fds[1], &m, sizeof m), static_cast<ssize_t>(sizeof m));
    }
    ::close(fds[1]);
    int status = 0;
    ASSERT_TRUE(WaitFor([&] { return Exited(pid, &status); }, 5s));
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    EXPECT_EQ(ReadFileOr(marker, "(none)"), quit ? "(none)" : "cleanup\n");
  }
}

}  // namespace
}  // namespace ctrun
