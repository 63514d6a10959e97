#include "health/hang_watcher.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace ctrun::health {

std::string FormatSeconds(Duration d) {
  const double s = ToSeconds(d);
  char buf[32];
  if (s >= 10) std::snprintf(buf, sizeof buf, "%.0f s", std::floor(s));
  else if (s >= 1) std::snprintf(buf, sizeof buf, "%.1f s", std::floor(s * 10) / 10);
  else std::snprintf(buf, sizeof buf, "%.2f s", std::floor(s * 100) / 100);
  return buf;
}

HangWatcher::HangWatcher(TimerQueue& timers, HangWatchOptions options, OnHang on_hang)
    : timers_(timers), options_(options), on_hang_(std::move(on_hang)) {}

HangWatcher::~HangWatcher() { Stop(); }

void HangWatcher::Start(int nranks, bool judge) {
  Stop();
  ranks_.assign(static_cast<size_t>(nranks), Rank{});
  max_step_.reset();
  any_beat_ = false;
  started_ = timers_.Now();
  grace_ended_ = started_;
  watching_ = judge && options_.any();
  if (!watching_) return;
  for (int i = 0; i < nranks; ++i) {
    Rank& r = ranks_[static_cast<size_t>(i)];
    r.active = true;
    r.last_output = started_;
    if (options_.heartbeat > Duration::zero()) ArmBeat(i, started_ + options_.first_heartbeat);
    if (options_.output > Duration::zero()) ArmOutput(i, started_ + options_.output);
  }
}

HangWatcher::Rank* HangWatcher::Find(int local_rank) {
  if (local_rank < 0 || static_cast<size_t>(local_rank) >= ranks_.size()) return nullptr;
  return &ranks_[static_cast<size_t>(local_rank)];
}

std::optional<uint64_t> HangWatcher::last_step(int local_rank) const {
  if (local_rank < 0 || static_cast<size_t>(local_rank) >= ranks_.size()) return std::nullopt;
  return ranks_[static_cast<size_t>(local_rank)].last_step;
}

void HangWatcher::Beat(int local_rank, std::optional<uint64_t> step, bool comparable) {
  Rank* r = Find(local_rank);
  if (!r) return;
  // Steps count even after a verdict: the restart policy compares the attempt's progress.
  any_beat_ = true;
  if (step) {
    r->last_step = step;
    if (comparable && (!max_step_ || *step > *max_step_)) max_step_ = step;
  }
  const bool first = r->beats == 0;
  const bool grace_was_open = first && FirstRankWithoutBeat() >= 0;
  ++r->beats;
  r->last_beat = timers_.Now();
  // A first beat leaves the rank's deadline at the first-beat deadline while the grace lasts; the
  // last one ends the grace, which moves every beaten rank's deadline earlier (re-armed there).
  if (first) MaybeEndGrace(grace_was_open);
}

void HangWatcher::Output(int local_rank) {
  if (Rank* r = Find(local_rank)) r->last_output = timers_.Now();
}

void HangWatcher::Resumed(Duration suspended_for) {
  if (!watching_ || suspended_for <= Duration::zero()) return;
  // The lazy timers fire at the old deadlines, find the new ones later and re-arm there.
  started_ += suspended_for;
  grace_ended_ += suspended_for;
  for (Rank& r : ranks_) {
    if (r.beats > 0) r.last_beat += suspended_for;
    r.last_output += suspended_for;
  }
}

void HangWatcher::IgnoreBeats(int local_rank) {
  Rank* r = Find(local_rank);
  if (!r) return;
  const bool grace_was_open = FirstRankWithoutBeat() >= 0;
  r->beats_watched = false;
  if (r->beat_timer) timers_.CancelTimer(*r->beat_timer);
  r->beat_timer.reset();
  MaybeEndGrace(grace_was_open);  // the ranks that beat no longer wait for this one's first beat
}

void HangWatcher::RankExited(int local_rank) {
  Rank* r = Find(local_rank);
  if (!r) return;
  const bool grace_was_open = FirstRankWithoutBeat() >= 0;
  CancelRank(*r);
  MaybeEndGrace(grace_was_open);
}

void HangWatcher::Stop() {
  watching_ = false;
  for (Rank& r : ranks_) CancelRank(r);
}

void HangWatcher::CancelRank(Rank& r) {
  r.active = false;
  if (r.beat_timer) timers_.CancelTimer(*r.beat_timer);
  if (r.output_timer) timers_.CancelTimer(*r.output_timer);
  r.beat_timer.reset();
  r.output_timer.reset();
}

TimePoint HangWatcher::BeatDeadline(const Rank& r) const {
  // In the grace a beaten rank may be waiting for a beatless one (its first collective): it is
  // not judged before that one is, at the first-beat deadline (OnBeatTimer gives that verdict).
  if (r.beats == 0 || FirstRankWithoutBeat() >= 0) return started_ + options_.first_heartbeat;
  // Silence counts from the last beat, or from the end of the grace if the rank waited through it.
  return std::max(r.last_beat, grace_ended_) + options_.heartbeat;
}

int HangWatcher::FirstRankWithoutBeat() const {
  for (size_t i = 0; i < ranks_.size(); ++i)
    if (ranks_[i].active && ranks_[i].beats_watched && ranks_[i].beats == 0) return static_cast<int>(i);
  return -1;
}

void HangWatcher::MaybeEndGrace(bool was_open) {
  if (!was_open || !watching_ || FirstRankWithoutBeat() >= 0) return;
  grace_ended_ = timers_.Now();
  // Their timers stand at the first-beat deadline; the lazy timers only move later by themselves.
  for (size_t i = 0; i < ranks_.size(); ++i) {
    Rank& r = ranks_[i];
    if (!r.beat_timer) continue;
    timers_.CancelTimer(*r.beat_timer);
    ArmBeat(static_cast<int>(i), BeatDeadline(r));
  }
}

void HangWatcher::ArmBeat(int local_rank, TimePoint deadline) {
  ranks_[static_cast<size_t>(local_rank)].beat_timer = timers_.AddTimer(deadline, [this, local_rank] {
    ranks_[static_cast<size_t>(local_rank)].beat_timer.reset();
    OnBeatTimer(local_rank);
  });
}

void HangWatcher::ArmOutput(int local_rank, TimePoint deadline) {
  ranks_[static_cast<size_t>(local_rank)].output_timer = timers_.AddTimer(deadline, [this, local_rank] {
    ranks_[static_cast<size_t>(local_rank)].output_timer.reset();
    OnOutputTimer(local_rank);
  });
}

void HangWatcher::OnBeatTimer(int local_rank) {
  Rank& r = ranks_[static_cast<size_t>(local_rank)];
  if (!watching_ || !r.active || !r.beats_watched) return;
  const TimePoint now = timers_.Now();
  const TimePoint deadline = BeatDeadline(r);
  if (now < deadline) {
    ArmBeat(local_rank, deadline);
    return;
  }
  if (r.beats == 0) {
    HungWithoutFirstBeat(local_rank);
    return;
  }
  // A beaten rank's deadline in the grace is the first-beat deadline, which has then passed for
  // the beatless rank too (at the same moment: which timer fires first is not known): the verdict
  // is that rank's, the one the others wait for.
  if (const int beatless = FirstRankWithoutBeat(); beatless >= 0) {
    HungWithoutFirstBeat(beatless);
    return;
  }
  std::string why = "hung: no heartbeat for " + FormatSeconds(now - r.last_beat);
  if (r.last_step) why += " (last beat at step " + std::to_string(*r.last_step) + ")";
  Hung(local_rank, why, Channel::kBeat);
}

void HangWatcher::HungWithoutFirstBeat(int local_rank) {
  Hung(local_rank, "hung: no first heartbeat within " + FormatSeconds(timers_.Now() - started_), Channel::kBeat);
}

void HangWatcher::OnOutputTimer(int local_rank) {
  Rank& r = ranks_[static_cast<size_t>(local_rank)];
  if (!watching_ || !r.active) return;
  const TimePoint now = timers_.Now();
  const TimePoint deadline = r.last_output + options_.output;
  if (now < deadline) {
    ArmOutput(local_rank, deadline);
    return;
  }
  Hung(local_rank, "hung: no output for " + FormatSeconds(now - r.last_output), Channel::kOutput);
}

bool HangWatcher::SilentFor(const Rank& r, Channel channel, Duration at_least) const {
  const TimePoint now = timers_.Now();
  if (channel == Channel::kOutput) return now - r.last_output >= at_least;
  if (!r.beats_watched) return false;
  // Inside its first-beat deadline a beatless rank is starting (loading), not silent.
  if (r.beats == 0) return now >= started_ + options_.first_heartbeat;
  return now - r.last_beat >= at_least;
}

void HangWatcher::Hung(int local_rank, const std::string& why, Channel channel) {
  const Duration half = (channel == Channel::kBeat ? options_.heartbeat : options_.output) / 2;
  std::vector<int> also_silent;
  for (size_t i = 0; i < ranks_.size(); ++i)
    if (static_cast<int>(i) != local_rank && ranks_[i].active && SilentFor(ranks_[i], channel, half))
      also_silent.push_back(static_cast<int>(i));
  Stop();
  on_hang_(local_rank, why, also_silent);
}

}  // namespace ctrun::health
