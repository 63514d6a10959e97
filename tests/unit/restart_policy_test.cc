#include "health/restart_policy.h"

#include <gtest/gtest.h>

namespace ctrun::health {
namespace {

RestartPolicyOptions Opts(double initial, double max, bool heartbeats, int limit) {
  return {Seconds(initial), Seconds(max), heartbeats, limit};
}
AttemptBeats NoBeat() { return {}; }
AttemptBeats Step(uint64_t step) { return {step, true}; }
AttemptBeats BeatsWithoutStep() { return {std::nullopt, true}; }

TEST(RestartPolicyTest, NoBackoffByDefault) {
  RestartPolicy p(Opts(0, 300, false, 3));
  for (int i = 0; i < 10; ++i) {
    RestartDecision d = p.OnFailedAttempt(NoBeat());
    EXPECT_FALSE(d.crash_loop);
    EXPECT_EQ(d.delay, Duration::zero());
  }
}

TEST(RestartPolicyTest, DoublesUpToTheCap) {
  RestartPolicy p(Opts(0.5, 3, false, 0));
  std::vector<double> got;
  for (int i = 0; i < 5; ++i) got.push_back(ToSeconds(p.OnFailedAttempt(NoBeat()).delay));
  EXPECT_EQ(got, (std::vector<double>{0.5, 1, 2, 3, 3}));
}

TEST(RestartPolicyTest, CapBelowInitialMeansInitial) {
  RestartPolicy p(Opts(5, 1, false, 0));
  EXPECT_EQ(ToSeconds(p.OnFailedAttempt(NoBeat()).delay), 5);
  EXPECT_EQ(ToSeconds(p.OnFailedAttempt(NoBeat()).delay), 5);
}

TEST(RestartPolicyTest, CrashLoopNeedsHeartbeats) {
  RestartPolicy p(Opts(0, 0, false, 1));
  EXPECT_FALSE(p.OnFailedAttempt(NoBeat()).crash_loop);
  EXPECT_FALSE(p.OnFailedAttempt(NoBeat()).crash_loop);
}

TEST(RestartPolicyTest, CrashLoopAfterLimitAttemptsWithoutProgress) {
  RestartPolicy p(Opts(0, 0, true, 3));
  EXPECT_FALSE(p.OnFailedAttempt(Step(1200)).crash_loop);  // first beats: progress
  EXPECT_FALSE(p.OnFailedAttempt(Step(1200)).crash_loop);  // 1
  EXPECT_FALSE(p.OnFailedAttempt(Step(900)).crash_loop);   // 2 (behind the best)
  RestartDecision d = p.OnFailedAttempt(NoBeat());  // 3
  EXPECT_TRUE(d.crash_loop);
  EXPECT_EQ(d.why,
            "crash loop: 3 attempts in a row failed without progress (no heartbeat step beyond 1200); not "
            "restarting again (--crash-loop-limit)");
}

TEST(RestartPolicyTest, ProgressResetsTheCountAndTheDelay) {
  RestartPolicy p(Opts(1, 100, true, 2));
  EXPECT_EQ(ToSeconds(p.OnFailedAttempt(Step(10)).delay), 1);
  EXPECT_EQ(ToSeconds(p.OnFailedAttempt(Step(10)).delay), 2);
  EXPECT_EQ(p.attempts_without_progress(), 1);
  EXPECT_EQ(ToSeconds(p.OnFailedAttempt(Step(11)).delay), 1);
  EXPECT_EQ(p.attempts_without_progress(), 0);
}

TEST(RestartPolicyTest, NeverBeatingIsACrashLoop) {
  RestartPolicy p(Opts(0, 0, true, 2));
  EXPECT_FALSE(p.OnFailedAttempt(NoBeat()).crash_loop);
  RestartDecision d = p.OnFailedAttempt(NoBeat());
  EXPECT_TRUE(d.crash_loop);
  EXPECT_NE(d.why.find("(no heartbeat)"), std::string::npos) << d.why;
}

// Beats without a comparable step (lines without a number, the library's beat counter) say the
// rank was alive but not how far it got: such an attempt is no crash-loop attempt, and the ones
// before it are no longer in a row. A job beating that way that fails now and then is never
// taken for a crash loop. The back-off is not reset by it.
TEST(RestartPolicyTest, AttemptsThatBeatWithoutAComparableStepAreNotJudged) {
  RestartPolicy p(Opts(1, 100, true, 2));
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(p.OnFailedAttempt(BeatsWithoutStep()).crash_loop) << i;
  EXPECT_EQ(p.attempts_without_progress(), 0);
  EXPECT_FALSE(p.OnFailedAttempt(NoBeat()).crash_loop);
  EXPECT_FALSE(p.OnFailedAttempt(BeatsWithoutStep()).crash_loop);
  EXPECT_FALSE(p.OnFailedAttempt(NoBeat()).crash_loop) << "not in a row";
  EXPECT_TRUE(p.OnFailedAttempt(NoBeat()).crash_loop);
  RestartPolicy q(Opts(1, 100, true, 0));
  EXPECT_EQ(ToSeconds(q.OnFailedAttempt(BeatsWithoutStep()).delay), 1);
  EXPECT_EQ(ToSeconds(q.OnFailedAttempt(BeatsWithoutStep()).delay), 2) << "the back-off still grows";
}

}  // namespace
}  // namespace ctrun::health
