#include "health/restart_policy.h"

#include <gtest/gtest.h>

namespace ctrun::health {
namespace {

RestartPolicyOptions Opts(double initial, double max, bool heartbeats, int limit) {
  return {Seconds(initial), Seconds(max), heartbeats, limit};
}

TEST(RestartPolicyTest, NoBackoffByDefault) {
  RestartPolicy p(Opts(0, 300, false, 3));
  for (int i = 0; i < 10; ++i) {
    RestartDecision d = p.OnFailedAttempt(std::nullopt);
    EXPECT_FALSE(d.crash_loop);
    EXPECT_EQ(d.delay, Duration::zero());
  }
}

TEST(RestartPolicyTest, DoublesUpToTheCap) {
  RestartPolicy p(Opts(0.5, 3, false, 0));
  std::vector<double> got;
  for (int i = 0; i < 5; ++i) got.push_back(ToSeconds(p.OnFailedAttempt(std::nullopt).delay));
  EXPECT_EQ(got, (std::vector<double>{0.5, 1, 2, 3, 3}));
}

TEST(RestartPolicyTest, CapBelowInitialMeansInitial) {
  RestartPolicy p(Opts(5, 1, false, 0));
  EXPECT_EQ(ToSeconds(p.OnFailedAttempt(std::nullopt).delay), 5);
  EXPECT_EQ(ToSeconds(p.OnFailedAttempt(std::nullopt).delay), 5);
}

TEST(RestartPolicyTest, CrashLoopNeedsHeartbeats) {
  RestartPolicy p(Opts(0, 0, false, 1));
  EXPECT_FALSE(p.OnFailedAttempt(std::nullopt).crash_loop);
  EXPECT_FALSE(p.OnFailedAttempt(std::nullopt).crash_loop);
}

TEST(RestartPolicyTest, CrashLoopAfterLimitAttemptsWithoutProgress) {
  RestartPolicy p(Opts(0, 0, true, 3));
  EXPECT_FALSE(p.OnFailedAttempt(1200).crash_loop);  // first beats: progress
  EXPECT_FALSE(p.OnFailedAttempt(1200).crash_loop);  // 1
  EXPECT_FALSE(p.OnFailedAttempt(900).crash_loop);   // 2 (behind the best)
  RestartDecision d = p.OnFailedAttempt(std::nullopt);  // 3
  EXPECT_TRUE(d.crash_loop);
  EXPECT_EQ(d.why,
            "crash loop: 3 attempts in a row failed without progress (no heartbeat step beyond 1200); not "
            "restarting again (--crash-loop-limit)");
}

TEST(RestartPolicyTest, ProgressResetsTheCountAndTheDelay) {
  RestartPolicy p(Opts(1, 100, true, 2));
  EXPECT_EQ(ToSeconds(p.OnFailedAttempt(10).delay), 1);
  EXPECT_EQ(ToSeconds(p.OnFailedAttempt(10).delay), 2);
  EXPECT_EQ(p.attempts_without_progress(), 1);
  EXPECT_EQ(ToSeconds(p.OnFailedAttempt(11).delay), 1);
  EXPECT_EQ(p.attempts_without_progress(), 0);
}

TEST(RestartPolicyTest, NeverBeatingIsACrashLoop) {
  RestartPolicy p(Opts(0, 0, true, 2));
  EXPECT_FALSE(p.OnFailedAttempt(std::nullopt).crash_loop);
  RestartDecision d = p.OnFailedAttempt(std::nullopt);
  EXPECT_TRUE(d.crash_loop);
  EXPECT_NE(d.why.find("(no heartbeat)"), std::string::npos) << d.why;
}

}  // namespace
}  // namespace ctrun::health
