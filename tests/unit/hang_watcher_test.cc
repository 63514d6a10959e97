// HangWatcher's deadlines on a fake clock: first beat, later beats, output, verdict texts, and the
// verdict given at the deadline itself.
#include "health/hang_watcher.h"

#include <gtest/gtest.h>

#include "fakes/fake_timer_queue.h"

namespace ctrun::health {
namespace {

using ctrun::testing::FakeTimerQueue;

struct Verdict {
  int rank;
  std::string why;
  TimePoint at;
  std::vector<int> also_silent;
};

class HangWatcherTest : public ::testing::Test {
 protected:
  HangWatcher& Make(HangWatchOptions o) {
    watcher = std::make_unique<HangWatcher>(timers, o,
                                            [this](int r, const std::string& why, const std::vector<int>& silent) {
                                              verdicts.push_back({r, why, timers.Now(), silent});
                                            });
    return *watcher;
  }
  static HangWatchOptions Beats(double every, double first) {
    HangWatchOptions o;
    o.heartbeat = Seconds(every);
    o.first_heartbeat = Seconds(first);
    return o;
  }
  FakeTimerQueue timers;
  std::vector<Verdict> verdicts;
  std::unique_ptr<HangWatcher> watcher;
};

TEST_F(HangWatcherTest, FirstBeatHasItsOwnLongerDeadline) {
  Make(Beats(5, 60)).Start(2);
  const TimePoint t0 = timers.Now();
  for (int i = 1; i <= 14; ++i) {  // rank 0 beats every 4 s; rank 1 never does
    timers.Advance(Seconds(4));
    watcher->Beat(0, static_cast<uint64_t>(i));
  }
  timers.Advance(Seconds(3.999));
  EXPECT_TRUE(verdicts.empty());
  timers.Advance(Seconds(0.001));
  ASSERT_EQ(verdicts.size(), 1u);
  EXPECT_EQ(verdicts[0].rank, 1);
  EXPECT_EQ(verdicts[0].at, t0 + Seconds(60));
  EXPECT_EQ(verdicts[0].why, "hung: no first heartbeat within 60 s");
}

// A rank whose heartbeat channel could not be created never beats: it is neither judged by
// beats nor named as silent with another rank; its output deadline still holds.
TEST_F(HangWatcherTest, ARankWithoutAChannelIsNotJudgedByBeats) {
  HangWatchOptions o = Beats(5, 10);
  o.output = Seconds(100);
  Make(o).Start(3);
  watcher->IgnoreBeats(1);
  const TimePoint t0 = timers.Now();
  for (int i = 0; i < 4; ++i) {  // ranks 0 and 2 beat for 8 s; rank 1 never beats
    timers.Advance(Seconds(2));
    watcher->Beat(0, std::nullopt);
    watcher->Beat(2, std::nullopt);
  }
  watcher->Output(0);
  watcher->Output(2);
  timers.Advance(Seconds(5));  // rank 0 and 2 beat last at 8 s: the verdict is at 13 s
  ASSERT_EQ(verdicts.size(), 1u);
  EXPECT_EQ(verdicts[0].rank, 0);
  EXPECT_EQ(verdicts[0].at, t0 + Seconds(13));
  EXPECT_EQ(verdicts[0].also_silent, (std::vector<int>{2}));  // not 1
  Make(o).Start(2);
  watcher->IgnoreBeats(1);
  const TimePoint t1 = timers.Now();
  for (int i = 0; i < 60; ++i) {
    timers.Advance(Seconds(2));
    watcher->Beat(0, std::nullopt);
    watcher->Output(0);
  }
  timers.Advance(Seconds(0));
  ASSERT_EQ(verdicts.size(), 2u);
  EXPECT_EQ(verdicts[1].rank, 1);
  EXPECT_EQ(verdicts[1].at, t1 + Seconds(100));
  EXPECT_EQ(verdicts[1].why, "hung: no output for 100 s");
}

// Ctrl-Z, 100 s, fg: the job stood still, nobody was silent. Every deadline moves by the time it
// stood still (the timers that fell due meanwhile find the later deadline and re-arm): the first
// beat's deadline, the output deadline, and the beat deadlines, counted from the end of the
// first-beat grace too.
TEST_F(HangWatcherTest, TheTimeTheJobStoodStillIsNotSilence) {
  HangWatchOptions o = Beats(5, 60);
  o.output = Seconds(20);
  Make(o).Start(2);
  timers.Advance(Seconds(1));
  watcher->Beat(0, 7);  // rank 1 has not beaten yet
  timers.Advance(Seconds(2));
  timers.Jump(Seconds(100));
  watcher->Resumed(Seconds(100));
  timers.Advance(Duration::zero());
  EXPECT_TRUE(verdicts.empty()) << verdicts.front().why;
  for (int i = 0; i < 5; ++i) {  // to 153 s: the first-beat deadline is 60 + 100 s
    timers.Advance(Seconds(10));
    watcher->Output(0);
    watcher->Output(1);
  }
  watcher->Beat(1, 7);  // the grace ends here: rank 0's beat deadline is 158 s
  timers.Advance(Seconds(2));
  watcher->Beat(1, 8);
  timers.Jump(Seconds(10));  // stood still again, from 155 s to 165 s
  watcher->Resumed(Seconds(10));
  timers.Advance(Seconds(2.999));  // rank 0's beat deadline: 153 + 5 + 10 s
  EXPECT_TRUE(verdicts.empty()) << verdicts.front().why;
  timers.Advance(Seconds(0.001));
  ASSERT_EQ(verdicts.size(), 1u);
  EXPECT_EQ(verdicts[0].rank, 0);
  EXPECT_EQ(verdicts[0].why, "hung: no heartbeat for 57 s (last beat at step 7)");
}

// Rank 0 loads its checkpoint from the page cache, beats step 0 and waits in the first collective
// for ranks 1 and 2, one still reading from network storage. Until every rank has beaten, no rank
// is judged on the short timeout: a rank inside its first-beat deadline is loading, not hung, and
// is neither blamed nor named silent. A rank that never beats is still found at that deadline.
TEST_F(HangWatcherTest, RanksThatBeatWaitForThePeersStillInsideTheirFirstBeatDeadline) {
  Make(Beats(60, 600)).Start(3);
  const TimePoint t0 = timers.Now();
  timers.Advance(Seconds(5));
  watcher->Beat(0, 0);
  timers.Advance(Seconds(5));
  watcher->Beat(1, 0);
  timers.Advance(Seconds(589.999));
  EXPECT_TRUE(verdicts.empty()) << verdicts.front().why;
  timers.Advance(Seconds(0.001));
  ASSERT_EQ(verdicts.size(), 1u);
  EXPECT_EQ(verdicts[0].rank, 2);
  EXPECT_EQ(verdicts[0].at, t0 + Seconds(600));
  EXPECT_EQ(verdicts[0].why, "hung: no first heartbeat within 600 s");
  EXPECT_EQ(verdicts[0].also_silent, (std::vector<int>{0, 1})) << "the ranks that wait for it";
  EXPECT_EQ(timers.pending(), 0u);
}

// The grace ends with the last first beat: from then on each rank has the normal timeout from its
// last beat, and a rank that waited through the grace has it from the grace's end, no longer.
TEST_F(HangWatcherTest, TheLastFirstBeatStartsEveryRanksNormalTimeout) {
  Make(Beats(60, 600)).Start(2);
  const TimePoint t0 = timers.Now();
  timers.Advance(Seconds(5));
  watcher->Beat(0, 0);
  timers.Advance(Seconds(295));
  watcher->Beat(1, 0);  // 300 s: rank 0 waited until now; it has until 360 s
  for (int i = 1; i <= 6; ++i) {
    timers.Advance(Seconds(10));
    watcher->Beat(1, static_cast<uint64_t>(i));
  }
  timers.Advance(Seconds(0.001));
  ASSERT_EQ(verdicts.size(), 1u);
  EXPECT_EQ(verdicts[0].rank, 0);
  EXPECT_EQ(verdicts[0].at, t0 + Seconds(360));
  EXPECT_EQ(verdicts[0].why, "hung: no heartbeat for 355 s (last beat at step 0)");
  EXPECT_TRUE(verdicts[0].also_silent.empty());

  Make(Beats(60, 600)).Start(2);
  timers.Advance(Seconds(5));
  watcher->Beat(0, 0);
  timers.Advance(Seconds(295));
  watcher->Beat(1, 0);
  TimePoint last;
  for (int i = 1; i <= 10; ++i) {  // both beat until 400 s, then rank 1 stops
    timers.Advance(Seconds(10));
    watcher->Beat(0, static_cast<uint64_t>(i));
    watcher->Beat(1, static_cast<uint64_t>(i));
    last = timers.Now();
  }
  watcher->Beat(0, 10);  // rank 0 beats on
  timers.Advance(Seconds(59.999));
  watcher->Beat(0, 10);
  EXPECT_EQ(verdicts.size(), 1u);
  timers.Advance(Seconds(0.001));
  ASSERT_EQ(verdicts.size(), 2u);
  EXPECT_EQ(verdicts[1].rank, 1);
  EXPECT_EQ(verdicts[1].at, last + Seconds(60)) << "no grace left once every rank has beaten";
  EXPECT_EQ(verdicts[1].why, "hung: no heartbeat for 60 s (last beat at step 10)");
}

// The last rank without a beat exits (or has no channel): the others wait for nobody any more,
// and their timers, standing at the first-beat deadline, are brought in.
TEST_F(HangWatcherTest, TheLastBeatlessRankLeavingEndsTheGrace) {
  Make(Beats(60, 600)).Start(2);
  const TimePoint t0 = timers.Now();
  timers.Advance(Seconds(5));
  watcher->Beat(0, 3);
  timers.Advance(Seconds(95));
  watcher->RankExited(1);
  timers.Advance(Seconds(59.999));
  EXPECT_TRUE(verdicts.empty());
  timers.Advance(Seconds(0.001));
  ASSERT_EQ(verdicts.size(), 1u);
  EXPECT_EQ(verdicts[0].rank, 0);
  EXPECT_EQ(verdicts[0].at, t0 + Seconds(160));
  EXPECT_EQ(verdicts[0].why, "hung: no heartbeat for 155 s (last beat at step 3)");
}

TEST_F(HangWatcherTest, NoVerdictInAnAttemptStartedWithoutJudging) {
  Make(Beats(5, 60)).Start(2, /*judge=*/false);
  watcher->Beat(1, 3);
  timers.Advance(Seconds(600));
  EXPECT_TRUE(verdicts.empty());
  EXPECT_FALSE(watcher->watching());
  EXPECT_EQ(watcher->max_step(), 3u) << "steps still count";
}

TEST_F(HangWatcherTest, SilenceAfterBeatsIsAHangWithTheLastStep) {
  Make(Beats(5, 60)).Start(1);
  for (uint64_t step = 1; step <= 1200; ++step) {
    timers.Advance(Seconds(0.1));
    watcher->Beat(0, step);
  }
  const TimePoint last = timers.Now();
  timers.Advance(Seconds(4.999));
  EXPECT_TRUE(verdicts.empty());
  timers.Advance(Seconds(10));
  ASSERT_EQ(verdicts.size(), 1u);
  EXPECT_EQ(verdicts[0].at, last + Seconds(5)) << "the verdict comes at the deadline, not at the next check";
  EXPECT_EQ(verdicts[0].why, "hung: no heartbeat for 5.0 s (last beat at step 1200)");
  EXPECT_EQ(watcher->max_step(), 1200u);
  EXPECT_FALSE(watcher->watching());
}

// A collective hang: rank 1 stops, ranks 0 and 3 wait for it in a collective and fall silent a
// moment later; rank 2 (say, a data-loading rank outside the collective) keeps beating. The
// rank that went silent first is blamed; the others silent for half the timeout are named.
TEST_F(HangWatcherTest, RanksSilentForHalfTheTimeoutAreNamedWithTheBlamedOne) {
  Make(Beats(10, 60)).Start(4);
  for (uint64_t step = 1; step <= 5; ++step) {
    timers.Advance(Seconds(1));
    for (int r = 0; r < 4; ++r) watcher->Beat(r, step);
  }
  watcher->Beat(1, 5);
  timers.Advance(Seconds(0.2));
  watcher->Beat(0, 5);
  watcher->Beat(3, 5);
  for (int i = 0; i < 20; ++i) {
    timers.Advance(Seconds(1));
    watcher->Beat(2, std::nullopt);
  }
  ASSERT_EQ(verdicts.size(), 1u);
  EXPECT_EQ(verdicts[0].rank, 1);
  EXPECT_EQ(verdicts[0].also_silent, (std::vector<int>{0, 3}));
}

TEST_F(HangWatcherTest, AnOutputVerdictNamesTheRanksWithoutOutputForHalfItsTimeout) {
  HangWatchOptions o;
  o.output = Seconds(10);
  Make(o).Start(3);
  timers.Advance(Seconds(4));
  watcher->Output(0);  // rank 0 wrote 6 s before rank 1's deadline: silent for less than 5 s
  timers.Advance(Seconds(1.5));
  watcher->Output(0);
  watcher->RankExited(2);  // an exited rank is never named
  timers.Advance(Seconds(4.5));
  ASSERT_EQ(verdicts.size(), 1u);
  EXPECT_EQ(verdicts[0].rank, 1);
  EXPECT_TRUE(verdicts[0].also_silent.empty());
}

TEST_F(HangWatcherTest, TheFirstBeatBringsTheShorterDeadlineIn) {
  Make(Beats(1, 600)).Start(1);
  timers.Advance(Seconds(2));
  watcher->Beat(0, 1);
  const TimePoint last = timers.Now();
  timers.Advance(Seconds(5));
  ASSERT_EQ(verdicts.size(), 1u);
  EXPECT_EQ(verdicts[0].at, last + Seconds(1));
}

TEST_F(HangWatcherTest, SlowButSteadyBeatsAreNeverAHang) {
  Make(Beats(1, 2)).Start(1);
  for (int i = 0; i < 100; ++i) {
    timers.Advance(Seconds(0.99));
    watcher->Beat(0, std::nullopt);
  }
  EXPECT_TRUE(verdicts.empty());
  EXPECT_LE(timers.pending(), 1u) << "one lazy timer per rank, not one per beat";
}

TEST_F(HangWatcherTest, OneVerdictThenNothing) {
  Make(Beats(1, 1)).Start(3);
  timers.Advance(Seconds(100));
  ASSERT_EQ(verdicts.size(), 1u);
  EXPECT_EQ(timers.pending(), 0u);
}

TEST_F(HangWatcherTest, ExitedRanksAndStoppedAttemptsGetNoVerdict) {
  Make(Beats(1, 1)).Start(2);
  watcher->RankExited(0);
  timers.Advance(Seconds(0.5));
  watcher->Beat(1, 7);
  watcher->Stop();
  timers.Advance(Seconds(100));
  EXPECT_TRUE(verdicts.empty());
  watcher->Beat(1, 9);  // steps still count after Stop (for the restart policy)
  EXPECT_EQ(watcher->max_step(), 9u);
}

TEST_F(HangWatcherTest, OutputDeadline) {
  HangWatchOptions o;
  o.output = Seconds(10);
  Make(o).Start(2);
  for (int i = 0; i < 5; ++i) {
    timers.Advance(Seconds(9));
    watcher->Output(0);
    watcher->Output(1);
  }
  EXPECT_TRUE(verdicts.empty());
  timers.Advance(Seconds(5));
  watcher->Output(0);
  timers.Advance(Seconds(5));
  ASSERT_EQ(verdicts.size(), 1u);
  EXPECT_EQ(verdicts[0].rank, 1);
  EXPECT_EQ(verdicts[0].why, "hung: no output for 10 s");
}

TEST_F(HangWatcherTest, ANewAttemptStartsAfresh) {
  Make(Beats(1, 3)).Start(1);
  watcher->Beat(0, 50);
  watcher->Start(1);
  EXPECT_FALSE(watcher->max_step());
  timers.Advance(Seconds(2.9));
  EXPECT_TRUE(verdicts.empty()) << "the first-beat deadline applies again";
  timers.Advance(Seconds(0.1));
  EXPECT_EQ(verdicts.size(), 1u);
}

TEST(FormatSecondsTest, Shapes) {
  EXPECT_EQ(FormatSeconds(Seconds(92.7)), "92 s");
  EXPECT_EQ(FormatSeconds(Seconds(1.56)), "1.5 s");
  EXPECT_EQ(FormatSeconds(Seconds(0.256)), "0.25 s");
}

}  // namespace
}  // namespace ctrun::health
