// The agent's side of hang detection and the restart policy, with a fake monitor, spawner and
// clock: a hung rank's stacks are captured before anything is stopped, it is the root cause (exit
// 124), restarts wait the back-off, and a crash loop ends the run.
#include <gtest/gtest.h>

#include "agent/agent.h"
#include "fakes/fake_health_monitor.h"
#include "fakes/agent_fixture.h"
#include "report/run_summary.h"

namespace ctrun {
namespace {

using testing::FakeHealthMonitor;

class AgentHealthTest : public testing::AgentFixture {
 protected:
  AgentHealthTest() {
    config.nproc_per_node = 2;
    config.heartbeat_timeout = 5;
    config.heartbeat_first_timeout = 60;
  }
  void Attach(Agent& a) override { a.AttachHealth(&monitor); }
  // One failed attempt: rank 0 exits 1, the others die of our SIGTERM.
  void FailAttempt() {
    Exit(LastPid(0), ExitStatus::Exited(1));
    ExitAll(ExitStatus::Signaled(SIGTERM));
  }

  FakeHealthMonitor monitor;
};

TEST_F(AgentHealthTest, EveryWorkerGetsItsChannelAndTheDeadlinesStartAfterSpawn) {
  MakeAgent().Start();
  ASSERT_EQ(monitor.prepared.size(), 2u);
  EXPECT_EQ(monitor.attempts, 1);
  EXPECT_EQ(monitor.started_ranks, 2);
  EXPECT_EQ(Environment::FromEntries(spawner.specs[1].env).Get("CTRUN_HEARTBEAT_FD")->c_str(), std::string("3"));
}

TEST_F(AgentHealthTest, HungRankStacksAreCapturedBeforeAnyStopThenItIsTheRootCause) {
  MakeAgent().Start();
  monitor.Hang(1, "hung: no heartbeat for 92 s (last beat at step 1200)");
  ASSERT_EQ(monitor.captures.size(), 1u);
  EXPECT_EQ(monitor.captures[0].pgid, LastPid(1));
  EXPECT_EQ(spawner.signals.size(), 0u) << "nothing is signalled while the stacks are taken";
  EXPECT_EQ(agent->state(), AgentState::kRunning);
  monitor.FinishCapture("stacks of 1 process saved in /logs/attempt_0/1/stacks (native: eu-stack)");
  EXPECT_EQ(agent->state(), AgentState::kStopping);
  EXPECT_FALSE(monitor.watching);
  EXPECT_EQ(spawner.CountSignals(SIGTERM), 2);
  ExitAll(ExitStatus::Signaled(SIGTERM));
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), kExitHung);
  ASSERT_EQ(agent->failures().size(), 2u);
  const FailureRecord* hung = nullptr;
  for (const auto& f : agent->failures())
    if (f.local_rank == 1) hung = &f;
  ASSERT_NE(hung, nullptr);
  EXPECT_FALSE(hung->stopped_by_ctrun);
  EXPECT_EQ(hung->hang, "hung: no heartbeat for 92 s (last beat at step 1200)");
  EXPECT_NE(hung->stacks.find("/logs/attempt_0/1/stacks"), std::string::npos);
  for (const auto& f : agent->failures()) {
    if (f.local_rank == 0) {
      EXPECT_TRUE(f.stopped_by_ctrun);
    }
  }
}

// A capture that saved less than asked for (a Python dump refused, a process's stacks unread, the
// bound reached) is logged as a warning, whatever its text starts with; a complete one as
// information. The summary carries the text either way.
class AgentStackLogTest : public AgentHealthTest {
 protected:
  static constexpr const char* kText =
      "stacks of 3 processes saved in /s (native: eu-stack; Python: 0 of 1 process, on the rank's stderr)";
  void HangAndCapture(bool complete) {
    MakeAgent().Start();
    monitor.Hang(1, "hung: no heartbeat for 10 s");
    monitor.FinishCapture(kText, complete);
    ExitAll(ExitStatus::Signaled(SIGTERM));
    ASSERT_TRUE(agent->done());
    for (const auto& f : agent->failures()) {
      if (f.local_rank == 1) {
        EXPECT_EQ(f.stacks, kText);
      }
    }
  }
};

TEST_F(AgentStackLogTest, APartialCaptureIsLoggedAsAWarning) {
  HangAndCapture(/*complete=*/false);
  EXPECT_TRUE(hooks.Logged(std::string("1 rank 1: ") + kText));
}

TEST_F(AgentStackLogTest, ACompleteCaptureIsLoggedAsInformation) {
  HangAndCapture(/*complete=*/true);
  EXPECT_TRUE(hooks.Logged(std::string("0 rank 1: ") + kText));
}

// A collective hang: rank 1 went silent first, ranks 0 and 2 had fallen silent too. Rank 1's
// stacks are taken first, alone, then the other two together; nothing is stopped until the last
// capture ends; rank 1 is the root cause and its verdict names the others.
TEST_F(AgentHealthTest, TheRanksSilentWithTheHungOneHaveTheirStacksSavedToo) {
  config.nproc_per_node = 4;
  MakeAgent().Start();
  monitor.Hang(1, "hung: no heartbeat for 10 s (last beat at step 4)", {0, 2});
  ASSERT_EQ(monitor.captures.size(), 1u) << "the hung rank's capture runs alone";
  EXPECT_EQ(monitor.captures[0].local_rank, 1);
  monitor.FinishCapture("stacks of 1 process saved in /logs/attempt_0/1/stacks (native: gdb)");
  ASSERT_EQ(monitor.captures.size(), 3u);
  EXPECT_EQ(monitor.captures[1].local_rank, 0);
  EXPECT_EQ(monitor.captures[2].local_rank, 2);
  EXPECT_EQ(monitor.captures[1].pgid, LastPid(0));
  monitor.FinishCapture("stacks of 1 process saved in /logs/attempt_0/0/stacks (native: gdb)");
  EXPECT_EQ(spawner.signals.size(), 0u) << "nothing is signalled while a capture runs";
  EXPECT_EQ(agent->state(), AgentState::kRunning);
  monitor.FinishCapture("stacks of 1 process saved in /logs/attempt_0/2/stacks (native: gdb)");
  EXPECT_EQ(agent->state(), AgentState::kStopping);
  ExitAll(ExitStatus::Signaled(SIGTERM));
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), kExitHung);
  const FailureRecord* hung = nullptr;
  for (const auto& f : agent->failures())
    if (!f.hang.empty()) hung = &f;
  ASSERT_NE(hung, nullptr);
  EXPECT_EQ(hung->local_rank, 1);
  EXPECT_EQ(hung->hang, "hung: no heartbeat for 10 s (last beat at step 4); ranks 0 and 2 had fallen silent too");
  EXPECT_NE(hung->stacks.find("/logs/attempt_0/1/stacks"), std::string::npos);
  EXPECT_TRUE(hooks.Logged("rank 2: stacks of 1 process saved in /logs/attempt_0/2/stacks"));
}

// The capture's inferior call can abort a Python process it interrupts: a silent rank killed by
// a signal then is not a failure of its own, and the attempt still waits for its capture.
TEST_F(AgentHealthTest, ASilentRankThatDiesOfItsCaptureIsNotARootCause) {
  MakeAgent().Start();
  monitor.Hang(1, "hung: no heartbeat for 10 s (last beat at step 4)", {0});
  monitor.FinishCapture("stacks of 1 process saved in /s1 (native: gdb)");  // rank 1's
  Exit(LastPid(0), ExitStatus::Signaled(SIGABRT));
  EXPECT_EQ(agent->state(), AgentState::kRunning) << "rank 0's capture has yet to end";
  monitor.FinishCapture("stacks of 1 process saved in /s0 (native: gdb)");
  EXPECT_EQ(agent->state(), AgentState::kStopping);
  ExitAll(ExitStatus::Signaled(SIGTERM));
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), kExitHung);
  for (const auto& f : agent->failures()) {
    if (f.local_rank == 0) {
      EXPECT_TRUE(f.stopped_by_ctrun);
      EXPECT_EQ(f.stacks, "stacks of 1 process saved in /s0 (native: gdb)");
    }
  }
}

// A silent rank that exits with a code of its own during the capture failed on its own.
TEST_F(AgentHealthTest, ASilentRankThatExitsWithACodeDuringTheCaptureFailedOnItsOwn) {
  MakeAgent().Start();
  monitor.Hang(1, "hung: no heartbeat for 10 s (last beat at step 4)", {0});
  monitor.FinishCapture("s1");
  Exit(LastPid(0), ExitStatus::Exited(3));
  EXPECT_EQ(agent->state(), AgentState::kStopping);
  for (const auto& f : agent->failures()) {
    if (f.local_rank == 0) {
      EXPECT_FALSE(f.stopped_by_ctrun);
    }
  }
}

// The main thread of the rank blamed first waits in a collective (its native stacks), the silent
// rank's is in its own code: the blame moves to the silent rank, which the other one waits for.
TEST_F(AgentHealthTest, TheBlameMovesToTheSilentRankWhoseMainThreadIsInItsOwnCode) {
  config.nproc_per_node = 3;
  MakeAgent().Start();
  monitor.Hang(0, "hung: no heartbeat for 8.0 s (last beat at step 4)", {1, 2});
  monitor.main_threads[0] = health::MainThreadWait::kInCollective;
  monitor.main_threads[1] = health::MainThreadWait::kUnknown;  // its capture was cut: no evidence
  monitor.main_threads[2] = health::MainThreadWait::kElsewhere;
  monitor.FinishCapture("stacks of 1 process saved in /s0 (native: gdb)");
  monitor.FinishCapture("s1");
  monitor.FinishCapture("stacks of 1 process saved in /s2 (native: gdb)");
  EXPECT_TRUE(hooks.Logged("blaming rank 2 instead of rank 0: the native stacks show rank 0's main thread waiting in "
                           "a collective and rank 2's in its own code"));
  ExitAll(ExitStatus::Signaled(SIGTERM));
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), kExitHung);
  for (const auto& f : agent->failures()) {
    if (f.local_rank == 2) {
      EXPECT_FALSE(f.stopped_by_ctrun);
      EXPECT_EQ(f.hang,
                "hung: fell silent with rank 0, whose main thread waits in a collective "
                "(rank 0: no heartbeat for 8.0 s (last beat at step 4)); rank 1 had fallen silent too");
      EXPECT_EQ(f.stacks, "stacks of 1 process saved in /s2 (native: gdb)");
    } else {
      EXPECT_TRUE(f.stopped_by_ctrun) << f.local_rank;
      EXPECT_TRUE(f.hang.empty());
    }
  }
}

// Without evidence on both sides the first verdict stands: the blamed rank's own stacks unknown,
// or no silent rank in its own code.
TEST_F(AgentHealthTest, TheBlameStaysWithoutEvidenceOnBothSides) {
  for (auto first : {health::MainThreadWait::kUnknown, health::MainThreadWait::kInCollective}) {
    MakeAgent().Start();
    monitor.main_threads.clear();
    monitor.Hang(0, "hung: no heartbeat for 8.0 s (last beat at step 4)", {1});
    monitor.main_threads[0] = first;
    monitor.main_threads[1] = first == health::MainThreadWait::kUnknown ? health::MainThreadWait::kElsewhere
                                                                          : health::MainThreadWait::kInCollective;
    monitor.FinishCapture("a");
    monitor.FinishCapture("b");
    EXPECT_FALSE(hooks.Logged("blaming rank"));
    ExitAll(ExitStatus::Signaled(SIGTERM));
    for (const auto& f : agent->failures()) {
      if (f.local_rank == 0) {
        EXPECT_EQ(f.hang, "hung: no heartbeat for 8.0 s (last beat at step 4); rank 1 had fallen silent too");
      }
    }
  }
}

TEST_F(AgentHealthTest, ZeroStackTimeoutStopsAtOnce) {
  config.stack_timeout = 0;
  MakeAgent().Start();
  monitor.Hang(0, "hung: no output for 10 s");
  EXPECT_TRUE(monitor.captures.empty());
  EXPECT_EQ(agent->state(), AgentState::kStopping);
  ExitAll(ExitStatus::Signaled(SIGTERM));
  EXPECT_EQ(agent->exit_code(), kExitHung);
}

TEST_F(AgentHealthTest, AFailureDuringTheCaptureStopsAsUsualAndTheCaptureEndChangesNothing) {
  MakeAgent().Start();
  monitor.Hang(1, "hung: no heartbeat for 6.0 s (last beat at step 3)");
  spawner.alive_groups.erase(LastPid(0));
  agent->OnChildExit(LastPid(0), ExitStatus::Exited(7));  // rank 0 fails on its own meanwhile
  EXPECT_EQ(agent->state(), AgentState::kStopping);
  const size_t signals = spawner.signals.size();
  monitor.FinishCapture("stacks of 1 process saved in /x");
  EXPECT_EQ(spawner.signals.size(), signals);
  ExitAll(ExitStatus::Signaled(SIGTERM));
  ASSERT_TRUE(agent->done());
  // The hang was found first: it stays the root cause.
  std::vector<WorkerFailure> wf;
  for (const auto& f : agent->failures()) {
    WorkerFailure w;
    w.global_rank = f.rank.global_rank;
    w.status = f.status;
    w.time = f.time;
    w.stopped_by_ctrun = f.stopped_by_ctrun;
    w.hang = f.hang;
    wf.push_back(w);
  }
  EXPECT_EQ(JobExitCode(wf), kExitHung);
}

// The capture's inferior call can leave the hung rank unable to resume its system call (glibc
// aborts): it dies during its own capture and its peers' collectives break. The failure is still
// the hang, and the attempt ends only once the capture has, with the stacks in the record.
TEST_F(AgentHealthTest, HungRankDyingDuringItsCaptureEndsTheAttemptOnlyAfterTheCapture) {
  config.max_restarts = 1;
  MakeAgent().Start();
  monitor.Hang(1, "hung: no heartbeat for 10 s (last beat at step 4)");
  Exit(LastPid(1), ExitStatus::Signaled(SIGABRT));
  EXPECT_EQ(agent->state(), AgentState::kStopping);
  ExitAll(ExitStatus::Exited(1));  // rank 0's collective breaks
  EXPECT_EQ(agent->restart_count(), 0) << "the attempt waits for the capture";
  EXPECT_EQ(monitor.attempts, 1);
  monitor.FinishCapture("stacks of 1 process saved in /logs/attempt_0/1/stacks (native: eu-stack)");
  EXPECT_EQ(agent->restart_count(), 1);
  EXPECT_EQ(monitor.attempts, 2);
  ExitAll(ExitStatus::Exited(0));
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), 0);
}

// Without a restart left, the hung rank is the job's failure (124) and carries its stacks.
TEST_F(AgentHealthTest, HungRankDyingDuringItsCaptureIsReportedAsHungWithItsStacks) {
  MakeAgent().Start();
  monitor.Hang(1, "hung: no heartbeat for 10 s (last beat at step 4)");
  Exit(LastPid(1), ExitStatus::Signaled(SIGABRT));
  ExitAll(ExitStatus::Exited(1));
  EXPECT_FALSE(agent->done());
  monitor.FinishCapture("stacks of 1 process saved in /s (native: eu-stack)");
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), kExitHung);
  const FailureRecord* hung = nullptr;
  for (const auto& f : agent->failures())
    if (f.local_rank == 1) hung = &f;
  ASSERT_NE(hung, nullptr);
  EXPECT_EQ(hung->hang, "hung: no heartbeat for 10 s (last beat at step 4)");
  EXPECT_EQ(hung->stacks, "stacks of 1 process saved in /s (native: eu-stack)");
}

// The wait for a capture is bounded by the stop's own bound: when a process survives SIGKILL the
// attempt ends at the final wait even if the capture has not, and its late end changes nothing.
TEST_F(AgentHealthTest, ACaptureThatOutlivesTheFinalWaitDoesNotEndTheAttemptTwice) {
  config.max_restarts = 2;
  config.shutdown_timeout = 1;
  config.restart_backoff = 10;
  MakeAgent().Start();
  monitor.Hang(1, "hung: no heartbeat for 10 s (last beat at step 4)");
  spawner.unkillable.insert(LastPid(0));
  Exit(LastPid(1), ExitStatus::Signaled(SIGABRT));
  timers.Advance(std::chrono::seconds(1));
  timers.Advance(Agent::kFinalWait);
  ASSERT_EQ(agent->state(), AgentState::kBackoff) << "the final wait ended the attempt";
  ASSERT_EQ(hooks.failed_attempts.size(), 1u);
  monitor.FinishCapture("stacks of 1 process saved in /s (native: eu-stack)");
  EXPECT_EQ(agent->state(), AgentState::kBackoff);
  EXPECT_EQ(hooks.failed_attempts.size(), 1u) << "the attempt ended once";
  timers.Advance(std::chrono::seconds(10));
  EXPECT_EQ(monitor.attempts, 2);
  EXPECT_EQ(agent->restart_count(), 1);
  EXPECT_EQ(agent->state(), AgentState::kRunning);
}

// A hung rank stuck in the kernel (D state) survives SIGKILL: the attempt ends at the final wait
// and the hang is still its root cause (124), with its stacks and the fact that it did not die;
// a rank stopped beside it that did not die either is listed as stopped by ctrun.
TEST_F(AgentHealthTest, AHungRankThatSurvivesSigkillIsStillTheRootCause) {
  config.shutdown_timeout = 1;
  MakeAgent().Start();
  monitor.Hang(1, "hung: no heartbeat for 10 s (last beat at step 4)");
  monitor.FinishCapture("stacks of 1 process saved in /s (native: eu-stack)");
  spawner.unkillable.insert(LastPid(0));
  spawner.unkillable.insert(LastPid(1));
  timers.Advance(std::chrono::seconds(1));
  timers.Advance(Agent::kFinalWait);
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), kExitHung);
  ASSERT_EQ(agent->failures().size(), 2u);
  for (const auto& f : agent->failures()) {
    if (f.local_rank == 1) {
      EXPECT_FALSE(f.stopped_by_ctrun);
      EXPECT_EQ(f.hang, "hung: no heartbeat for 10 s (last beat at step 4); it did not exit after SIGKILL "
                        "(stuck in the kernel, D state?)");
      EXPECT_EQ(f.stacks, "stacks of 1 process saved in /s (native: eu-stack)");
    } else {
      EXPECT_TRUE(f.stopped_by_ctrun);
    }
  }
}

TEST_F(AgentHealthTest, HungAttemptIsRestartedAndTheNextOneCanSucceed) {
  config.max_restarts = 1;
  MakeAgent().Start();
  monitor.Hang(1, "hung: no heartbeat for 5.0 s (last beat at step 10)");
  monitor.FinishCapture("stacks ...");
  ExitAll(ExitStatus::Signaled(SIGTERM));
  EXPECT_EQ(agent->state(), AgentState::kRunning);
  EXPECT_EQ(agent->restart_count(), 1);
  EXPECT_EQ(monitor.attempts, 2);
  ExitAll(ExitStatus::Exited(0));
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), 0);
}

TEST_F(AgentHealthTest, RestartsBackOffExponentiallyUpToTheCap) {
  config.heartbeat_timeout = 0;  // back-off works without heartbeats too
  config.max_restarts = 5;
  config.restart_backoff = 1;
  config.restart_backoff_max = 4;
  MakeAgent().Start();
  for (double expected : {1.0, 2.0, 4.0, 4.0, 4.0}) {
    const size_t spawned = spawner.specs.size();
    FailAttempt();
    ASSERT_EQ(agent->state(), AgentState::kBackoff) << expected;
    timers.Advance(Seconds(expected - 0.001));
    EXPECT_EQ(spawner.specs.size(), spawned) << "restarted before the " << expected << " s back-off";
    timers.Advance(Seconds(0.001));
    EXPECT_EQ(spawner.specs.size(), spawned + 2) << expected;
  }
  FailAttempt();
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(agent->restart_count(), 5);
  EXPECT_EQ(agent->exit_code(), 1);
}

TEST_F(AgentHealthTest, ASignalDuringTheBackOffEndsTheRunAtOnce) {
  config.max_restarts = 3;
  config.restart_backoff = 10;
  MakeAgent().Start();
  FailAttempt();
  ASSERT_EQ(agent->state(), AgentState::kBackoff);
  agent->OnSignal(SIGTERM);
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), 128 + SIGTERM);
  EXPECT_EQ(agent->ended_by_signal(), SIGTERM);
  EXPECT_EQ(timers.pending(), 0u);
}

// Ctrl-Z, then fg: the hang deadlines move by the time the job stood still, as the agent's own do.
TEST_F(AgentHealthTest, ResumingTheJobMovesTheHangDeadlines) {
  MakeAgent().Start();
  agent->SuspendWorkers();
  agent->ResumeWorkers(std::chrono::seconds(60));
  EXPECT_EQ(monitor.resumed, std::vector<Duration>{std::chrono::seconds(60)});
}

// --debug-rank: the rank sits at a breakpoint and the others wait for it in their collectives,
// so no rank of the job is judged hung; beats still count. A rank outside the job's world (a
// smaller elastic round) changes nothing.
TEST_F(AgentHealthTest, NoHangVerdictsWhileARankOfTheJobIsUnderADebugger) {
  config.debug_rank = 1;
  MakeAgent().Start();
  EXPECT_EQ(monitor.attempts, 1);
  EXPECT_FALSE(monitor.watching);
}

TEST_F(AgentHealthTest, ADebugRankOutsideTheWorldLeavesHangDetectionOn) {
  config.debug_rank = 2;  // nproc_per_node 2: ranks 0 and 1
  MakeAgent().Start();
  EXPECT_TRUE(monitor.watching);
}

// Ctrl-Z during a back-off: ctrun is stopped, no timer runs, but the loop's clock goes on. The
// back-off counts only the time the job was not suspended, as the grace period does.
TEST_F(AgentHealthTest, TheBackOffDoesNotRunWhileTheJobIsSuspended) {
  config.max_restarts = 3;
  config.restart_backoff = 10;
  MakeAgent().Start();
  FailAttempt();
  ASSERT_EQ(agent->state(), AgentState::kBackoff);
  const size_t spawned = spawner.specs.size();
  timers.Advance(std::chrono::seconds(4));
  agent->SuspendWorkers();
  agent->ResumeWorkers(std::chrono::seconds(60));
  timers.Advance(std::chrono::seconds(65));
  EXPECT_EQ(spawner.specs.size(), spawned) << "restarted 4 s into a 10 s back-off";
  EXPECT_EQ(agent->state(), AgentState::kBackoff);
  timers.Advance(std::chrono::seconds(1));
  EXPECT_EQ(spawner.specs.size(), spawned + 2);
  EXPECT_EQ(agent->state(), AgentState::kRunning);
}

TEST_F(AgentHealthTest, CrashLoopGuardStopsAttemptsThatMakeNoProgress) {
  config.max_restarts = 10;
  config.crash_loop_limit = 2;
  monitor.next_attempt_steps = {100, 100, std::nullopt};
  MakeAgent().Start();
  FailAttempt();  // reached step 100: progress
  EXPECT_EQ(agent->state(), AgentState::kRunning);
  FailAttempt();  // step 100 again: 1 without progress
  EXPECT_EQ(agent->state(), AgentState::kRunning);
  FailAttempt();  // no beat at all: 2 in a row
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(agent->restart_count(), 2);
  EXPECT_EQ(agent->exit_code(), 1);  // the last attempt's root cause
  EXPECT_NE(agent->crash_loop().find("crash loop: 2 attempts in a row failed without progress"), std::string::npos)
      << agent->crash_loop();
  EXPECT_NE(agent->crash_loop().find("beyond 100"), std::string::npos) << agent->crash_loop();
}

TEST_F(AgentHealthTest, ProgressResetsTheGuardAndTheBackOff) {
  config.max_restarts = 4;
  config.crash_loop_limit = 2;
  config.restart_backoff = 1;
  config.restart_backoff_max = 100;
  monitor.next_attempt_steps = {10, 10, 20, 20};
  MakeAgent().Start();
  FailAttempt();  // progress: 1 s
  timers.Advance(Seconds(1));
  FailAttempt();  // none: 2 s
  EXPECT_EQ(agent->state(), AgentState::kBackoff);
  timers.Advance(Seconds(1.999));
  EXPECT_EQ(agent->state(), AgentState::kBackoff);
  timers.Advance(Seconds(0.001));
  FailAttempt();  // progress (20 > 10): back to 1 s
  timers.Advance(Seconds(1));
  EXPECT_EQ(agent->state(), AgentState::kRunning);
  EXPECT_EQ(agent->restart_count(), 3);
}

TEST_F(AgentHealthTest, WithoutHeartbeatsPlainRestartsAreUnchanged) {
  config.heartbeat_timeout = 0;
  config.max_restarts = 4;
  MakeAgent().Start();
  for (int i = 0; i < 4; ++i) {
    FailAttempt();
    EXPECT_EQ(agent->state(), AgentState::kRunning) << "restart " << i << " is immediate, never a crash loop";
  }
  FailAttempt();
  EXPECT_TRUE(agent->done());
  EXPECT_EQ(agent->restart_count(), 4);
  EXPECT_TRUE(agent->crash_loop().empty());
}

}  // namespace
}  // namespace ctrun
