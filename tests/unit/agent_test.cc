// Agent state machine, driven with a fake spawner and a fake clock: no fork, no sleep.
#include "agent/agent.h"
#include "agent/job_outcome.h"

#include <gtest/gtest.h>

#include "fakes/agent_fixture.h"

namespace ctrun {
namespace {

class AgentTest : public testing::AgentFixture {};

TEST_F(AgentTest, StartsOneWorkerPerLocalRankWithTorchrunEnv) {
  MakeAgent().Start();
  ASSERT_EQ(spawner.specs.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    const Environment env = Environment::FromEntries(spawner.specs[i].env);
    EXPECT_EQ(*env.Get("RANK"), std::to_string(i));
    EXPECT_EQ(*env.Get("LOCAL_RANK"), std::to_string(i));
    EXPECT_EQ(*env.Get("WORLD_SIZE"), "4");
    EXPECT_EQ(*env.Get("MASTER_PORT"), "29500");
    EXPECT_EQ(*env.Get("TORCHELASTIC_RESTART_COUNT"), "0");
    EXPECT_EQ(*env.Get("HOME"), "/root");
    EXPECT_EQ(spawner.specs[i].argv, std::vector<std::string>{"./train"});
    EXPECT_EQ(spawner.specs[i].executable, "/work/train");  // resolved once, before the run
  }
  EXPECT_EQ(agent->state(), AgentState::kRunning);
}

TEST_F(AgentTest, AllSucceedFinishesWithZero) {
  MakeAgent().Start();
  for (int i = 0; i < 4; ++i) Exit(Pid(i), ExitStatus::Exited(0));
  EXPECT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), 0);
  EXPECT_TRUE(agent->failures().empty());
}

TEST_F(AgentTest, LeftoverGrandchildrenAfterSuccessAreSweptThenDone) {
  MakeAgent().Start();
  for (int i = 0; i < 3; ++i) Exit(Pid(i), ExitStatus::Exited(0));
  agent->OnChildExit(Pid(3), ExitStatus::Exited(0));  // leader gone, group still has a member
  EXPECT_FALSE(agent->done());
  EXPECT_EQ(spawner.CountSignals(SIGTERM), 1);
  spawner.alive_groups.erase(Pid(3));
  agent->OnChildExit(99999, ExitStatus::Signaled(SIGTERM));  // the reparented grandchild, reaped
  EXPECT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), 0);
}

TEST_F(AgentTest, FailureStopsSurvivorsAndExitsWithRootCauseCode) {
  MakeAgent().Start();
  Exit(Pid(2), ExitStatus::Exited(3));
  EXPECT_EQ(agent->state(), AgentState::kStopping);
  EXPECT_EQ(spawner.CountSignals(SIGTERM), 3);  // the three survivors' groups
  for (int i : {0, 1, 3}) Exit(Pid(i), ExitStatus::Signaled(SIGTERM));
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), 3);
  ASSERT_EQ(agent->failures().size(), 4u);
  EXPECT_EQ(agent->failures()[0].rank.global_rank, 2);
  EXPECT_FALSE(agent->failures()[0].stopped_by_ctrun);
  EXPECT_TRUE(agent->failures()[1].stopped_by_ctrun);
}

TEST_F(AgentTest, FirstExitIsNotCalledTheRootCauseWhichIsNamedOnceAllAreGone) {
  config.max_restarts = 1;
  MakeAgent().Start();
  Exit(Pid(2), ExitStatus::Exited(1));  // may be a rank that died of another's crash
  ASSERT_FALSE(hooks.logs.empty());
  EXPECT_NE(hooks.logs.back().find("first exit: worker rank 2"), std::string::npos) << hooks.logs.back();
  EXPECT_NE(hooks.logs.back().find("the root cause is named once they are gone"), std::string::npos);
  EXPECT_TRUE(hooks.failed_attempts.empty());  // not while workers are still going
  Exit(Pid(1), ExitStatus::Exited(1));
  for (int i : {0, 3}) Exit(Pid(i), ExitStatus::Signaled(SIGTERM));
  ASSERT_EQ(hooks.failed_attempts.size(), 1u);
  EXPECT_EQ(hooks.failed_attempts[0], (std::pair<int, size_t>{0, 4}));  // before the restart, all four
  EXPECT_EQ(agent->state(), AgentState::kRunning);
}

// A rank killed by SIGPIPE wrote to a peer that went away: the peer (a C++ rank that closes its
// sockets while unwinding, before its error file is written) is given time to end on its own, so
// it is not stopped by ctrun and can be named the root cause.
TEST_F(AgentTest, AFailureThatLostAPeerWaitsForThePeerToEndOnItsOwn) {
  MakeAgent().Start();
  Exit(Pid(0), ExitStatus::Signaled(SIGPIPE));
  EXPECT_EQ(agent->state(), AgentState::kRunning);
  EXPECT_EQ(spawner.CountSignals(SIGTERM), 0);
  EXPECT_TRUE(hooks.Logged("first exit: worker rank 0 (local_rank 0, pid 1000) killed by signal 13 (SIGPIPE) "
                           "after losing a peer; waiting up to 1.0 s"));
  Exit(Pid(1), ExitStatus::Exited(1));  // the crashed rank
  EXPECT_EQ(agent->state(), AgentState::kStopping);
  EXPECT_EQ(spawner.CountSignals(SIGTERM), 2);
  EXPECT_TRUE(hooks.Logged("worker rank 1 (local_rank 1, pid 1001) exited with code 1; stopping the other workers"));
  for (int i : {2, 3}) Exit(Pid(i), ExitStatus::Signaled(SIGTERM));
  ASSERT_TRUE(agent->done());
  ASSERT_EQ(agent->failures().size(), 4u);
  EXPECT_FALSE(agent->failures()[0].stopped_by_ctrun);
  EXPECT_EQ(agent->failures()[1].rank.global_rank, 1);
  EXPECT_FALSE(agent->failures()[1].stopped_by_ctrun);
  EXPECT_TRUE(agent->failures()[2].stopped_by_ctrun);
  timers.Advance(Agent::kPeerLossWait);  // the cancelled wait does nothing
  EXPECT_EQ(spawner.CountSignals(SIGTERM), 2);
}

// The crashed rank already wrote its error file (a Python rank during interpreter shutdown): it is
// the root cause however it ends, so there is nothing to wait for.
TEST_F(AgentTest, NoWaitForALostPeerWhenARunningRankAlreadyRecordedItsOwnFailure) {
  MakeAgent().Start();
  hooks.own_failure_files = {"/err/0/1"};
  Exit(Pid(0), ExitStatus::Signaled(SIGPIPE));
  EXPECT_EQ(hooks.asked_error_files, (std::vector<std::string>{"/err/0/1", "/err/0/2", "/err/0/3"}));
  EXPECT_EQ(agent->state(), AgentState::kStopping);
  EXPECT_EQ(spawner.CountSignals(SIGTERM), 3);
  EXPECT_FALSE(hooks.Logged("waiting up to"));
}

TEST_F(AgentTest, TheWaitForALostPeerIsBounded) {
  MakeAgent().Start();
  Exit(Pid(2), ExitStatus::Signaled(SIGPIPE));
  Exit(Pid(3), ExitStatus::Signaled(SIGPIPE));  // lost the same peer: still waiting
  timers.Advance(Agent::kPeerLossWait - std::chrono::milliseconds(1));
  EXPECT_EQ(spawner.CountSignals(SIGTERM), 0);
  timers.Advance(std::chrono::milliseconds(1));
  EXPECT_EQ(agent->state(), AgentState::kStopping);
  EXPECT_EQ(spawner.CountSignals(SIGTERM), 2);
  EXPECT_TRUE(hooks.Logged("no worker failed on its own within 1.0 s; stopping the other workers"));
  for (int i : {0, 1}) Exit(Pid(i), ExitStatus::Signaled(SIGTERM));
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), 128 + SIGPIPE);
  EXPECT_FALSE(agent->failures()[1].stopped_by_ctrun);
}

TEST_F(AgentTest, AnErrorFileThatLostAPeerWaitsAndEveryWorkerEndingEndsTheWait) {
  config.max_restarts = 1;
  MakeAgent().Start();
  hooks.lost_peer = {Pid(1), Pid(2)};  // "Connection closed by peer" in their error files
  Exit(Pid(1), ExitStatus::Exited(1));
  Exit(Pid(0), ExitStatus::Exited(0));
  Exit(Pid(2), ExitStatus::Exited(1));
  EXPECT_EQ(spawner.CountSignals(SIGTERM), 0);
  Exit(Pid(3), ExitStatus::Signaled(SIGPIPE));  // the last one: nothing is left to wait for
  EXPECT_EQ(spawner.CountSignals(SIGTERM), 0);
  ASSERT_EQ(hooks.failed_attempts.size(), 1u);
  EXPECT_EQ(hooks.failed_attempts[0], (std::pair<int, size_t>{0, 3}));
  EXPECT_EQ(agent->restart_count(), 1);
  EXPECT_EQ(agent->state(), AgentState::kRunning);
  timers.Advance(Agent::kPeerLossWait);  // the next attempt is not stopped by the old wait
  EXPECT_EQ(agent->state(), AgentState::kRunning);
  EXPECT_EQ(spawner.CountSignals(SIGTERM), 0);
}

TEST_F(AgentTest, ASignalDuringTheWaitForALostPeerStopsAtOnce) {
  MakeAgent().Start();
  Exit(Pid(0), ExitStatus::Signaled(SIGPIPE));
  agent->OnSignal(SIGTERM);
  EXPECT_EQ(agent->state(), AgentState::kStopping);
  EXPECT_EQ(spawner.CountSignals(SIGTERM), 3);
  timers.Advance(Agent::kPeerLossWait);
  EXPECT_EQ(spawner.CountSignals(SIGTERM), 3);
  for (int i : {1, 2, 3}) Exit(Pid(i), ExitStatus::Signaled(SIGTERM));
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), 128 + SIGTERM);
}

TEST_F(AgentTest, SignalDeathOfRootCauseGives128PlusSignal) {
  MakeAgent().Start();
  Exit(Pid(0), ExitStatus::Signaled(SIGSEGV));
  for (int i : {1, 2, 3}) Exit(Pid(i), ExitStatus::Signaled(SIGTERM));
  EXPECT_EQ(agent->exit_code(), 128 + SIGSEGV);
}

TEST_F(AgentTest, RestartsUntilMaxRestartsWithIncrementedCount) {
  config.max_restarts = 2;
  MakeAgent().Start();
  for (int attempt = 0; attempt <= 2; ++attempt) {
    size_t base = static_cast<size_t>(attempt) * 4;
    ASSERT_EQ(spawner.specs.size(), base + 4);
    const Environment env = Environment::FromEntries(spawner.specs[base].env);
    EXPECT_EQ(*env.Get("TORCHELASTIC_RESTART_COUNT"), std::to_string(attempt));
    EXPECT_EQ(*env.Get("TORCHELASTIC_MAX_RESTARTS"), "2");
    Exit(Pid(base + 1), ExitStatus::Exited(1));
    for (size_t i : {0, 2, 3}) Exit(Pid(base + i), ExitStatus::Signaled(SIGTERM));
  }
  EXPECT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), 1);
  EXPECT_EQ(agent->restart_count(), 2);
  EXPECT_EQ(hooks.attempts, (std::vector<int>{0, 1, 2}));
}

TEST_F(AgentTest, RestartSucceedsAfterOneFailure) {
  config.max_restarts = 3;
  MakeAgent().Start();
  Exit(Pid(0), ExitStatus::Exited(1));
  for (int i : {1, 2, 3}) Exit(Pid(i), ExitStatus::Signaled(SIGTERM));
  ASSERT_EQ(spawner.specs.size(), 8u);
  for (int i = 4; i < 8; ++i) Exit(Pid(i), ExitStatus::Exited(0));
  EXPECT_EQ(agent->exit_code(), 0);
  EXPECT_EQ(agent->restart_count(), 1);
}

TEST_F(AgentTest, SurvivorIgnoringSigtermIsKilledAfterGrace) {
  config.shutdown_timeout = 2;
  MakeAgent().Start();
  Exit(Pid(0), ExitStatus::Exited(1));
  for (int i : {1, 2}) Exit(Pid(i), ExitStatus::Signaled(SIGTERM));
  EXPECT_FALSE(agent->done());
  timers.Advance(std::chrono::milliseconds(1999));
  EXPECT_EQ(spawner.CountSignals(SIGKILL), 0);
  timers.Advance(std::chrono::milliseconds(1));
  EXPECT_EQ(spawner.CountSignals(SIGKILL), 1);
  agent->OnChildExit(Pid(3), ExitStatus::Signaled(SIGKILL));
  EXPECT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), 1);
}

TEST_F(AgentTest, UnkillableWorkerIsReportedNotWaitedOnForever) {
  config.shutdown_timeout = 1;
  MakeAgent().Start();
  spawner.unkillable.insert(Pid(3));
  Exit(Pid(0), ExitStatus::Exited(1));
  for (int i : {1, 2}) Exit(Pid(i), ExitStatus::Signaled(SIGTERM));
  timers.Advance(std::chrono::seconds(1));
  EXPECT_FALSE(agent->done());
  timers.Advance(Agent::kFinalWait);
  EXPECT_TRUE(agent->done());
  EXPECT_EQ(agent->unkillable(), std::vector<pid_t>{Pid(3)});
}

TEST_F(AgentTest, SigtermToAgentIsForwardedAndExitCodeIs128PlusSignal) {
  config.max_restarts = 5;
  MakeAgent().Start();
  agent->OnSignal(SIGTERM);
  EXPECT_EQ(spawner.CountSignals(SIGTERM), 4);
  for (int i = 0; i < 4; ++i) Exit(Pid(i), ExitStatus::Signaled(SIGTERM));
  EXPECT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), 128 + SIGTERM);
  EXPECT_EQ(spawner.specs.size(), 4u);  // no restart after a signal
}

TEST_F(AgentTest, SigintIsForwardedAsSigint) {
  MakeAgent().Start();
  agent->OnSignal(SIGINT);
  EXPECT_EQ(spawner.CountSignals(SIGINT), 4);
  EXPECT_EQ(spawner.CountSignals(SIGTERM), 0);
}

TEST_F(AgentTest, EveryStopSignalIsFollowedBySigcontSoStoppedWorkersActOnIt) {
  MakeAgent().Start();
  agent->OnSignal(SIGINT);
  ASSERT_EQ(spawner.signals.size(), 8u);
  for (size_t i = 0; i < 8; i += 2) {
    EXPECT_EQ(spawner.signals[i].sig, SIGINT);
    EXPECT_EQ(spawner.signals[i + 1].sig, SIGCONT);
    EXPECT_EQ(spawner.signals[i + 1].pgid, spawner.signals[i].pgid);
  }
}

TEST_F(AgentTest, FailureTeardownSigtermIsFollowedBySigcontSigkillIsNot) {
  config.shutdown_timeout = 1;
  MakeAgent().Start();
  Exit(Pid(0), ExitStatus::Exited(1));
  EXPECT_EQ(spawner.CountSignals(SIGTERM), 3);
  EXPECT_EQ(spawner.CountSignals(SIGCONT), 3);
  timers.Advance(std::chrono::seconds(1));
  EXPECT_EQ(spawner.CountSignals(SIGKILL), 3);
  EXPECT_EQ(spawner.CountSignals(SIGCONT), 3);
}

TEST_F(AgentTest, SuspendStopsEveryGroupResumeContinuesThem) {
  MakeAgent().Start();
  EXPECT_EQ(agent->SuspendWorkers(), 4);
  EXPECT_EQ(spawner.CountSignals(SIGTSTP), 4);
  agent->ResumeWorkers(std::chrono::seconds(3));
  EXPECT_EQ(spawner.CountSignals(SIGCONT), 4);
  EXPECT_EQ(agent->state(), AgentState::kRunning);
}

TEST_F(AgentTest, GracePeriodDoesNotRunWhileTheJobIsSuspended) {
  config.shutdown_timeout = 10;
  MakeAgent().Start();
  agent->OnSignal(SIGTERM);
  timers.Advance(std::chrono::seconds(4));
  agent->SuspendWorkers();
  // ctrun itself is stopped for 60 s (no timer runs meanwhile); the loop's clock went on, so
  // after the resume the old deadline (t=10 s) would fire at once. It moves to t=70 s instead.
  agent->ResumeWorkers(std::chrono::seconds(60));
  timers.Advance(std::chrono::seconds(65));
  EXPECT_EQ(spawner.CountSignals(SIGKILL), 0);
  timers.Advance(std::chrono::seconds(1));  // 4 + 6 s of running time: the grace period is over
  EXPECT_EQ(spawner.CountSignals(SIGKILL), 4);
}

TEST_F(AgentTest, SecondSignalSkipsTheGracePeriod) {
  MakeAgent().Start();
  agent->OnSignal(SIGINT);
  agent->OnSignal(SIGINT);
  EXPECT_EQ(spawner.CountSignals(SIGKILL), 4);
  EXPECT_TRUE(hooks.Logged("received SIGINT again: killing the workers now"));
}

// The line names both signals when they differ (it said "SIGINT again" after a SIGTERM).
TEST_F(AgentTest, ASecondSignalOfAnotherKindIsNamedAsSuch) {
  MakeAgent().Start();
  agent->OnSignal(SIGTERM);
  agent->OnSignal(SIGINT);
  EXPECT_EQ(spawner.CountSignals(SIGKILL), 4);
  EXPECT_TRUE(hooks.Logged("received SIGINT after SIGTERM: killing the workers now"));
}

TEST_F(AgentTest, SignalDuringFailureTeardownPreventsRestart) {
  config.max_restarts = 3;
  MakeAgent().Start();
  Exit(Pid(0), ExitStatus::Exited(1));
  agent->OnSignal(SIGTERM);
  for (int i : {1, 2, 3}) Exit(Pid(i), ExitStatus::Signaled(SIGTERM));
  EXPECT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), 128 + SIGTERM);
  EXPECT_EQ(spawner.specs.size(), 4u);
}

TEST_F(AgentTest, Usr1IsForwardedWithoutEndingTheJob) {
  config.forward_only_signals = {SIGUSR1, SIGUSR2};
  MakeAgent().Start();
  agent->OnSignal(SIGUSR1);
  EXPECT_EQ(spawner.CountSignals(SIGUSR1), 4);
  EXPECT_EQ(agent->state(), AgentState::kRunning);
}

TEST_F(AgentTest, ExecFailureEndsWithoutRestartLoop) {
  config.max_restarts = 10;
  MakeAgent();
  spawner.FailNextSpawn(ENOENT);  // worker 0 cannot be executed; 1-3 start (spawned together)
  agent->Start();
  EXPECT_EQ(spawner.CountSignals(SIGKILL), 3);
  for (int i : {0, 1, 2}) Exit(Pid(i), ExitStatus::Signaled(SIGKILL));
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), 127);
  EXPECT_NE(agent->end_message().find("cannot execute ./train"), std::string::npos);
  EXPECT_EQ(spawner.specs.size(), 3u);  // one attempt only
}

TEST_F(AgentTest, ExecFailureOfALaterWorkerStopsTheStartedOnesWithoutBlamingThem) {
  config.max_restarts = 3;
  MakeAgent();
  spawner.FailSpawnNumber(2, EACCES);  // workers 0, 1 and 3 start, worker 2 cannot be executed
  agent->Start();
  EXPECT_EQ(agent->state(), AgentState::kStopping);
  EXPECT_EQ(spawner.CountSignals(SIGKILL), 3);
  for (int i : {0, 1, 2}) Exit(Pid(i), ExitStatus::Signaled(SIGKILL));
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), 126);
  EXPECT_TRUE(agent->failures().empty());  // no worker failed: the summary has nothing to blame
  EXPECT_EQ(spawner.specs.size(), 3u);     // and no restart
}

// A worker whose exec did not finish within the spawner's wait is a started worker: it is
// watched, signalled and stopped like the others, and the user is told why it may be slow.
TEST_F(AgentTest, UnconfirmedExecIsAStartedWorkerWithAWarning) {
  spawner.unconfirmed_exec = true;
  MakeAgent().Start();
  EXPECT_EQ(agent->state(), AgentState::kRunning);
  EXPECT_EQ(agent->live_worker_pids().size(), 4u);
  int warnings = 0;
  for (const auto& l : hooks.logs) warnings += l.rfind("1 ", 0) == 0 && l.find("hung file system") != std::string::npos;
  EXPECT_EQ(warnings, 4);
  Exit(Pid(1), ExitStatus::Exited(127));  // its exec failed late: an ordinary worker failure
  EXPECT_EQ(agent->state(), AgentState::kStopping);
  EXPECT_EQ(spawner.CountSignals(SIGTERM), 3);
}

TEST_F(AgentTest, PrepareFailureEndsTheRun) {
  hooks.fail_prepare = true;
  MakeAgent().Start();
  EXPECT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), 1);
  EXPECT_EQ(agent->end_message(), "prepare failed");
}

TEST_F(AgentTest, UnknownChildrenAreIgnored) {
  MakeAgent().Start();
  agent->OnChildExit(424242, ExitStatus::Exited(9));
  EXPECT_EQ(agent->state(), AgentState::kRunning);
}

TEST_F(AgentTest, EarlySuccessfulWorkerWaitsForTheRest) {
  MakeAgent().Start();
  Exit(Pid(0), ExitStatus::Exited(0));
  EXPECT_EQ(agent->state(), AgentState::kRunning);
  EXPECT_EQ(spawner.signals.size(), 0u);
}

}  // namespace
}  // namespace ctrun

namespace ctrun {
namespace {

TEST_F(AgentTest, FailuresDuringTeardownThatAreNotOurSignalStayRootCauseCandidates) {
  MakeAgent().Start();
  Exit(Pid(1), ExitStatus::Exited(1));            // first detected (e.g. "connection closed")
  Exit(Pid(2), ExitStatus::Signaled(SIGABRT));    // its own crash, detected during teardown
  Exit(Pid(0), ExitStatus::Signaled(SIGTERM));    // ours
  Exit(Pid(3), ExitStatus::Exited(128 + SIGTERM));  // a shell wrapper reporting our SIGTERM
  ASSERT_TRUE(agent->done());
  ASSERT_EQ(agent->failures().size(), 4u);
  EXPECT_FALSE(agent->failures()[0].stopped_by_ctrun);
  EXPECT_FALSE(agent->failures()[1].stopped_by_ctrun);
  EXPECT_TRUE(agent->failures()[2].stopped_by_ctrun);
  EXPECT_TRUE(agent->failures()[3].stopped_by_ctrun);
}

}  // namespace
}  // namespace ctrun

namespace ctrun {
namespace {

TEST_F(AgentTest, WorkersReactingToOurSignalAreNotBlamed) {
  MakeAgent().Start();
  agent->OnSignal(SIGINT);
  Exit(Pid(0), ExitStatus::Exited(1));    // Python: KeyboardInterrupt -> exit 1
  Exit(Pid(1), ExitStatus::Exited(130));  // a shell: 128+SIGINT
  Exit(Pid(2), ExitStatus::Signaled(SIGINT));
  Exit(Pid(3), ExitStatus::Exited(0));
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), 128 + SIGINT);
  EXPECT_EQ(agent->ended_by_signal(), SIGINT);
  ASSERT_EQ(agent->failures().size(), 3u);
  for (const auto& f : agent->failures()) EXPECT_TRUE(f.stopped_by_ctrun) << f.rank.global_rank;
}

TEST_F(AgentTest, EndedBySignalIsZeroForOrdinaryFailures) {
  MakeAgent().Start();
  Exit(Pid(0), ExitStatus::Exited(2));
  for (int i : {1, 2, 3}) Exit(Pid(i), ExitStatus::Signaled(SIGTERM));
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(agent->ended_by_signal(), 0);
}

TEST_F(AgentTest, ConfigureWorkerFinishesEachSpec) {
  MakeAgent().Start();
  ASSERT_EQ(spawner.specs.size(), 4u);
  EXPECT_EQ(spawner.specs[2].cpu_affinity, std::vector<int>{2});
}

// The restart waits for BeforeRestart (the GPUs' release), which gets the previous workers.
TEST_F(AgentTest, RestartWaitsUntilTheHookIsReady) {
  config.max_restarts = 1;
  hooks.defer_restart = true;
  MakeAgent().Start();
  Exit(Pid(0), ExitStatus::Exited(1));
  for (int i : {1, 2, 3}) Exit(Pid(i), ExitStatus::Signaled(SIGTERM));
  EXPECT_EQ(hooks.restart_pids, (std::vector<pid_t>{Pid(0), Pid(1), Pid(2), Pid(3)}));
  EXPECT_EQ(spawner.specs.size(), 4u);
  EXPECT_FALSE(agent->done());
  hooks.pending_restart(Status::Ok());
  EXPECT_EQ(spawner.specs.size(), 8u);
  EXPECT_EQ(agent->state(), AgentState::kRunning);
}

TEST_F(AgentTest, RestartRefusedByTheHookEndsTheRun) {
  config.max_restarts = 1;
  hooks.defer_restart = true;
  MakeAgent().Start();
  Exit(Pid(0), ExitStatus::Exited(1));
  for (int i : {1, 2, 3}) Exit(Pid(i), ExitStatus::Signaled(SIGTERM));
  hooks.pending_restart(Status::Error("not restarting: pid 7 (GPU 0, state D)"));
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), 1);
  EXPECT_EQ(agent->end_message(), "not restarting: pid 7 (GPU 0, state D)");
  EXPECT_EQ(spawner.specs.size(), 4u);
  // The README's exit code 1 ("it would not restart on GPUs the previous attempt still holds"),
  // decided where every exit code is: not the failed worker's code.
  const RunOutcome o = DecideJobOutcome(*agent, {WorkerFailure{}});
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_EQ(o.kind, OutcomeKind::kSetupError);
  EXPECT_EQ(o.root_cause, "not restarting: pid 7 (GPU 0, state D)");
}

// A worker given up on after SIGKILL (D state) exits while the restart waits for the GPUs: the
// attempt ended once, so its exit neither counts the failure again nor ends the run.
TEST_F(AgentTest, AWorkerGivenUpOnThatExitsWhileTheRestartWaitsEndsNothing) {
  config.max_restarts = 1;
  config.shutdown_timeout = 1;
  hooks.defer_restart = true;
  MakeAgent().Start();
  spawner.unkillable.insert(Pid(3));
  Exit(Pid(0), ExitStatus::Exited(1));
  for (int i : {1, 2}) Exit(Pid(i), ExitStatus::Signaled(SIGTERM));
  timers.Advance(std::chrono::seconds(1));
  timers.Advance(Agent::kFinalWait);
  ASSERT_EQ(agent->state(), AgentState::kBackoff) << "waiting for the GPUs";
  ASSERT_EQ(hooks.failed_attempts.size(), 1u);
  spawner.alive_groups.erase(Pid(3));
  agent->OnChildExit(Pid(3), ExitStatus::Signaled(SIGKILL));
  EXPECT_FALSE(agent->done());
  EXPECT_EQ(hooks.failed_attempts.size(), 1u) << "the attempt ended once";
  EXPECT_EQ(agent->restart_count(), 1);
  hooks.pending_restart(Status::Ok());
  EXPECT_EQ(spawner.specs.size(), 8u);
  EXPECT_EQ(agent->state(), AgentState::kRunning);
  EXPECT_EQ(agent->restart_count(), 1);
}

TEST_F(AgentTest, SignalWhileWaitingToRestartEndsTheRunAtOnce) {
  config.max_restarts = 1;
  hooks.defer_restart = true;
  MakeAgent().Start();
  Exit(Pid(0), ExitStatus::Exited(1));
  for (int i : {1, 2, 3}) Exit(Pid(i), ExitStatus::Signaled(SIGTERM));
  agent->OnSignal(SIGINT);
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), 128 + SIGINT);
  hooks.pending_restart(Status::Ok());  // late: ignored
  EXPECT_EQ(spawner.specs.size(), 4u);
}

// The same wait after a --restart-backoff delay: a signal ends the run there too.
TEST_F(AgentTest, SignalWhileWaitingForTheGpusAfterTheBackoffEndsTheRunAtOnce) {
  config.max_restarts = 1;
  config.restart_backoff = 2;
  hooks.defer_restart = true;
  MakeAgent().Start();
  Exit(Pid(0), ExitStatus::Exited(1));
  for (int i : {1, 2, 3}) Exit(Pid(i), ExitStatus::Signaled(SIGTERM));
  timers.Advance(std::chrono::seconds(2));
  ASSERT_TRUE(hooks.pending_restart) << "the backoff is over; the GPUs are awaited";
  agent->OnSignal(SIGTERM);
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), 128 + SIGTERM);
  hooks.pending_restart(Status::Ok());  // late: ignored
  EXPECT_EQ(spawner.specs.size(), 4u);
}

}  // namespace
}  // namespace ctrun
