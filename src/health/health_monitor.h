// HealthMonitor: the real health::Monitor, on the agent's EventLoop.
//
// Heartbeat channel: with a heartbeat timeout, each worker gets one end of an AF_UNIX datagram
// socketpair as fd 3, CTRUN_HEARTBEAT_FD=3 and CTRUN_HEARTBEAT_ID=<st_dev>:<st_ino> of its end
// (any inherited values are replaced; when the pair cannot be created, EMFILE, both variables are
// removed, a warning says so, and that rank's heartbeat deadline is off for the attempt). The ID
// lets the worker library tell its channel from a stranger's fd at number 3: a process the worker
// starts inherits the variables but not the fd (CLOEXEC), and its own first socket() may get 3.
// Each datagram is a beat; it holds one or more lines "<step>[ <anything>]\n" and the step of the
// last line counts (a line whose first field is not a number is still a beat, without a step).
// The worker's end is blocking, so a Python worker's os.write never fails; the agent reads its
// ends until the next attempt replaces them, so a writer never waits on a reader that is gone (the
// worker library uses MSG_DONTWAIT anyway). The socket's queue bounds how many unread beats can
// pile up.
// Output: the runner feeds OnOutput() from the output relay (bytes read from the worker's pipes).
// Stacks go to <rank dir>/stacks/ of the attempt (rank_dir(local_rank) from the runner).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <memory>
#include <vector>

#include "base/unique_fd.h"
#include "health/hang_watcher.h"
#include "health/monitor.h"
#include "health/stack_capture.h"
#include "sys/event_loop.h"

namespace ctrun::health {

// One heartbeat datagram, parsed: the step of its last line with a number first (nullopt if none),
// and whether that number is the worker library's beat counter ("<n> <ns> counter", from
// heartbeat() without a step), which shows a hung rank's last beat but is not comparable across
// attempts.
struct ParsedBeat {
  std::optional<uint64_t> step;
  bool counter = false;
};
ParsedBeat ParseBeat(std::string_view datagram);

// CTRUN_HEARTBEAT_ID's value for `fd`: "<st_dev>:<st_ino>" in decimal (the same for every fd of
// the file: a dup, the copy a child inherits, or one passed over a socket); "" if fstat fails.
std::string HeartbeatId(int fd);

class HealthMonitor final : public Monitor {
 public:
  static constexpr int kHeartbeatFd = 3;

  HealthMonitor(EventLoop& loop, HangWatchOptions options, StackTools tools, Duration stack_timeout,
                std::function<std::string(int local_rank)> rank_dir);
  ~HealthMonitor() override;

  void SetOnHang(OnHang on_hang) override { on_hang_ = std::move(on_hang); }
  void PrepareWorker(int attempt, int local_rank, SpawnSpec* spec) override;
  void AttemptStarted(int nranks, bool judge) override;
  void Resumed(Duration suspended_for) override { watcher_.Resumed(suspended_for); }
  void WorkerExited(int local_rank) override { watcher_.RankExited(local_rank); }
  void StopWatching() override { watcher_.Stop(); }
  AttemptBeats AttemptProgress() override;
  void CaptureStacks(int local_rank, pid_t pgid, OnStacks done) override;
  MainThreadWait MainThreadOf(int local_rank, pid_t pid) override;

  // Output from a worker (the relay read bytes from one of its pipes).
  void OnOutput(int local_rank) { watcher_.Output(local_rank); }

 private:
  struct Channel {
    UniqueFd agent_end;
    UniqueFd worker_end;  // closed once the worker is spawned
  };
  void CloseChannels();
  void NoChannel(int local_rank, const std::string& why);
  void OnReadable(int local_rank);

  EventLoop& loop_;
  const HangWatchOptions options_;
  HangWatcher watcher_;
  StackTools tools_;
  Duration stack_timeout_;
  std::vector<std::unique_ptr<StackCapture>> captures_;  // reused once idle; never freed mid-capture
  std::function<std::string(int)> rank_dir_;
  OnHang on_hang_;
  std::vector<Channel> channels_;
  int attempt_ = -1;
  std::vector<char> buf_;
};

}  // namespace ctrun::health
