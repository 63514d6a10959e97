// --late-exit-notice: ranks still running well after a rank of the attempt exited 0 are named in a
// warning, at T, 2T, 4T...; a fake spawner and a fake clock: no fork, no sleep.
#include <gtest/gtest.h>

#include <algorithm>

#include "agent/agent.h"
#include "fakes/agent_fixture.h"

namespace ctrun {
namespace {

class RecordingEvents : public EventSink {
 public:
  void Emit(std::string_view event, const nlohmann::json& fields) override {
    if (event == events::kLateExit) late_exits.push_back(fields);
  }
  std::vector<nlohmann::json> late_exits;
};

class AgentLateExitTest : public testing::AgentFixture {
 protected:
  AgentLateExitTest() { config.late_exit_notice = 60; }
  void Attach(Agent& a) override { a.SetEventSink(&events); }
  RecordingEvents events;
  size_t Notices() const {
    return static_cast<size_t>(std::count_if(hooks.logs.begin(), hooks.logs.end(), [](const std::string& l) {
      return l.find("still running:") != std::string::npos;
    }));
  }
};

TEST_F(AgentLateExitTest, NamesTheRanksStillRunningAtTTwiceTFourTAndStopsNothing) {
  MakeAgent().Start();
  timers.Advance(Seconds(5));
  Exit(Pid(2), ExitStatus::Exited(0));  // the first exit 0: the clock starts here
  timers.Advance(Seconds(10));
  Exit(Pid(0), ExitStatus::Exited(0));
  timers.Advance(Seconds(49.999));
  EXPECT_EQ(Notices(), 0u);
  timers.Advance(Seconds(0.001));
  ASSERT_EQ(Notices(), 1u);
  EXPECT_EQ(hooks.logs.back(),
            "1 ranks 0, 2 exited 0, the first 60 s ago; still running: worker rank 1 (local_rank 1, pid 1001), "
            "worker rank 3 (local_rank 3, pid 1003)");
  Exit(Pid(3), ExitStatus::Exited(0));
  timers.Advance(Seconds(60));
  ASSERT_EQ(Notices(), 2u);
  EXPECT_EQ(hooks.logs.back(),
            "1 ranks 0, 2-3 exited 0, the first 120 s ago; still running: worker rank 1 (local_rank 1, pid 1001)");
  timers.Advance(Seconds(119));
  EXPECT_EQ(Notices(), 2u);
  timers.Advance(Seconds(1));
  EXPECT_EQ(Notices(), 3u);
  EXPECT_TRUE(hooks.Logged("the first 240 s ago"));
  ASSERT_EQ(events.late_exits.size(), 3u);
  EXPECT_EQ(events.late_exits[0],
            nlohmann::json({{"attempt", 0}, {"after_s", 60.0}, {"finished_ranks", {0, 2}}, {"running_ranks", {1, 3}}}));
  EXPECT_EQ(events.late_exits[2]["after_s"], 240.0);
  EXPECT_EQ(events.late_exits[2]["running_ranks"], nlohmann::json({1}));
  EXPECT_EQ(agent->state(), AgentState::kRunning);
  EXPECT_EQ(spawner.CountSignals(SIGTERM), 0);
  EXPECT_EQ(spawner.CountSignals(SIGKILL), 0);
  Exit(Pid(1), ExitStatus::Exited(0));
  ASSERT_TRUE(agent->done());
  EXPECT_EQ(agent->exit_code(), 0);
  timers.Advance(Seconds(1000));
  EXPECT_EQ(Notices(), 3u);
}

TEST_F(AgentLateExitTest, OneFinishedRankIsNamedAlone) {
  MakeAgent().Start();
  Exit(Pid(0), ExitStatus::Exited(0));
  timers.Advance(Seconds(60));
  ASSERT_EQ(Notices(), 1u);
  EXPECT_EQ(hooks.logs.back().rfind("1 rank 0 exited 0 60 s ago; still running: worker rank 1 (local_rank 1", 0), 0u)
      << hooks.logs.back();
}

TEST_F(AgentLateExitTest, ManyRanksLeftAreCountedAfterTheFirstEight) {
  config.nproc_per_node = 12;
  MakeAgent().Start();
  Exit(Pid(11), ExitStatus::Exited(0));
  timers.Advance(Seconds(60));
  ASSERT_EQ(Notices(), 1u);
  EXPECT_NE(hooks.logs.back().find("worker rank 7 (local_rank 7, pid 1007) and 3 more"), std::string::npos)
      << hooks.logs.back();
  EXPECT_EQ(hooks.logs.back().find("worker rank 8 "), std::string::npos);
}

TEST_F(AgentLateExitTest, ZeroTurnsItOff) {
  config.late_exit_notice = 0;
  MakeAgent().Start();
  Exit(Pid(0), ExitStatus::Exited(0));
  timers.Advance(Seconds(100000));
  EXPECT_EQ(Notices(), 0u);
  EXPECT_TRUE(events.late_exits.empty());
  EXPECT_EQ(agent->state(), AgentState::kRunning);
}

TEST_F(AgentLateExitTest, NoNoticeWithoutAnExitZeroNorOnceTheAttemptStops) {
  config.max_restarts = 1;
  MakeAgent().Start();
  timers.Advance(Seconds(600));
  EXPECT_EQ(Notices(), 0u);  // nobody finished: a long run is no late exit
  Exit(Pid(0), ExitStatus::Exited(0));
  Exit(Pid(1), ExitStatus::Exited(1));  // a failure stops the attempt, and the restart follows
  for (pid_t pid : agent->live_worker_pids()) Exit(pid, ExitStatus::Signaled(SIGTERM));
  ASSERT_EQ(agent->restart_count(), 1);
  ASSERT_EQ(agent->state(), AgentState::kRunning);
  timers.Advance(Seconds(600));
  EXPECT_EQ(Notices(), 0u);  // the new attempt has no exit 0 yet
  Exit(LastPid(3), ExitStatus::Exited(0));
  timers.Advance(Seconds(60));
  EXPECT_EQ(Notices(), 1u);
  EXPECT_TRUE(hooks.Logged("rank 3 exited 0 60 s ago"));
}

TEST_F(AgentLateExitTest, TimeTheJobWasSuspendedDoesNotCount) {
  MakeAgent().Start();
  Exit(Pid(0), ExitStatus::Exited(0));
  timers.Advance(Seconds(20));
  agent->SuspendWorkers();
  agent->ResumeWorkers(Seconds(30));  // as if 30 s passed stopped: ctrun's loop did not run meanwhile
  timers.Advance(Seconds(69));
  EXPECT_EQ(Notices(), 0u);
  timers.Advance(Seconds(1));
  EXPECT_EQ(Notices(), 1u);
  EXPECT_TRUE(hooks.Logged("rank 0 exited 0 60 s ago"));
}

}  // namespace
}  // namespace ctrun
