// HealthMonitor's reading of the heartbeat datagrams through a real channel (a socketpair from
// PrepareWorker), on a real loop that is never run: AttemptMaxStep reads what is queued.
#include "health/health_monitor.h"

#include <sys/socket.h>

#include <gtest/gtest.h>

#include <string>

#include "sys/event_loop.h"

namespace ctrun::health {
namespace {

// A beat longer than the monitor's buffer: its complete lines count, the number cut at the
// buffer's end does not ("12" of "12345" would tell the restart policy a wrong step).
TEST(HealthMonitorBeats, ADatagramLongerThanTheBufferGivesOnlyItsCompleteLines) {
  EventLoop loop;
  HangWatchOptions o;
  o.heartbeat = Seconds(60);
  o.first_heartbeat = Seconds(60);
  HealthMonitor m(loop, o, StackTools{}, Seconds(1), nullptr);
  SpawnSpec spec;
  m.PrepareWorker(0, 0, &spec);
  ASSERT_GE(spec.extra_fd, 0);
  const int worker = ::dup(spec.extra_fd);  // the monitor closes its copy once the attempt starts
  m.AttemptStarted(1, true);
  std::string big = "3 first\n" + std::string(4090, 'x') + "\n12345\n";
  ASSERT_EQ(::send(worker, big.data(), big.size(), 0), static_cast<ssize_t>(big.size()));
  EXPECT_EQ(m.AttemptMaxStep(), 3u);
  const std::string next = "7\n";
  ASSERT_EQ(::send(worker, next.data(), next.size(), 0), 2);
  EXPECT_EQ(m.AttemptMaxStep(), 7u);
  ::close(worker);
}

}  // namespace
}  // namespace ctrun::health
