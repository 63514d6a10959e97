// HangWatcher: the deadlines of hang detection for one attempt, as pure logic on a TimerQueue
// (tests drive it with tests/fakes/fake_timer_queue.h).
//
// Per local rank, two independent deadlines, each off when its timeout is zero:
//   heartbeat: the first beat must come within first_heartbeat of Start(), every later one within
//              heartbeat of the previous one;
//   output:    some output within output of Start() and of the previous output.
// The first-beat grace is the attempt's, not a rank's: while some watched rank has not beaten yet
// (still loading its checkpoint, say), the ranks that have are not judged on heartbeat (they may
// well wait for it in their first collective): their deadline is the first-beat deadline, which is
// then the beatless rank's verdict, never theirs. Once every watched rank has beaten (or left:
// exited, no channel), each rank has heartbeat from its last beat, or from that moment if its last
// beat came before it (a rank that waited through the grace gets one full timeout, not less and
// not more).
// A missed deadline calls on_hang(local_rank, why, also_silent) once, with why like
// "hung: no heartbeat for 92 s (last beat at step 1200)", and the watcher then stops watching
// every rank (the agent stops the attempt). RankExited() stops watching that rank only.
// The rank blamed is the one whose deadline passed first, i.e. the one that went silent first.
// also_silent lists (ascending) the other watched ranks silent on the same channel for at least
// half its timeout by then: in a collective hang the rank that stopped and the ranks waiting for
// it fall silent within moments of each other, so which one passes its deadline first says
// little; the agent saves their stacks too. A rank that has not beaten yet counts as silent on
// the heartbeat channel only once its first-beat deadline has passed: inside it, it is loading,
// not silent.
//
// Timers are lazy: a beat only records its time; the rank's one timer fires at the deadline
// computed from the start or the last beat and, if a beat came meanwhile, re-arms itself at the
// new deadline. Deadlines move earlier only when the grace ends (the last first beat, or the last
// beatless rank leaving): then every rank that has beaten is re-armed, once per attempt. So a beat
// costs no timer operation, and a verdict is given at the deadline
// itself (the loop's timerfd), never later than the deadline plus the loop's latency.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "sys/event_loop.h"

namespace ctrun::health {

struct HangWatchOptions {
  Duration heartbeat{0};        // 0: heartbeats not watched
  Duration first_heartbeat{0};  // deadline of the first beat (> 0 when heartbeat > 0)
  Duration output{0};           // 0: output not watched
  bool any() const { return heartbeat > Duration::zero() || output > Duration::zero(); }
};

// "92 s", "1.5 s", "0.25 s": seconds as the summary shows them.
std::string FormatSeconds(Duration d);

class HangWatcher {
 public:
  using OnHang =
      std::function<void(int local_rank, const std::string& why, const std::vector<int>& also_silent)>;

  HangWatcher(TimerQueue& timers, HangWatchOptions options, OnHang on_hang);
  ~HangWatcher();
  HangWatcher(const HangWatcher&) = delete;
  HangWatcher& operator=(const HangWatcher&) = delete;

  // A new attempt of nranks workers, all started now: arms every deadline (judge false: none; the
  // beats still count for steps). Forgets the last one.
  void Start(int nranks, bool judge = true);
  // The rank has no heartbeat channel this attempt (it could not be created): its heartbeat
  // deadline is off and it is never counted silent on that channel. Call after Start().
  void IgnoreBeats(int local_rank);
  // Nothing ran for `suspended_for` (the job was stopped): every deadline moves by it, so the
  // time the job stood still is not silence.
  void Resumed(Duration suspended_for);
  // A heartbeat from a rank; step: the step it carried (nullopt when unreadable); comparable:
  // a training step, which max_step() takes (not the worker library's beat counter).
  void Beat(int local_rank, std::optional<uint64_t> step, bool comparable = true);
  // Output (any bytes) from a rank.
  void Output(int local_rank);
  // The rank's worker exited: no verdict for it any more.
  void RankExited(int local_rank);
  // No more verdicts in this attempt (it is being stopped). Steps are kept.
  void Stop();

  bool watching() const { return watching_; }
  // The highest comparable step any rank of the attempt reported; nullopt: none.
  std::optional<uint64_t> max_step() const { return max_step_; }
  // Some rank of the attempt beat, with a step or not.
  bool any_beat() const { return any_beat_; }
  // The last step a rank reported (nullopt: none).
  std::optional<uint64_t> last_step(int local_rank) const;

 private:
  struct Rank {
    bool active = false;
    bool beats_watched = true;
    uint64_t beats = 0;
    std::optional<uint64_t> last_step;
    TimePoint last_beat{};
    TimePoint last_output{};
    std::optional<TimerQueue::TimerId> beat_timer;
    std::optional<TimerQueue::TimerId> output_timer;
  };
  TimePoint BeatDeadline(const Rank& r) const;
  // The lowest active rank whose beats are watched and that has not beaten yet (-1: none): while
  // there is one, the attempt is in its first-beat grace.
  int FirstRankWithoutBeat() const;
  // Call after a change that may have ended the grace (a first beat, a rank leaving), with whether
  // it was open before: if it ended now, starts every beaten rank's timeout and re-arms its timer.
  void MaybeEndGrace(bool was_open);
  void HungWithoutFirstBeat(int local_rank);
  void ArmBeat(int local_rank, TimePoint deadline);
  void ArmOutput(int local_rank, TimePoint deadline);
  void OnBeatTimer(int local_rank);
  void OnOutputTimer(int local_rank);
  enum class Channel { kBeat, kOutput };
  void Hung(int local_rank, const std::string& why, Channel channel);
  bool SilentFor(const Rank& r, Channel channel, Duration at_least) const;
  void CancelRank(Rank& r);
  Rank* Find(int local_rank);

  TimerQueue& timers_;
  const HangWatchOptions options_;
  OnHang on_hang_;
  TimePoint started_{};
  // When the first-beat grace ended (meaningless while it lasts): no beaten rank's silence counts
  // from before it.
  TimePoint grace_ended_{};
  bool watching_ = false;
  std::vector<Rank> ranks_;
  std::optional<uint64_t> max_step_;
  bool any_beat_ = false;
};

}  // namespace ctrun::health
