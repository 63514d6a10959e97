// The vfork-style way of making children (process/vfork_clone.h on process/spawn_thread.h)
// against the real kernel: the spawn thread's contract, and a child that holds it past the exec
// wait (a stopped child stands in for an exec on a hung file system).
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "helpers/terminal_session.h"
#include "helpers/test_util.h"
#include "process/spawn_thread.h"
#include "process/spawner.h"
#include "process/vfork_clone.h"
#include "sys/high_fd.h"
#include "sys/posix_util.h"

namespace ctrun {
namespace {

using namespace std::chrono_literals;
using testing::ProcState;
using testing::WaitFor;

TimePoint In(Duration d) { return std::chrono::steady_clock::now() + d; }

// A latch a job waits on; the test opens it.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  void Wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return open; });
  }
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu);
      open = true;
    }
    cv.notify_all();
  }
};

// The first read of the child's stdout pipe (a short line arrives whole), and its wait status
// once reaped (-1 when waitpid failed).
std::pair<std::string, int> FirstOutputAndStatus(const SpawnedProcess& p) {
  SetNonBlocking(p.stdout_pipe.get(), false);
  char buf[64];
  const ssize_t n = RetryOnEintr([&] { return ::read(p.stdout_pipe.get(), buf, sizeof buf); });
  int st = -1;
  if (RetryOnEintr([&] { return ::waitpid(p.pid, &st, 0); }) != p.pid) st = -1;
  return {std::string(buf, n > 0 ? static_cast<size_t>(n) : 0), st};
}

std::string ProcStatusField(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + ":", 0) == 0) return line.substr(key.size() + 1);
  return "";
}

TEST(SpawnThread, RunsJobsOneAfterTheOtherWithEverySignalBlocked) {
  SpawnThread* t = SpawnThread::Current();
  ASSERT_NE(t, nullptr);
  std::vector<int> order;
  std::string blocked;
  ASSERT_TRUE(t->Run([&] { order.push_back(1); }, In(5s)));
  ASSERT_TRUE(t->Run([&] {
    order.push_back(2);
    blocked = ProcStatusField("/proc/thread-self/status", "SigBlk");
  }, In(5s)));
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  // Every signal but SIGKILL and SIGSTOP (which cannot be blocked) is blocked.
  sigset_t all;
  sigfillset(&all);
  unsigned long long want = 0;
  for (int s = 1; s <= 64; ++s)
    if (sigismember(&all, s) == 1 && s != SIGKILL && s != SIGSTOP) want |= 1ULL << (s - 1);
  EXPECT_EQ(std::stoull(blocked, nullptr, 16), want) << blocked;
  EXPECT_EQ(SpawnThread::Current(), t);  // the same thread serves every job
}

TEST(SpawnThread, AJobPastItsDeadlineKeepsItsThreadAndTheNextJobGetsAFreshOne) {
  SpawnThread* t = SpawnThread::Current();
  ASSERT_NE(t, nullptr);
  auto gate = std::make_shared<Gate>();
  auto finished = std::make_shared<std::atomic<bool>>(false);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(t->Run([gate, finished] {
    gate->Wait();
    *finished = true;
  }, In(100ms)));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);  // bounded by the deadline, not the job
  SpawnThread* fresh = SpawnThread::Current();
  ASSERT_NE(fresh, nullptr);
  EXPECT_NE(fresh, t);
  bool ran = false;
  EXPECT_TRUE(fresh->Run([&] { ran = true; }, In(5s)));
  EXPECT_TRUE(ran);
  gate->Open();  // the late job finishes on its own thread
  EXPECT_TRUE(WaitFor([&] { return finished->load(); }, 5s));
}

TEST(VforkClone, ChildRunsOnItsStackAndTheParentResumesAfterItsExec) {
  if (!VforkCloneBuilt()) GTEST_SKIP() << "no vfork-style clone on this architecture";
  ChildStack stack(64 * 1024);
  ASSERT_TRUE(stack.ok());
  struct Plan {
    char* const* argv;
  };
  static char true_path[] = "/bin/true";
  static char* argv[] = {true_path, nullptr};
  static char* envp[] = {nullptr};
  Plan plan{argv};
  int pidfd = -1;
  pid_t pid = 0;
  VforkCloneArgs args;
  args.pidfd = &pidfd;
  args.pid = &pid;
  const pid_t r = VforkClone(args, stack, [](void* p) {
    ::execve("/bin/true", static_cast<Plan*>(p)->argv, envp);
    ::_exit(99);
  }, &plan);
  if (r < 0 && errno == ENOSYS) GTEST_SKIP() << "no clone3 (Linux < 5.3)";
  ASSERT_GT(r, 0) << std::strerror(errno);
  EXPECT_EQ(pid, r);  // written by the kernel (CLONE_PARENT_SETTID)
  ASSERT_GE(pidfd, 0);
  EXPECT_EQ(::fcntl(pidfd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PIDFD, static_cast<id_t>(pidfd), &info, WEXITED), 0);
  EXPECT_EQ(info.si_code, CLD_EXITED);
  EXPECT_EQ(info.si_status, 0);
  ::close(pidfd);
}

// A vfork-style child that does not exec holds the spawn thread. SpawnMany still returns at its
// exec wait: the held child comes back as a started worker (the caller owns it like any other),
// the children after it are forked, and the next SpawnMany gets a fresh spawn thread.
TEST(VforkSpawn, AChildHoldingTheSpawnThreadPastTheExecWaitIsOwnedAndTheRestAreForked) {
  if (!VforkCloneBuilt()) GTEST_SKIP() << "no vfork-style clone on this architecture";
  PosixSpawner sp(300ms, PosixSpawner::Method::kVforkEvenStopped);
  std::vector<SpawnSpec> specs(3);
  specs[0].argv = {"/bin/sh", "-c", "exit 5"};
  specs[0].stop_before_exec = true;  // stops itself before exec: the spawn thread waits on
  specs[1].argv = {"/bin/sh", "-c", "echo one"};
  specs[2].argv = {"/bin/sh", "-c", "echo two"};
  for (size_t i = 1; i < specs.size(); ++i) specs[i].stdout_target = StdioTarget::Pipe();
  SpawnThread* before = SpawnThread::Current();
  const auto start = std::chrono::steady_clock::now();
  std::vector<SpawnResult> results;
  sp.SpawnMany(specs, &results);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 4s);
  ASSERT_EQ(results.size(), 3u);
  for (const auto& r : results) ASSERT_TRUE(r.ok) << r.error.message;
  const pid_t held = results[0].process.pid;
  ASSERT_GT(held, 0);
  ASSERT_TRUE(results[0].process.pidfd.valid());
  EXPECT_TRUE(WaitFor([&] { return ProcState(held) == 'T'; }, 5s)) << ProcState(held);
  EXPECT_NE(SpawnThread::Current(), before);  // the held thread was given up
  for (size_t i = 1; i < 3; ++i) {
    const auto [out, st] = FirstOutputAndStatus(results[i].process);
    EXPECT_EQ(out, i == 1 ? "one\n" : "two\n");
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  // Let it go on: it execs and exits with its own code, and its old thread is free again.
  ASSERT_EQ(::kill(held, SIGCONT), 0);
  int st;
  ASSERT_EQ(RetryOnEintr([&] { return ::waitpid(held, &st, 0); }), held);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 5) << "status " << st;
  // A new batch on the fresh spawn thread.
  SpawnSpec next;
  next.argv = {"/bin/sh", "-c", "exit 3"};
  SpawnedProcess proc;
  SpawnError err;
  ASSERT_TRUE(sp.Spawn(next, &proc, &err)) << err.message;
  ASSERT_EQ(RetryOnEintr([&] { return ::waitpid(proc.pid, &st, 0); }), proc.pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 3);
  EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1);  // nothing else was started
  EXPECT_EQ(errno, ECHILD);
}

// A batch clones each child as it is added, while the caller goes on making and closing
// descriptors for the next ones (low numbers freed and taken again, as PrepareChild's moves above
// the high-fd line do): every child gets its own stdio. A spec the spawn thread may not take
// (stopped before exec: forked at Finish) keeps its place among the results.
TEST(VforkSpawn, ABatchStartsChildrenWhileTheCallerMakesAndClosesDescriptors) {
  if (!VforkCloneBuilt()) GTEST_SKIP() << "no vfork-style clone on this architecture";
  PosixSpawner sp;
  std::unique_ptr<SpawnBatch> batch = sp.BeginBatch();
  constexpr int kChildren = 6;
  constexpr int kStopped = 3;
  for (int i = 0; i < kChildren; ++i) {
    SpawnSpec spec;
    spec.argv = {"/bin/sh", "-c", "echo " + std::to_string(i)};
    spec.stdout_target = StdioTarget::Pipe();
    spec.stop_before_exec = i == kStopped;
    batch->Add(spec);
    for (int k = 0; k < 50; ++k) {
      int p[2];
      ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
      ::close(p[0]);
      ::close(p[1]);
    }
  }
  std::vector<SpawnResult> results;
  batch->Finish(&results);
  ASSERT_EQ(results.size(), static_cast<size_t>(kChildren));
  for (const auto& r : results) ASSERT_TRUE(r.ok) << r.error.message;
  EXPECT_TRUE(results[kStopped].process.unconfirmed.has_value());
  EXPECT_TRUE(WaitFor([&] { return ProcState(results[kStopped].process.pid) == 'T'; }, 5s));
  ASSERT_EQ(::kill(results[kStopped].process.pid, SIGCONT), 0);
  for (int i = 0; i < kChildren; ++i) {
    const auto [out, st] = FirstOutputAndStatus(results[static_cast<size_t>(i)].process);
    EXPECT_EQ(out, std::to_string(i) + "\n") << i;
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << i << ": status " << st;
  }
  EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1);  // nothing else was started
}

// A batch given up before Finish still finishes: every child it started is started, and can be
// reaped by whoever reaps strangers.
TEST(VforkSpawn, ABatchDroppedUnfinishedStartsWhatItWasGiven) {
  if (!VforkCloneBuilt()) GTEST_SKIP() << "no vfork-style clone on this architecture";
  PosixSpawner sp;
  {
    std::unique_ptr<SpawnBatch> batch = sp.BeginBatch();
    for (int i = 0; i < 2; ++i) {
      SpawnSpec spec;
      spec.argv = {"/bin/sh", "-c", "exit 7"};
      batch->Add(spec);
    }
  }
  for (int i = 0; i < 2; ++i) {
    int st = -1;
    ASSERT_GT(RetryOnEintr([&] { return ::waitpid(-1, &st, 0); }), 0);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 7) << "status " << st;
  }
  EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1);
}

// A child the kernel has not run yet when the exec wait runs out still shares the agent's fd table
// (it has not taken its own): the agent must not close the descriptors it was given (its stdio,
// its error pipe) meanwhile. Found under load (256 workers on 2 busy cores): such a child's dup2
// failed with EBADF, its failure record went nowhere, and the worker "exited with code 127" with
// no word of why.
TEST(VforkSpawn, AChildStillSharingTheAgentsFdTablePastTheExecWaitKeepsItsDescriptors) {
  if (!VforkCloneBuilt()) GTEST_SKIP() << "no vfork-style clone on this architecture";
  if (!ReserveHighFds()) GTEST_SKIP() << "no room above fd " << kHighFdLine << " or no close_range here";
  PosixSpawner sp(200ms, PosixSpawner::Method::kVforkStoppedAtEntry);
  std::vector<SpawnSpec> specs(2);
  specs[0].argv = {"/bin/sh", "-c", "echo held; exit 5"};
  specs[0].stop_before_exec = true;  // stops as it begins, before it takes a table of its own
  specs[1].argv = {"/bin/sh", "-c", "echo two"};
  for (auto& spec : specs) spec.stdout_target = StdioTarget::Pipe();
  std::vector<SpawnResult> results;
  sp.SpawnMany(specs, &results);
  ASSERT_EQ(results.size(), 2u);
  for (const auto& r : results) ASSERT_TRUE(r.ok) << r.error.message;
  const pid_t held = results[0].process.pid;
  ASSERT_TRUE(WaitFor([&] { return ProcState(held) == 'T'; }, 5s)) << ProcState(held);
  ASSERT_EQ(::kill(held, SIGCONT), 0);
  for (size_t i = 0; i < 2; ++i) {
    const auto [out, st] = FirstOutputAndStatus(results[i].process);
    EXPECT_EQ(out, i == 0 ? "held\n" : "two\n");
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == (i == 0 ? 5 : 0)) << "status " << st;
  }
}

// The same for the caller's extra fd (a heartbeat channel): the caller closes it once Spawn has
// returned, and its number may be taken by the agent's next descriptor before the held child
// runs. The child still gets the channel it was given as fd 3, not the newcomer.
TEST(VforkSpawn, AChildStillSharingTheAgentsFdTableGetsTheExtraFdItWasGiven) {
  if (!VforkCloneBuilt()) GTEST_SKIP() << "no vfork-style clone on this architecture";
  if (!ReserveHighFds()) GTEST_SKIP() << "no room above fd " << kHighFdLine << " or no close_range here";
  PosixSpawner sp(200ms, PosixSpawner::Method::kVforkStoppedAtEntry);
  int channel[2], newcomer[2];
  ASSERT_EQ(::pipe2(channel, O_CLOEXEC), 0);
  SpawnSpec spec;
  spec.argv = {"/bin/sh", "-c", "echo beat >&3; exit 5"};
  spec.stop_before_exec = true;  // stops as it begins, before it takes a table of its own
  spec.extra_fd = channel[1];
  spec.extra_fd_target = 3;
  std::vector<SpawnResult> results;
  sp.SpawnMany({spec}, &results);
  ASSERT_EQ(results.size(), 1u);
  ASSERT_TRUE(results[0].ok) << results[0].error.message;
  const pid_t held = results[0].process.pid;
  ::close(channel[1]);  // as the health monitor closes the worker's end once the attempt starts
  ASSERT_EQ(::pipe2(newcomer, O_CLOEXEC), 0);  // may take the number just freed
  ASSERT_TRUE(WaitFor([&] { return ProcState(held) == 'T'; }, 5s)) << ProcState(held);
  ASSERT_EQ(::kill(held, SIGCONT), 0);
  int st = 0;
  ASSERT_EQ(RetryOnEintr([&] { return ::waitpid(held, &st, 0); }), held);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 5) << "status " << st;
  char buf[16] = {};
  ::fcntl(channel[0], F_SETFL, O_NONBLOCK);
  EXPECT_EQ(::read(channel[0], buf, sizeof buf - 1), 5) << "the beat went elsewhere";
  EXPECT_STREQ(buf, "beat\n");
  ::fcntl(newcomer[0], F_SETFL, O_NONBLOCK);
  EXPECT_EQ(::read(newcomer[0], buf, sizeof buf), -1) << "the newcomer got the child's fd 3";
  for (int fd : {channel[0], newcomer[0], newcomer[1]}) ::close(fd);
}

// An exec that hangs (the child holds the spawn thread) costs the exec wait once: the batch does
// not wait a second time for the confirmation it already waited for. The worker comes back
// started, its exec unconfirmed, and runs on once its exec goes through.
TEST(VforkSpawn, AHungExecCostsTheExecWaitOnce) {
  if (!VforkCloneBuilt()) GTEST_SKIP() << "no vfork-style clone on this architecture";
  PosixSpawner sp(1500ms, PosixSpawner::Method::kVforkHungExec);
  SpawnSpec spec;
  spec.argv = {"/bin/sh", "-c", "exit 4"};
  SpawnedProcess proc;
  SpawnError err;
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(sp.Spawn(spec, &proc, &err)) << err.message;
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, 1400ms);
  EXPECT_LT(took, 2700ms) << "the exec wait was spent twice";
  EXPECT_FALSE(proc.exec_confirmed);
  ASSERT_TRUE(WaitFor([&] { return ProcState(proc.pid) == 'T'; }, 5s)) << ProcState(proc.pid);
  ASSERT_EQ(::kill(proc.pid, SIGCONT), 0);
  int st;
  ASSERT_EQ(RetryOnEintr([&] { return ::waitpid(proc.pid, &st, 0); }), proc.pid);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 4) << "status " << st;
  EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

// The kernel holds a clone, before the child exists, past the exec wait: that worker is a start
// error, never forked a second time from the image the clone still reads (the fork would have
// raced the clone over its descriptors and its plan); the children after it are forked, and the
// child the held clone makes at last is killed and reaped as a stranger.
TEST(VforkSpawn, ACloneHeldPastTheExecWaitIsAStartErrorNotASecondChild) {
  if (!VforkCloneBuilt()) GTEST_SKIP() << "no vfork-style clone on this architecture";
  PosixSpawner sp(200ms, PosixSpawner::Method::kVforkSlowClone);
  std::vector<SpawnSpec> specs(2);
  specs[0].argv = {"/bin/sh", "-c", "sleep 30"};  // ends by the spawn thread's SIGKILL only
  specs[1].argv = {"/bin/sh", "-c", "echo two"};
  for (auto& spec : specs) spec.stdout_target = StdioTarget::Pipe();
  std::vector<SpawnResult> results;
  sp.SpawnMany(specs, &results);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_FALSE(results[0].ok);
  EXPECT_EQ(results[0].error.message, "cannot start /bin/sh: the kernel did not create the process within 200 ms");
  EXPECT_EQ(results[0].error.shell_code, 1);
  ASSERT_TRUE(results[1].ok) << results[1].error.message;
  const auto [out, st] = FirstOutputAndStatus(results[1].process);
  EXPECT_EQ(out, "two\n");
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st;
  // The held clone goes through 400 ms after it began; its child is killed by the spawn thread.
  pid_t stranger = 0;
  int sst = 0;
  ASSERT_TRUE(WaitFor([&] { return (stranger = ::waitpid(-1, &sst, WNOHANG)) > 0; }, 10s));
  EXPECT_TRUE(WIFSIGNALED(sst) && WTERMSIG(sst) == SIGKILL) << "status " << sst;
  EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

// A held child killed while it holds the thread: nothing is left behind.
TEST(VforkSpawn, AHeldChildKilledByItsOwnerIsReapedAndTheThreadIsFreed) {
  if (!VforkCloneBuilt()) GTEST_SKIP() << "no vfork-style clone on this architecture";
  PosixSpawner sp(200ms, PosixSpawner::Method::kVforkEvenStopped);
  SpawnSpec spec;
  spec.argv = {"/bin/true"};
  spec.stop_before_exec = true;
  SpawnedProcess proc;
  SpawnError err;
  ASSERT_TRUE(sp.Spawn(spec, &proc, &err)) << err.message;
  ASSERT_EQ(::kill(proc.pid, SIGKILL), 0);
  int st;
  ASSERT_EQ(RetryOnEintr([&] { return ::waitpid(proc.pid, &st, 0); }), proc.pid);
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  EXPECT_EQ(::waitpid(-1, nullptr, WNOHANG), -1);
  EXPECT_EQ(errno, ECHILD);
}

}  // namespace
}  // namespace ctrun
