// The agent's --max-run-time deadline, its events and the job outcome decided from it, with a fake
// spawner and a fake clock: no fork, no sleep.
#include <gtest/gtest.h>

#include "agent/agent.h"
#include "agent/job_outcome.h"
#include "fakes/agent_fixture.h"

namespace ctrun {
namespace {

using nlohmann::json;

class RecordingEvents : public EventSink {
 public:
  void Emit(std::string_view event, const json& fields) override { events.emplace_back(std::string(event), fields); }
  std::vector<std::string> Names() const {
    std::vector<std::string> n;
    for (const auto& e : events) n.push_back(e.first);
    return n;
  }
  const json* Find(const std::string& name) const {
    for (const auto& e : events)
      if (e.first == name) return &e.second;
    return nullptr;
  }
  std::vector<std::pair<std::string, json>> events;
};

class AgentDeadlineTest : public testing::AgentFixture {
 protected:
  AgentDeadlineTest() {
    config.max_run_time = 10;
    hooks.prepare_error = "cannot host the workers' store";
  }
  void Attach(Agent& a) override { a.SetEventSink(&events); }
  Agent& Start() {
    MakeAgent().Start();
    return *agent;
  }

  RecordingEvents events;
};

TEST_F(AgentDeadlineTest, StopsTheRunningRanksAtTheDeadlineAndEndsWith124) {
  Start();
  timers.Advance(Seconds(5));
  Exit(Pid(2), ExitStatus::Exited(0));
  timers.Advance(Seconds(4.999));
  EXPECT_EQ(agent->state(), AgentState::kRunning);
  EXPECT_EQ(spawner.CountSignals(SIGTERM), 0);
  timers.Advance(Seconds(0.001));
  EXPECT_EQ(agent->state(), AgentState::kStopping);
  EXPECT_EQ(spawner.CountSignals(SIGTERM), 3);
  EXPECT_TRUE(agent->deadline_reached());
  EXPECT_EQ(agent->running_at_deadline(), (std::vector<int>{0, 1, 3}));
  EXPECT_TRUE(hooks.Logged("2 reached --max-run-time (10 s); ranks still running: 0, 1, 3; stopping them"))
      << hooks.logs.back();
  for (int i : {0, 1, 3}) Exit(Pid(i), ExitStatus::Signaled(SIGTERM));
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), 124);
  for (const auto& f : agent->failures()) EXPECT_TRUE(f.stopped_by_ctrun) << f.rank.global_rank;

  const RunOutcome o = DecideJobOutcome(*agent, {});
  EXPECT_EQ(o.kind, OutcomeKind::kMaxRunTime);
  EXPECT_EQ(o.exit_code, 124);
  EXPECT_EQ(o.root_cause, "reached --max-run-time (10 s); ranks still running: 0, 1, 3");
}

TEST_F(AgentDeadlineTest, WorkersThatIgnoreSigtermAreKilledAfterTheGracePeriod) {
  config.shutdown_timeout = 2;
  Start();
  timers.Advance(Seconds(10));
  EXPECT_EQ(spawner.CountSignals(SIGTERM), 4);
  timers.Advance(Seconds(2));
  EXPECT_EQ(spawner.CountSignals(SIGKILL), 4);
  for (int i = 0; i < 4; ++i) agent->OnChildExit(Pid(i), ExitStatus::Signaled(SIGKILL));
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), 124);
}

TEST_F(AgentDeadlineTest, ADeadlineDuringAFailureTeardownEndsTheRunInsteadOfRestarting) {
  config.max_restarts = 3;
  Start();
  timers.Advance(Seconds(9));
  Exit(Pid(1), ExitStatus::Exited(5));
  EXPECT_EQ(agent->state(), AgentState::kStopping);
  timers.Advance(Seconds(1));
  EXPECT_EQ(agent->running_at_deadline(), (std::vector<int>{0, 2, 3}));
  for (int i : {0, 2, 3}) Exit(Pid(i), ExitStatus::Signaled(SIGTERM));
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), 124);
  EXPECT_EQ(spawner.specs.size(), 4u) << "no restart after the deadline";
}

// Every worker exited 0 before the deadline, but one left a process in its group that ignores
// SIGTERM: the deadline passing during that sweep does not turn the success into 124.
TEST_F(AgentDeadlineTest, ADeadlineDuringTheSweepAfterASuccessKeepsTheSuccess) {
  config.shutdown_timeout = 5;
  Start();
  timers.Advance(Seconds(8));
  for (int i : {0, 1, 2}) Exit(Pid(i), ExitStatus::Exited(0));
  agent->OnChildExit(Pid(3), ExitStatus::Exited(0));  // its group keeps a member
  EXPECT_EQ(agent->state(), AgentState::kStopping);
  timers.Advance(Seconds(2));
  EXPECT_FALSE(agent->deadline_reached());
  timers.Advance(Seconds(5));
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), 0);
  EXPECT_EQ(DecideJobOutcome(*agent, {}).exit_code, 0);
}

// The deadline passes while the restart waits for the GPUs (every worker of the failed attempt
// gone): the run ends with 124 there, and the wait's late answer starts no attempt.
TEST_F(AgentDeadlineTest, ADeadlineWhileTheRestartWaitsForTheGpusEndsTheRun) {
  config.max_restarts = 3;
  hooks.defer_restart = true;
  Start();
  timers.Advance(Seconds(9));
  Exit(Pid(1), ExitStatus::Exited(5));
  for (int i : {0, 2, 3}) Exit(Pid(i), ExitStatus::Signaled(SIGTERM));
  ASSERT_EQ(agent->state(), AgentState::kBackoff);
  timers.Advance(Seconds(1));
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), 124);
  EXPECT_TRUE(agent->running_at_deadline().empty());
  hooks.pending_restart(Status::Ok());
  EXPECT_EQ(spawner.specs.size(), 4u) << "no restart after the deadline";
  EXPECT_EQ(DecideJobOutcome(*agent, {}).exit_code, 124);
}

TEST_F(AgentDeadlineTest, NoDeadlineTimerWithoutTheFlagOrAfterTheEnd) {
  config.max_run_time.reset();
  Start();
  EXPECT_EQ(timers.pending(), 0u);
  config.max_run_time = 10;
  Start();
  for (int i = 4; i < 8; ++i) Exit(Pid(i), ExitStatus::Exited(0));
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(timers.pending(), 0u) << "the deadline is cancelled when the run ends";
  EXPECT_EQ(agent->exit_code(), 0);
}

TEST_F(AgentDeadlineTest, EventsTellTheRunInOrder) {
  config.nproc_per_node = 2;
  config.max_restarts = 1;
  config.max_run_time.reset();
  Start();
  Exit(Pid(0), ExitStatus::Exited(3));
  Exit(Pid(1), ExitStatus::Signaled(SIGTERM));
  Exit(Pid(2), ExitStatus::Exited(0));
  Exit(Pid(3), ExitStatus::Exited(0));
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(events.Names(),
            (std::vector<std::string>{"attempt_start", "worker_start", "worker_start", "worker_exit", "stop",
                                      "worker_exit", "restart", "attempt_start", "worker_start", "worker_start",
                                      "worker_exit", "worker_exit", "stop"}));
  const json& failed = events.events[3].second;
  EXPECT_EQ(failed["rank"], 0);
  EXPECT_EQ(failed["pid"], Pid(0));
  EXPECT_EQ(failed["cause"], "failed");
  EXPECT_EQ(failed["exit_code"], 3);
  EXPECT_EQ(failed["attempt"], 0);
  EXPECT_EQ(events.events[4].second["reason"], "failure");
  const json& stopped = events.events[5].second;
  EXPECT_EQ(stopped["cause"], "stopped");
  EXPECT_EQ(stopped["signal_name"], "SIGTERM");
  EXPECT_EQ(events.events[6].second["restart_count"], 1);
  EXPECT_EQ(events.events[7].second["restart_count"], 1);
  EXPECT_EQ(events.events[8].second["pid"], Pid(2));
  EXPECT_EQ(events.events[10].second["cause"], "succeeded");
  EXPECT_EQ(events.events[12].second["reason"], "success");
}

TEST_F(AgentDeadlineTest, StartErrorIsAnEventAndItsOwnOutcome) {
  config.max_run_time.reset();
  spawner.FailSpawnNumber(1, ENOENT);
  Start();
  ASSERT_EQ(spawner.specs.size(), 3u);
  for (size_t i = 0; i < 3; ++i) Exit(Pid(i), ExitStatus::Signaled(SIGKILL));
  ASSERT_TRUE(agent->done());
  const json* e = events.Find("start_error");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ((*e)["local_rank"], 1);
  EXPECT_EQ((*e)["exit_code"], 127);
  const RunOutcome o = DecideJobOutcome(*agent, {});
  EXPECT_EQ(o.kind, OutcomeKind::kStartError);
  EXPECT_EQ(o.exit_code, 127);
  EXPECT_NE(o.root_cause.find("cannot execute"), std::string::npos) << o.root_cause;
}

TEST_F(AgentDeadlineTest, AnAttemptThatCannotBePreparedIsASetupError) {
  hooks.fail_prepare = true;
  Start();
  ASSERT_TRUE(agent->done());
  const RunOutcome o = DecideJobOutcome(*agent, {});
  EXPECT_EQ(o.kind, OutcomeKind::kSetupError);
  EXPECT_EQ(o.exit_code, 1);
  EXPECT_EQ(o.root_cause, "cannot host the workers' store");
}

// The restart's attempt cannot be prepared (its log directory, its store): the run ends as a set-up
// error, and the failure that called for the restart stays in the summary.
TEST_F(AgentDeadlineTest, ARestartThatCannotBePreparedKeepsTheFailureThatCalledForIt) {
  config.max_restarts = 1;
  Start();
  Exit(Pid(2), ExitStatus::Exited(3));
  hooks.fail_prepare = true;
  for (int i : {0, 1, 3}) Exit(Pid(i), ExitStatus::Signaled(SIGTERM));
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(DecideJobOutcome(*agent, {}).kind, OutcomeKind::kSetupError);
  bool kept = false;
  for (const auto& f : agent->failures()) kept |= f.rank.global_rank == 2 && !f.stopped_by_ctrun;
  EXPECT_TRUE(kept) << agent->failures().size() << " failures";
}

}  // namespace
}  // namespace ctrun
