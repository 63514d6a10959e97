// PosixSpawner's child set-up against the real kernel, for vfork-style and forked children alike:
// the signal state a worker starts with, and the two ways into the rank's cgroup (clone3
// CLONE_INTO_CGROUP, and fork + cgroup.procs where clone3 cannot place the child), including an
// exec failure on each path.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "helpers/terminal_session.h"
#include "helpers/test_util.h"
#include "process/spawn_methods.h"
#include "process/spawner.h"
#include "process/watchdog.h"
#include "sys/cgroup.h"
#include "sys/high_fd.h"
#include "sys/posix_util.h"
#include "sys/signals.h"

namespace ctrun {
namespace {

// What a started child prints on its stdout pipe until EOF; the child is reaped after.
std::string ReadToEndAndReap(SpawnedProcess& proc) {
  SetNonBlocking(proc.stdout_pipe.get(), false);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = RetryOnEintr([&] { return ::read(proc.stdout_pipe.get(), buf, sizeof buf); })) > 0) out.append(buf, n);
  int st;
  RetryOnEintr([&] { return ::waitpid(proc.pid, &st, 0); });
  return out;
}

// Runs spec (stdout to a pipe) to its end; returns what it printed.
std::string RunToEnd(PosixSpawner& sp, SpawnSpec spec) {
  spec.stdout_target = StdioTarget::Pipe();
  SpawnedProcess proc;
  SpawnError err;
  if (!sp.Spawn(spec, &proc, &err)) return "spawn failed: " + err.message;
  return ReadToEndAndReap(proc);
}

// The hex mask of a "Sig...:" line of /proc/<pid>/status text.
unsigned long long StatusMask(const std::string& status, const std::string& key) {
  std::istringstream in(status);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + ":", 0) == 0) return std::stoull(line.substr(key.size() + 1), nullptr, 16);
  return ~0ULL;
}

bool KernelAtLeast(int major, int minor) {
  utsname u{};
  if (::uname(&u) != 0) return false;
  int ma = 0, mi = 0;
  std::sscanf(u.release, "%d.%d", &ma, &mi);
  return ma > major || (ma == major && mi >= minor);
}

// ctrun's own cgroup sub-tree with one rank, or a skip where it cannot be made (not root, no
// writable cgroup2 mount).
std::unique_ptr<WorkerCgroups> RankCgroup(WorkerCgroups::Layout layout = WorkerCgroups::Layout::kRankDirs) {
  auto cg = WorkerCgroups::Create(layout);
  if (!cg.ok()) return nullptr;
  if (!cg.value()->PrepareAttempt(1).ok()) return nullptr;
  return std::move(cg.value());
}

// The end of the /proc/<pid>/cgroup line of a child in rank 0's cgroup: ctrun-<pid>/rank-0 where
// ranks have directories of their own, ctrun-<pid> itself elsewhere.
std::string RankCgroupLine(const WorkerCgroups& cg) {
  return "/ctrun-" + std::to_string(::getpid()) + (cg.rank_dirs() ? "/rank-0" : "") + "\n";
}

// Every test runs once per way of making children: vfork-style and fork.
class PosixSpawnerChild : public ::testing::TestWithParam<PosixSpawner::Method> {};

INSTANTIATE_TEST_SUITE_P(Methods, PosixSpawnerChild, SpawnMethods(), SpawnMethodName);

TEST_P(PosixSpawnerChild, GetsTheOriginalSignalMaskAndNoIgnoredSignals) {
  // As in ctrun: signals blocked for the signalfd, SIGPIPE ignored; the worker gets neither.
  ASSERT_TRUE(BlockAgentSignals({SIGTERM, SIGUSR1, SIGHUP}).ok());
  ::signal(SIGUSR2, SIG_IGN);
  PosixSpawner sp(PosixSpawner::kDefaultExecWait, GetParam());
  SpawnSpec spec;
  spec.argv = {"/bin/cat", "/proc/self/status"};
  std::unique_ptr<WorkerCgroups> cg = RankCgroup();  // the clone3 path where it exists
  if (cg) spec.cgroup_dir_fd = cg->dir_fd(0);
  const std::string status = RunToEnd(sp, spec);
  EXPECT_EQ(StatusMask(status, "SigBlk"), 0ULL) << status;
  EXPECT_EQ(StatusMask(status, "SigIgn"), 0ULL) << status;
  ::signal(SIGUSR2, SIG_DFL);
  ::signal(SIGPIPE, SIG_DFL);
  sigset_t all;
  sigemptyset(&all);
  ::sigprocmask(SIG_SETMASK, &all, nullptr);
}

TEST_P(PosixSpawnerChild, CloneIntoCgroupPlacesTheChildWithoutCgroupProcs) {
  std::unique_ptr<WorkerCgroups> cg = RankCgroup();
  if (!cg) GTEST_SKIP() << "no cgroup v2 sub-tree can be made here (not root?)";
  if (!KernelAtLeast(5, 7)) GTEST_SKIP() << "no CLONE_INTO_CGROUP before Linux 5.7";
  PosixSpawner sp(PosixSpawner::kDefaultExecWait, GetParam());
  SpawnSpec spec;
  spec.argv = {"/bin/cat", "/proc/self/cgroup"};
  spec.cgroup_dir_fd = cg->dir_fd(0);  // no cgroup.procs fd: only clone3 can have placed it
  const std::string out = RunToEnd(sp, spec);
  EXPECT_NE(out.find(RankCgroupLine(*cg)), std::string::npos) << out;
}

// Without the memory controller (no per-rank memory.events to read) there are no rank
// directories: every rank's fds lead to ctrun-<pid> itself, which ends an attempt the same way.
TEST_P(PosixSpawnerChild, WithoutPerRankMemoryRanksShareTheJobCgroup) {
  std::unique_ptr<WorkerCgroups> cg = RankCgroup(WorkerCgroups::Layout::kAuto);
  if (!cg) GTEST_SKIP() << "no cgroup v2 sub-tree can be made here (not root?)";
  if (cg->per_rank_memory()) GTEST_SKIP() << "the memory controller is offered here: ranks get directories";
  ASSERT_TRUE(cg->PrepareAttempt(3).ok());
  EXPECT_FALSE(cg->rank_dirs());
  EXPECT_FALSE(std::filesystem::exists(cg->dir() + "/rank-0"));
  PosixSpawner sp(PosixSpawner::kDefaultExecWait, GetParam());
  for (int r = 0; r < 3; ++r) {
    ASSERT_GE(cg->procs_fd(r), 0);
    SpawnSpec spec;
    spec.argv = {"/bin/cat", "/proc/self/cgroup"};
    spec.cgroup_dir_fd = cg->dir_fd(r);
    spec.cgroup_procs_fd = cg->procs_fd(r);
    const std::string out = RunToEnd(sp, spec);
    EXPECT_NE(out.find(RankCgroupLine(*cg)), std::string::npos) << "rank " << r << ": " << out;
  }
  SpawnSpec left;  // what an attempt leaves behind is killed there too
  left.argv = {"/bin/sleep", "100"};
  left.cgroup_dir_fd = cg->dir_fd(2);
  left.cgroup_procs_fd = cg->procs_fd(2);
  SpawnedProcess proc;
  SpawnError err;
  ASSERT_TRUE(sp.Spawn(left, &proc, &err)) << err.message;
  const WorkerCgroups::AttemptEnd end = cg->EndAttempt(std::chrono::seconds(5));
  EXPECT_EQ(end.leftover, 1);
  EXPECT_TRUE(end.emptied);
  int st = 0;
  ASSERT_EQ(RetryOnEintr([&] { return ::waitpid(proc.pid, &st, 0); }), proc.pid);
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << st;
}

// Without cgroup.kill (Linux < 5.14) the sub-tree is killed pid by pid from cgroup.procs, and a
// process forked after its parent was listed escapes that pass. Shells forking sleepers as fast
// as they can are such parents: the sub-tree is killed again until it is empty.
TEST_P(PosixSpawnerChild, WithoutCgroupKillWhatIsForkedDuringTheKillIsKilledToo) {
  std::unique_ptr<WorkerCgroups> cg = RankCgroup();
  if (!cg) GTEST_SKIP() << "no cgroup v2 sub-tree can be made here (not root?)";
  PosixSpawner sp(PosixSpawner::kDefaultExecWait, GetParam());
  SpawnSpec spec;
  spec.argv = {"/bin/sh", "-c", "for i in 1 2 3 4 5 6 7 8; do (while :; do sleep 1000 & done) & done; wait"};
  spec.cgroup_dir_fd = cg->dir_fd(0);
  spec.cgroup_procs_fd = cg->procs_fd(0);
  SpawnedProcess proc;
  SpawnError err;
  ASSERT_TRUE(sp.Spawn(spec, &proc, &err)) << err.message;
  const std::string procs = cg->dir() + (cg->rank_dirs() ? "/rank-0" : "") + "/cgroup.procs";
  auto listed = [&] {
    std::ifstream in(procs);
    return static_cast<int>(std::count(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>(), '\n'));
  };
  ASSERT_TRUE(testing::WaitFor([&] { return listed() >= 200; }, std::chrono::seconds(10))) << listed();
  UseCgroupKillForTesting(false);
  const WorkerCgroups::AttemptEnd end = cg->EndAttempt(std::chrono::seconds(10));
  UseCgroupKillForTesting(true);
  EXPECT_TRUE(end.emptied) << listed() << " left";
  int st = 0;
  ASSERT_EQ(RetryOnEintr([&] { return ::waitpid(proc.pid, &st, 0); }), proc.pid);
}

// A child of this process whose pid is `pid`, made by setting the PID namespace's last pid
// (root only); it waits in pause(). -1 when the number went to another process first or the
// last pid cannot be set (the stray child is killed).
pid_t ForkWithPid(pid_t pid) {
  for (int attempt = 0; attempt < 20; ++attempt) {
    {
      std::ofstream last("/proc/sys/kernel/ns_last_pid");
      if (!(last << pid - 1 << std::flush)) return -1;
    }
    const pid_t child = ::fork();
    if (child == 0) {
      for (;;) ::pause();
    }
    if (child == pid || child < 0) return child;
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
  }
  return -1;
}

// Without cgroup.kill the sub-tree is killed pid by pid from cgroup.procs. A listed process that
// exits and is reaped before its kill may leave its number to a stranger outside the cgroup: the
// stranger is not killed.
TEST_P(PosixSpawnerChild, WithoutCgroupKillAPidTakenAgainAfterTheListingIsNotKilled) {
  std::unique_ptr<WorkerCgroups> cg = RankCgroup();
  if (!cg) GTEST_SKIP() << "no cgroup v2 sub-tree can be made here (not root?)";
  PosixSpawner sp(PosixSpawner::kDefaultExecWait, GetParam());
  SpawnSpec spec;
  spec.argv = {"/bin/sleep", "100"};
  spec.cgroup_dir_fd = cg->dir_fd(0);
  spec.cgroup_procs_fd = cg->procs_fd(0);
  SpawnedProcess proc;
  SpawnError err;
  ASSERT_TRUE(sp.Spawn(spec, &proc, &err)) << err.message;
  pid_t stranger = 0;  // 0: the hook has not run
  SetAfterCgroupListingForTesting([&](const std::vector<pid_t>& listed) {
    if (stranger != 0 || listed != std::vector<pid_t>{proc.pid}) return;
    ::kill(proc.pid, SIGKILL);
    ::waitpid(proc.pid, nullptr, 0);
    stranger = ForkWithPid(proc.pid);
  });
  UseCgroupKillForTesting(false);
  const WorkerCgroups::AttemptEnd end = cg->EndAttempt(std::chrono::seconds(5));
  UseCgroupKillForTesting(true);
  SetAfterCgroupListingForTesting(nullptr);
  EXPECT_TRUE(end.emptied);
  if (stranger <= 0) GTEST_SKIP() << "the pid could not be given to a new process";
  ASSERT_EQ(stranger, proc.pid);
  // A SIGKILL sent earlier decides the exit status: the kernel marks the process as dying when
  // the signal is sent, and a later SIGTERM is dropped.
  ::kill(stranger, SIGTERM);
  int st = 0;
  ASSERT_EQ(RetryOnEintr([&] { return ::waitpid(stranger, &st, 0); }), stranger);
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM) << "the stranger that took the listed pid was killed: " << st;
}

// A ctrun-<pid> of an earlier ctrun with this pid, SIGKILLed with its watchdog, is in the way:
// Create removes it when it is empty (rank directories included), and never touches a populated
// one (it may be someone's), failing instead (the caller then runs without a cgroup).
TEST_P(PosixSpawnerChild, StaleJobCgroupOfThisPidIsReplacedOnlyWhenEmpty) {
  std::string dir;
  {
    std::unique_ptr<WorkerCgroups> cg = RankCgroup();
    if (!cg) GTEST_SKIP() << "no cgroup v2 sub-tree can be made here (not root?)";
    dir = cg->dir();
  }
  ASSERT_FALSE(std::filesystem::exists(dir)) << "the destructor removes it";
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((dir + "/rank-0").c_str(), 0755), 0);
  {
    auto cg = WorkerCgroups::Create();
    ASSERT_TRUE(cg.ok()) << cg.message();
    EXPECT_FALSE(std::filesystem::exists(dir + "/rank-0"));
  }
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  PosixSpawner sp(PosixSpawner::kDefaultExecWait, GetParam());
  SpawnSpec spec;
  spec.argv = {"/bin/sleep", "100"};
  UniqueFd procs(::open((dir + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
  ASSERT_TRUE(procs);
  spec.cgroup_procs_fd = procs.get();
  SpawnedProcess proc;
  SpawnError err;
  ASSERT_TRUE(sp.Spawn(spec, &proc, &err)) << err.message;
  auto refused = WorkerCgroups::Create();
  EXPECT_FALSE(refused.ok());
  EXPECT_EQ(::waitpid(proc.pid, nullptr, WNOHANG), 0) << "nothing in a populated one is killed";
  RemoveWorkerCgroup(dir, std::chrono::seconds(5));
  int st = 0;
  ASSERT_EQ(RetryOnEintr([&] { return ::waitpid(proc.pid, &st, 0); }), proc.pid);
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << st;
  EXPECT_FALSE(std::filesystem::exists(dir));
}

TEST_P(PosixSpawnerChild, FallsBackToCgroupProcsWhenCloneCannotPlaceTheChild) {
  std::unique_ptr<WorkerCgroups> cg = RankCgroup();
  if (!cg) GTEST_SKIP() << "no cgroup v2 sub-tree can be made here (not root?)";
  // A directory that is no cgroup: clone3 refuses it (EBADF); the child joins through cgroup.procs.
  UniqueFd not_a_cgroup(::open("/tmp", O_PATH | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(not_a_cgroup);
  PosixSpawner sp(PosixSpawner::kDefaultExecWait, GetParam());
  SpawnSpec spec;
  spec.argv = {"/bin/cat", "/proc/self/cgroup"};
  spec.cgroup_dir_fd = not_a_cgroup.get();
  spec.cgroup_procs_fd = cg->procs_fd(0);
  const std::string out = RunToEnd(sp, spec);
  EXPECT_NE(out.find(RankCgroupLine(*cg)), std::string::npos) << out;
}

TEST_P(PosixSpawnerChild, ExecFailureOfACloneIntoCgroupChildIsReported) {
  std::unique_ptr<WorkerCgroups> cg = RankCgroup();
  if (!cg) GTEST_SKIP() << "no cgroup v2 sub-tree can be made here (not root?)";
  PosixSpawner sp(PosixSpawner::kDefaultExecWait, GetParam());
  SpawnSpec spec;
  spec.argv = {"/nonexistent/prog"};
  spec.cgroup_dir_fd = cg->dir_fd(0);
  spec.cgroup_procs_fd = cg->procs_fd(0);
  std::vector<SpawnSpec> specs{spec, spec};
  specs[1].argv = {"/etc/hostname"};  // not executable: 126
  std::vector<SpawnResult> results;
  sp.SpawnMany(specs, &results);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_FALSE(results[0].ok);
  EXPECT_EQ(results[0].error.shell_code, 127);
  EXPECT_EQ(results[0].error.err, ENOENT);
  EXPECT_EQ(results[0].error.message, "cannot execute /nonexistent/prog: No such file or directory");
  EXPECT_FALSE(results[1].ok);
  EXPECT_EQ(results[1].error.shell_code, 126);
  // Both children were reaped by the spawner: nothing is left to wait for.
  EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

// A child whose exec the spawner does not wait for (one that stops for a debugger first, or one
// still in exec when the wait ran out) and that fails it later exits 127 after its record, which
// LateExecFailure reads: the agent can name the cause instead of a bare "exited with code 127".
TEST_P(PosixSpawnerChild, AnExecThatFailsAfterTheSpawnerStoppedWaitingIsExplained) {
  PosixSpawner sp(PosixSpawner::kDefaultExecWait, GetParam());
  for (const char* prog : {"/nonexistent/prog", "/bin/true"}) {
    SpawnSpec spec;
    spec.argv = {prog};
    spec.stop_before_exec = true;
    SpawnedProcess proc;
    SpawnError err;
    ASSERT_TRUE(sp.Spawn(spec, &proc, &err)) << err.message;
    ASSERT_TRUE(proc.unconfirmed.has_value());
    ASSERT_TRUE(testing::WaitFor([&] { return testing::ProcState(proc.pid) == 'T'; }, std::chrono::seconds(10)));
    ASSERT_EQ(::kill(proc.pid, SIGCONT), 0);
    int st;
    ASSERT_EQ(RetryOnEintr([&] { return ::waitpid(proc.pid, &st, 0); }), proc.pid);
    ASSERT_TRUE(WIFEXITED(st)) << prog;
    const std::optional<SpawnError> late = LateExecFailure(*proc.unconfirmed);
    if (std::string(prog) == "/bin/true") {
      EXPECT_EQ(WEXITSTATUS(st), 0);
      EXPECT_FALSE(late.has_value()) << late->message;  // it exec'd
      continue;
    }
    EXPECT_EQ(WEXITSTATUS(st), 127);
    ASSERT_TRUE(late.has_value());
    EXPECT_EQ(late->message, "cannot execute /nonexistent/prog: No such file or directory");
    EXPECT_EQ(late->shell_code, 127);
    EXPECT_EQ(late->err, ENOENT);
  }
}

// No descriptor of the agent reaches a worker, wherever it lies (above the high-fd line, where the
// agent keeps what it holds per worker, or below it) and CLOEXEC or not. A vfork-style child that
// shared the agent's fd table took a table of its own before its dup2s, so the agent's own stdio is
// untouched; and the agent's ends of the worker's pipes and its pidfd lie above the line.
TEST_P(PosixSpawnerChild, SeesOnlyItsStdioWhateverTheAgentHolds) {
  if (!ReserveHighFds()) GTEST_SKIP() << "no room above fd " << kHighFdLine << " or no close_range here";
  int p[2];
  ASSERT_EQ(::pipe(p), 0);  // not CLOEXEC, below the line
  UniqueFd low_read(p[0]), low_write(p[1]);
  UniqueFd high(::fcntl(p[0], F_DUPFD, kHighFdLine + 7));  // not CLOEXEC, above it
  ASSERT_TRUE(high.valid());
  struct stat out_before {}, out_after {}, in_before {}, in_after {};
  ASSERT_EQ(::fstat(1, &out_before), 0);
  ASSERT_EQ(::fstat(0, &in_before), 0);

  PosixSpawner sp(PosixSpawner::kDefaultExecWait, GetParam());
  SpawnSpec spec;
  spec.argv = {"/bin/ls", "/proc/self/fd"};  // ls's own fds: its stdio and the directory it reads
  spec.stdin_target = StdioTarget::DevNull();
  spec.stdout_target = StdioTarget::Pipe();
  spec.stderr_target = StdioTarget::Pipe();
  SpawnedProcess proc;
  SpawnError err;
  ASSERT_TRUE(sp.Spawn(spec, &proc, &err)) << err.message;
  // Checked first: a child that redirected its stdio in the agent's table would have left this
  // process holding the write end of the pipe read below, which then never ends.
  ASSERT_EQ(::fstat(1, &out_after), 0);
  ASSERT_EQ(::fstat(0, &in_after), 0);
  ASSERT_EQ(out_after.st_ino, out_before.st_ino);
  ASSERT_EQ(out_after.st_dev, out_before.st_dev);
  ASSERT_EQ(in_after.st_ino, in_before.st_ino);
  EXPECT_GE(proc.stdout_pipe.get(), kHighFdLine);
  EXPECT_GE(proc.stderr_pipe.get(), kHighFdLine);
  EXPECT_GE(proc.pidfd.get(), kHighFdLine);
  EXPECT_EQ(ReadToEndAndReap(proc), "0\n1\n2\n3\n");
}

TEST_P(PosixSpawnerChild, PidfdComesWithTheChildOnEveryPath) {
  std::unique_ptr<WorkerCgroups> cg = RankCgroup();
  PosixSpawner sp(PosixSpawner::kDefaultExecWait, GetParam());
  SpawnSpec spec;
  spec.argv = {"/bin/true"};
  if (cg) spec.cgroup_dir_fd = cg->dir_fd(0);
  SpawnedProcess proc;
  SpawnError err;
  ASSERT_TRUE(sp.Spawn(spec, &proc, &err)) << err.message;
  ASSERT_TRUE(proc.pidfd.valid());
  EXPECT_EQ(::fcntl(proc.pidfd.get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PIDFD, static_cast<id_t>(proc.pidfd.get()), &info, WEXITED), 0);
  EXPECT_EQ(info.si_pid, proc.pid);
  EXPECT_EQ(info.si_status, 0);
}

// The watchdog learns of the worker's group from the child itself, before exec: a worker that starts
// children at once has no window in which a SIGKILL of ctrun would leave them running. Checked
// while the child is stopped just before exec, and for a child that ran (only code before exec
// can write there: the pipe is CLOEXEC and the program does not know it).
TEST_P(PosixSpawnerChild, RegistersItsGroupWithTheWatchdogBeforeExec) {
  for (bool stop : {true, false}) {
    int fds[2];
    ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
    UniqueFd r(fds[0]), w(fds[1]);
    PosixSpawner sp(PosixSpawner::kDefaultExecWait, GetParam());
    SpawnSpec spec;
    spec.argv = {"/bin/true"};
    spec.watchdog_fd = w.get();
    spec.stop_before_exec = stop;
    SpawnedProcess proc;
    SpawnError err;
    ASSERT_TRUE(sp.Spawn(spec, &proc, &err)) << err.message;
    int st = 0;
    if (stop) {
      ASSERT_EQ(RetryOnEintr([&] { return ::waitpid(proc.pid, &st, WUNTRACED); }), proc.pid);
      ASSERT_TRUE(WIFSTOPPED(st));
    }
    WatchdogMessage m{};
    ASSERT_EQ(::read(r.get(), &m, sizeof m), static_cast<ssize_t>(sizeof m)) << "stopped before exec: " << stop;
    EXPECT_EQ(m.op, 'A');
    EXPECT_EQ(m.pgid, proc.pid);
    EXPECT_EQ(::getpgid(proc.pid), proc.pid);
    if (stop) ::kill(proc.pid, SIGKILL);
    RetryOnEintr([&] { return ::waitpid(proc.pid, &st, 0); });
    w.reset();
    EXPECT_EQ(::read(r.get(), &m, sizeof m), 0) << "one message per child";
  }
}

TEST_P(PosixSpawnerChild, AfterACgroupKillWorkersJoinThroughCgroupProcsAndLive) {
  std::unique_ptr<WorkerCgroups> cg = RankCgroup();
  if (!cg) GTEST_SKIP() << "no cgroup v2 sub-tree can be made here (not root?)";
  PosixSpawner sp(PosixSpawner::kDefaultExecWait, GetParam());
  SpawnSpec spec;
  spec.argv = {"/bin/sleep", "30"};
  spec.cgroup_dir_fd = cg->dir_fd(0);
  spec.cgroup_procs_fd = cg->procs_fd(0);
  SpawnedProcess leftover;
  SpawnError err;
  ASSERT_TRUE(sp.Spawn(spec, &leftover, &err)) << err.message;
  const WorkerCgroups::AttemptEnd end = cg->EndAttempt(std::chrono::seconds(5));  // cgroup.kill
  EXPECT_EQ(end.leftover, 1);
  EXPECT_TRUE(end.emptied);
  int st;
  ASSERT_EQ(RetryOnEintr([&] { return ::waitpid(leftover.pid, &st, 0); }), leftover.pid);
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  // Some kernels kill every child cloned into a cgroup that was ever killed: no clone3 from now on.
  EXPECT_EQ(cg->dir_fd(0), -1);
  SpawnSpec next;
  next.argv = {"/bin/sh", "-c", "cat /proc/self/cgroup; exit 7"};
  next.cgroup_dir_fd = cg->dir_fd(0);
  next.cgroup_procs_fd = cg->procs_fd(0);
  next.stdout_target = StdioTarget::Pipe();
  SpawnedProcess proc;
  ASSERT_TRUE(sp.Spawn(next, &proc, &err)) << err.message;
  ASSERT_EQ(RetryOnEintr([&] { return ::waitpid(proc.pid, &st, 0); }), proc.pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 7) << "status " << st;  // lived to its own exit
  SetNonBlocking(proc.stdout_pipe.get(), false);
  char buf[4096];
  const ssize_t n = ::read(proc.stdout_pipe.get(), buf, sizeof buf);
  const std::string out(buf, n > 0 ? static_cast<size_t>(n) : 0);
  EXPECT_NE(out.find(RankCgroupLine(*cg)), std::string::npos) << out;
}

TEST_P(PosixSpawnerChild, BigBatchesJoinThroughCgroupProcs) {
  std::unique_ptr<WorkerCgroups> cg = RankCgroup();
  if (!cg) GTEST_SKIP() << "no cgroup v2 sub-tree can be made here (not root?)";
  PosixSpawner sp(PosixSpawner::kDefaultExecWait, GetParam());
  std::vector<SpawnSpec> specs(PosixSpawner::kCloneIntoCgroupMaxBatch + 1);
  for (auto& spec : specs) {
    spec.argv = {"/bin/cat", "/proc/self/cgroup"};
    spec.stdout_target = StdioTarget::Pipe();
    spec.cgroup_dir_fd = cg->dir_fd(0);
    spec.cgroup_procs_fd = cg->procs_fd(0);
  }
  std::vector<SpawnResult> results;
  sp.SpawnMany(specs, &results);
  for (auto& r : results) {
    ASSERT_TRUE(r.ok) << r.error.message;
    SetNonBlocking(r.process.stdout_pipe.get(), false);
    char buf[4096];
    const ssize_t n = RetryOnEintr([&] { return ::read(r.process.stdout_pipe.get(), buf, sizeof buf); });
    const std::string out(buf, n > 0 ? static_cast<size_t>(n) : 0);
    EXPECT_NE(out.find(RankCgroupLine(*cg)), std::string::npos) << out;
    int st;
    RetryOnEintr([&] { return ::waitpid(r.process.pid, &st, 0); });
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
}

}  // namespace
}  // namespace ctrun
