// HealthMonitor's reading of the heartbeat datagrams through a real channel (a socketpair from
// PrepareWorker), on a real loop that is never run: AttemptMaxStep reads what is queued.
#include "health/health_monitor.h"

#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <string>
#include <memory>
#include <vector>

#include "sys/event_loop.h"

namespace ctrun::health {
namespace {

// A beat longer than the monitor's buffer: its complete lines count, the number cut at the
// buffer's end does not ("12" of "12345" would tell the restart policy a wrong step).
// One rank's channel on a real loop that is never run; the test plays the worker.
class OneRankChannel : public ::testing::Test {
 protected:
  void SetUp() override {
    HangWatchOptions o;
    o.heartbeat = Seconds(60);
    o.first_heartbeat = Seconds(60);
    monitor_ = std::make_unique<HealthMonitor>(loop_, o, StackTools{}, Seconds(1), nullptr);
    SpawnSpec spec;
    monitor_->PrepareWorker(0, 0, &spec);
    ASSERT_GE(spec.extra_fd, 0);
    worker_ = ::dup(spec.extra_fd);  // the monitor closes its copy once the attempt starts
    monitor_->AttemptStarted(1, true);
  }
  void TearDown() override { ::close(worker_); }
  void Send(const std::string& datagram) {
    ASSERT_EQ(::send(worker_, datagram.data(), datagram.size(), 0), static_cast<ssize_t>(datagram.size()));
  }

  EventLoop loop_;
  std::unique_ptr<HealthMonitor> monitor_;
  int worker_ = -1;
};

TEST_F(OneRankChannel, ADatagramLongerThanTheBufferGivesOnlyItsCompleteLines) {
  Send("3 first\n" + std::string(4090, 'x') + "\n12345\n");
  EXPECT_EQ(monitor_->AttemptProgress().max_step, 3u);
  Send("7\n");
  EXPECT_EQ(monitor_->AttemptProgress().max_step, 7u);
}

// heartbeat() without a step sends the library's beat counter, marked "counter": it shows a hung
// rank's last beat, but restarts at 1 in every process, so the restart policy does not compare it.
TEST(HealthMonitorBeats, TheLibrarysBeatCounterIsABeatButNotAComparableStep) {
  EXPECT_EQ(ParseBeat("12 1700000000 counter\n").step, 12u);
  EXPECT_TRUE(ParseBeat("12 1700000000 counter\n").counter);
  EXPECT_FALSE(ParseBeat("12 1700000000\n").counter);
  EXPECT_FALSE(ParseBeat("12 1700000000 counter\n7\n").counter) << "the last numbered line decides";
  EXPECT_FALSE(ParseBeat("alive\n").step);
}

TEST_F(OneRankChannel, CounterBeatsAreBeatsWithoutAComparableStep) {
  EXPECT_FALSE(monitor_->AttemptProgress().beat);
  Send("5000 1700000000 counter\n");
  const AttemptBeats b = monitor_->AttemptProgress();
  EXPECT_TRUE(b.beat);
  EXPECT_FALSE(b.max_step);
  Send("40 1700000001\n");
  EXPECT_EQ(monitor_->AttemptProgress().max_step, 40u);
}

// Out of fds (EMFILE) when a rank's channel is made: that rank runs without one. It gets no stale
// CTRUN_HEARTBEAT_FD nor CTRUN_HEARTBEAT_ID (the launcher's own are removed), and its silence is no hang: the rank that
// has a channel and never beats is the one judged.
TEST(HealthMonitorBeats, ARankWithoutAChannelIsNotTakenForHung) {
  EventLoop loop;
  HangWatchOptions o;
  o.heartbeat = Seconds(0.05);
  o.first_heartbeat = Seconds(0.05);
  HealthMonitor m(loop, o, StackTools{}, Seconds(1), nullptr);
  std::vector<int> hung;
  m.SetOnHang([&](int rank, const std::string&, const std::vector<int>& also) {
    hung.push_back(rank);
    hung.insert(hung.end(), also.begin(), also.end());
  });
  SpawnSpec without;
  without.env = {"CTRUN_HEARTBEAT_FD=7", "CTRUN_HEARTBEAT_ID=1:2", "A=1"};
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  const int lowest_free = ::dup(0);
  ASSERT_GE(lowest_free, 0);
  ::close(lowest_free);
  rlimit tight = saved;
  tight.rlim_cur = static_cast<rlim_t>(lowest_free);  // no new fd can be made
  // Its warning is not logged here: without a free fd, UBSan's vptr check (it probes memory
  // through a pipe) would take spdlog's formatter for a bad object.
  const spdlog::level::level_enum level = spdlog::get_level();
  spdlog::set_level(spdlog::level::off);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &tight), 0);
  m.PrepareWorker(0, 0, &without);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  spdlog::set_level(level);
  EXPECT_LT(without.extra_fd, 0);
  EXPECT_EQ(without.env, (std::vector<std::string>{"A=1"}));
  SpawnSpec with;
  m.PrepareWorker(0, 1, &with);
  ASSERT_GE(with.extra_fd, 0);
  m.AttemptStarted(2, true);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (hung.empty() && std::chrono::steady_clock::now() < deadline) loop.RunOnce(std::chrono::milliseconds(100));
  EXPECT_EQ(hung, (std::vector<int>{1}));
}

}  // namespace
}  // namespace ctrun::health
