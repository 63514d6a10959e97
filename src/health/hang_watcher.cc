#include "health/hang_watcher.h"

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
  ++r->beats;
  r->last_beat = timers_.Now();
  // The first beat moves the deadline earlier (the first-beat deadline is the longer one): the
  // lazy timer only ever moves later, so it is re-armed once, here.
  if (r->beats == 1 && r->beat_timer) {
    timers_.CancelTimer(*r->beat_timer);
    ArmBeat(local_rank, BeatDeadline(*r));
  }
}

void HangWatcher::Output(int local_rank) {
  if (Rank* r = Find(local_rank)) r->last_output = timers_.Now();
}

void HangWatcher::Resumed(Duration suspended_for) {
  if (!watching_ || suspended_for <= Duration::zero()) return;
  // The lazy timers fire at the old deadlines, find the new ones later and re-arm there.
  started_ += suspended_for;
  for (Rank& r : ranks_) {
    if (r.beats > 0) r.last_beat += suspended_for;
    r.last_output += suspended_for;
  }
}

void HangWatcher::IgnoreBeats(int local_rank) {
  Rank* r = Find(local_rank);
  if (!r) return;
  r->beats_watched = false;
  if (r->beat_timer) timers_.CancelTimer(*r->beat_timer);
  r->beat_timer.reset();
}

void HangWatcher::RankExited(int local_rank) {
  if (Rank* r = Find(local_rank)) CancelRank(*r);
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
  return r.beats == 0 ? started_ + options_.first_heartbeat : r.last_beat + options_.heartbeat;
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
    Hung(local_rank, "hung: no first heartbeat within " + FormatSeconds(now - started_), Channel::kBeat);
    return;
  }
  std::string why = "hung: no heartbeat for " + FormatSeconds(now - r.last_beat);
  if (r.last_step) why += " (last beat at step " + std::to_string(*r.last_step) + ")";
  Hung(local_rank, why, Channel::kBeat);
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
  return now - (r.beats == 0 ? started_ : r.last_beat) >= at_least;
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
