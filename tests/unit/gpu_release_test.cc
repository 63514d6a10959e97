// The wait for GPU release before a restart: fake NVML, fake /proc, fake clock.
#include "gpu/gpu_release.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <string>
#include <vector>

#include "fakes/fake_gpu_driver.h"
#include "fakes/fake_timer_queue.h"

namespace ctrun {
namespace {

using namespace std::chrono_literals;
using testing::FakeGpuDriver;
using testing::FakeTimerQueue;

class GpuReleaseTest : public ::testing::Test {
 protected:
  GpuReleaseTest() : nvml(FakeGpuDriver::WithDevices(2)) {}
  GpuReleaseWaiter& Waiter() {
    waiter = std::make_unique<GpuReleaseWaiter>(
        nvml, std::vector<int>{0, 1}, timers,
        [this](pid_t p) {
          auto it = procs.find(p);
          return it == procs.end() ? ProcState{} : it->second;
        },
        GpuReleaseWaiter::Options{2s, 50ms, [this](const std::string& line) { warnings.push_back(line); }});
    return *waiter;
  }
  void Wait(std::vector<pid_t> pids) {
    Waiter().Wait(std::move(pids), [this](Status s) {
      ++calls;
      result = s;
    });
  }

  FakeGpuDriver nvml;
  FakeTimerQueue timers;
  std::map<pid_t, ProcState> procs;
  std::unique_ptr<GpuReleaseWaiter> waiter;
  int calls = 0;
  Status result = Status::Error("not called");
  std::vector<std::string> warnings;
};

TEST_F(GpuReleaseTest, NothingOnTheGpusGoesAheadAtOnce) {
  Wait({100, 101});
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(result.ok());
  EXPECT_EQ(timers.pending(), 0u);
}

TEST_F(GpuReleaseTest, OtherUsersProcessesAreIgnored) {
  nvml.processes[0] = {{555, 1 << 30}};
  procs[555] = {true, 'S', 555};
  Wait({100, 101});
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(result.ok());
}

TEST_F(GpuReleaseTest, WaitsOnTimersUntilTheContextIsReleased) {
  nvml.processes[1] = {{101, 1 << 30}};  // exited (not in /proc), context still listed
  nvml.processes[0] = {{102, 1 << 20}};  // a worker's child, alive in the worker's group 100
  procs[102] = {true, 'R', 100};
  Wait({100, 101});
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(timers.pending(), 1u);  // a timer, never a sleep
  timers.Advance(200ms);
  EXPECT_EQ(calls, 0);
  nvml.processes[0].clear();
  nvml.processes[1].clear();
  timers.Advance(50ms);
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(result.ok());
  EXPECT_EQ(timers.pending(), 0u);
}

TEST_F(GpuReleaseTest, AnUnkillableProcessIsReportedByPidAndTheRestartRefused) {
  nvml.processes[1] = {{100, 1 << 30}};
  procs[100] = {true, 'D', 100};
  Wait({100});
  timers.Advance(1900ms);
  EXPECT_EQ(calls, 0);
  timers.Advance(100ms);  // the deadline, exactly
  ASSERT_EQ(calls, 1);
  ASSERT_FALSE(result.ok());
  EXPECT_NE(result.message().find("pid 100 (GPU 1, state D: uninterruptible, cannot be killed)"), std::string::npos)
      << result.message();
  EXPECT_NE(result.message().find("not restarting"), std::string::npos);
  EXPECT_EQ(result.message().find('\n'), std::string::npos);
}

TEST_F(GpuReleaseTest, ADriverErrorDoesNotHoldTheRestart) {
  nvml.failing[0] = true;
  nvml.failing[1] = true;
  Wait({100});
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(result.ok());
}

// NVML refuses the process list (NO_PERMISSION on a MIG-enabled GPU for a non-root user): the
// restart goes ahead, and a warning says once per GPU that its release is not waited for, and why.
TEST_F(GpuReleaseTest, AGpuWhoseProcessesCannotBeListedIsNamedOnce) {
  nvml.failing[1] = true;
  nvml.processes[0] = {{100, 1}};
  GpuReleaseWaiter& w = Waiter();
  w.Wait({100}, [this](Status s) {
    ++calls;
    result = s;
  });
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "restarts do not wait for GPU 1 to be released by the previous attempt: fake NVML error");
  nvml.processes[0].clear();
  timers.Advance(50ms);  // the next check: GPU 1 still fails, no second line
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(result.ok());
  w.Wait({200}, [this](Status s) {  // the next restart's wait
    ++calls;
    result = s;
  });
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(warnings.size(), 1u);
}

TEST_F(GpuReleaseTest, DestroyingTheWaiterCancelsItsTimer) {
  nvml.processes[0] = {{100, 1}};
  Wait({100});
  EXPECT_EQ(timers.pending(), 1u);
  waiter.reset();
  EXPECT_EQ(timers.pending(), 0u);
  EXPECT_EQ(calls, 0);
}

TEST(ProcStateTest, ReadsThisProcess) {
  ProcState st = ReadProcState(::getpid());
  EXPECT_TRUE(st.exists);
  EXPECT_EQ(st.pgrp, ::getpgrp());
  EXPECT_FALSE(ReadProcState(0x7ffffff0).exists);
}

}  // namespace
}  // namespace ctrun
