#include "rendezvous/store_log.h"

#include <spdlog/spdlog.h>

#include <string_view>
#include <utility>

namespace ctrun::rdzv {
namespace {

// The read sentinel (see store_log.h): no entry may hold it.
constexpr std::string_view kAbsent{"\0ctrun-absent\0", 14};
constexpr int kHeadAttempts = 3;

bool UsableValue(const std::string& v) { return !v.empty() && v != kAbsent && v != kCompactedEntry; }

}  // namespace

StatusOr<std::unique_ptr<StoreLog>> StoreLog::Create(EventLoop& loop, const StoreLogOptions& opts) {
  if (opts.run_id.empty()) return Status::Error("store log: empty run id");
  store::AsyncClientOptions c;
  c.host = opts.host;
  c.port = opts.port;
  c.token = opts.token;
  c.connect_timeout = opts.connect_timeout;
  c.op_timeout = opts.op_timeout;
  c.before_retry = opts.before_retry;
  auto waiter = store::AsyncStoreClient::Create(loop, c);
  if (!waiter.ok()) return waiter.status();
  c.on_unreachable = opts.on_unreachable;  // one of the two connections is enough to say it
  auto ops = store::AsyncStoreClient::Create(loop, c);
  if (!ops.ok()) return ops.status();
  return std::unique_ptr<StoreLog>(
      new StoreLog(loop, "ctrun/rdzv/" + opts.run_id + "/", std::move(*ops), std::move(*waiter)));
}

StoreLog::StoreLog(EventLoop& loop, std::string base, std::unique_ptr<store::AsyncStoreClient> ops,
                   std::unique_ptr<store::AsyncStoreClient> waiter)
    : loop_(loop), base_(std::move(base)), ops_(std::move(ops)), waiter_(std::move(waiter)) {}

StoreLog::~StoreLog() {
  for (TimerQueue::TimerId t : {beat_timer_, poll_timer_}) {
    if (t) loop_.CancelTimer(t);
  }
  for (const auto& [key, t] : deferred_) loop_.CancelTimer(t);
  // The clients go with their pending callbacks, none of which runs.
}

std::string StoreLog::Describe() const { return "store at " + ops_->where(); }

void StoreLog::Defer(std::function<void()> fn) {
  const uint64_t key = next_deferred_++;
  deferred_[key] = loop_.AddTimerAfter(
      Duration::zero(), [this, key, fn = std::move(fn), g = std::weak_ptr<char>(alive_)] {
        if (g.expired()) return;
        deferred_.erase(key);
        fn();
      });
}

void StoreLog::Read(store::AsyncStoreClient& client, std::string key, ReadDone done) {
  client.CompareSet(std::move(key), std::string(kAbsent), std::string(kAbsent),
                    [done = std::move(done)](StatusOr<std::string> v) {
                      if (!v.ok()) return done(v.status());
                      if (*v == kAbsent) return done(std::optional<std::string>());
                      done(std::optional<std::string>(std::move(*v)));
                    });
}

// --- entries -----------------------------------------------------------------------------------

void StoreLog::Head(std::string initial, Callback<LogEntry> done) {
  if (!UsableValue(initial)) {
    return Defer(
        [done] { done(Status::Error("store log: Head needs a non-empty initial value")); });
  }
  ReadHead(std::move(initial), kHeadAttempts, std::move(done));
}

void StoreLog::ReadHead(std::string initial, int attempts, Callback<LogEntry> done) {
  ops_->Add(HeadKey(), 0,
            [this, initial = std::move(initial), attempts,
             done = std::move(done)](StatusOr<int64_t> h) mutable {
              if (!h.ok()) return done(h.status());
              OnHeadHint(*h, std::move(initial), attempts, std::move(done));
            });
}

void StoreLog::OnHeadHint(int64_t hint, std::string initial, int attempts,
                          Callback<LogEntry> done) {
  if (hint <= 0) {
    ops_->CompareSet(EntryKey(0), "", initial,
                     [this, initial, attempts, done = std::move(done)](StatusOr<std::string> v) mutable {
                       if (!v.ok()) return done(v.status());
                       WalkForward(LogEntry{0, std::move(*v)}, std::move(initial), attempts, std::move(done));
                     });
    return;
  }
  const auto index = static_cast<uint64_t>(hint);
  Read(*ops_, EntryKey(index),
       [this, index, initial = std::move(initial), attempts,
        done = std::move(done)](StatusOr<std::optional<std::string>> v) mutable {
         if (!v.ok()) return done(v.status());
         if (!v->has_value()) {
           return done(Status::Error("store log: entry " + std::to_string(index) +
                                     ", which the head counter points at, does not exist"));
         }
         WalkForward(LogEntry{index, std::move(**v)}, std::move(initial), attempts, std::move(done));
       });
}

// `at` was read; reads the entries after it until one is missing. When `at` was compacted (64
// appends while Head was reading), Head starts over from the head counter, up to kHeadAttempts
// times; the last attempt walks on through compacted entries instead. That walk ends at the newest
// entry, never at a compacted one: entry i is compacted only once entry i + 64 exists.
void StoreLog::WalkForward(LogEntry at, std::string initial, int attempts, Callback<LogEntry> done) {
  if (at.value == kCompactedEntry && attempts > 1) {
    return ReadHead(std::move(initial), attempts - 1, std::move(done));
  }
  const uint64_t next = at.index + 1;
  Read(*ops_, EntryKey(next),
       [this, at = std::move(at), initial = std::move(initial), attempts,
        done = std::move(done)](StatusOr<std::optional<std::string>> v) mutable {
         if (!v.ok()) return done(v.status());
         if (v->has_value()) {
           return WalkForward(LogEntry{at.index + 1, std::move(**v)}, std::move(initial), attempts,
                              std::move(done));
         }
         if (at.value == kCompactedEntry) {  // cannot happen (see above): never hand it out
           return done(Status::Error("store log: the newest entry, " + std::to_string(at.index) +
                                     ", is compacted"));
         }
         done(std::move(at));
       });
}

void StoreLog::Append(uint64_t index, std::string value, Callback<AppendResult> done) {
  if (!UsableValue(value)) {
    return Defer([done] { done(Status::Error("store log: cannot append an empty value")); });
  }
  std::string key = EntryKey(index);
  ops_->CompareSet(std::move(key), "", value,
                   [this, index, value, done = std::move(done)](StatusOr<std::string> stored) {
                     if (!stored.ok()) return done(stored.status());
                     AppendResult r;
                     r.won = *stored == value;
                     r.value = std::move(*stored);
                     if (r.won) AfterWin(index);  // sent before anything the callback sends
                     done(std::move(r));
                   });
}

void StoreLog::AfterWin(uint64_t index) {
  if (index == 0) return;  // head counts entries 1..n (entry 0 comes from Head's create)
  ops_->Add(HeadKey(), 1, nullptr);
  if (index >= kKeepEntries) ops_->Set(EntryKey(index - kKeepEntries), std::string(kCompactedEntry), nullptr);
}

void StoreLog::Wait(uint64_t index, Callback<std::string> done) {
  const uint64_t gen = ++wait_gen_;
  if (wait_id_) waiter_->CancelWait(std::exchange(wait_id_, 0));
  wait_id_ = waiter_->Wait({EntryKey(index)}, std::nullopt,
                           [this, gen, index, done = std::move(done)](StatusOr<bool> r) {
                             OnWaitDone(gen, index, std::move(r), done);
                           });
}

void StoreLog::OnWaitDone(uint64_t gen, uint64_t index, StatusOr<bool> r,
                          Callback<std::string> done) {
  if (gen != wait_gen_) return;
  wait_id_ = 0;
  if (!r.ok()) return done(r.status());
  if (!*r) return done(Status::Error("store log: wait ended without its entry"));
  Read(*waiter_, EntryKey(index),
       [this, gen, index, done = std::move(done)](StatusOr<std::optional<std::string>> v) {
         if (gen != wait_gen_) return;  // replaced while reading
         if (!v.ok()) return done(v.status());
         if (!v->has_value()) {  // entries are never removed (compaction overwrites them)
           return done(Status::Error("store log: entry " + std::to_string(index) + " vanished"));
         }
         done(std::move(**v));
       });
}

// --- liveness ----------------------------------------------------------------------------------

void StoreLog::StartLiveness(const std::string& self_id, const LivenessOptions& opts) {
  StopLiveness();
  self_id_ = self_id;
  liveness_ = opts;
  Beat();
}

void StoreLog::StopLiveness() {
  if (beat_timer_) loop_.CancelTimer(beat_timer_);
  beat_timer_ = 0;
}

void StoreLog::Beat() {
  if (!beat_in_flight_) {
    beat_in_flight_ = true;
    ops_->Add(AliveKey(self_id_), 1, [this](StatusOr<int64_t> r) {
      beat_in_flight_ = false;
      if (!r.ok()) spdlog::debug("rendezvous: liveness heartbeat failed: {}", r.message());
    });
  }
  beat_timer_ = loop_.AddTimerAfter(liveness_.interval, [this, g = std::weak_ptr<char>(alive_)] {
    if (g.expired()) return;
    beat_timer_ = 0;
    Beat();
  });
}

void StoreLog::WatchMembers(const std::vector<std::string>& ids) {
  const TimePoint now = loop_.Now();
  std::map<std::string, Member> next;
  for (const auto& id : ids) {
    auto it = members_.find(id);
    next[id] = it != members_.end() ? it->second : Member{now, std::nullopt, false};
  }
  members_ = std::move(next);
  if (!members_.empty() && !poll_timer_) {
    poll_timer_ = loop_.AddTimerAfter(Duration::zero(), [this, g = std::weak_ptr<char>(alive_)] {
      if (g.expired()) return;
      poll_timer_ = 0;
      PollMembers();
    });
  }
}

void StoreLog::SetOnLost(std::function<void(const std::string& id)> on_lost) {
  on_lost_ = std::move(on_lost);
}

void StoreLog::PollMembers() {
  if (members_.empty()) {  // polling resumes with the next WatchMembers
    poll_due_.reset();
    return;
  }
  const TimePoint now = loop_.Now();
  if (poll_due_ && now - *poll_due_ > StallAfter()) RestartDeadlines(now);  // this agent stalled
  poll_due_ = now + PollPeriod();
  if (polls_in_flight_ == 0) {   // else the previous round is still out: skip this one
    for (const auto& [id, m] : members_) {
      if (m.reported || id == self_id_) continue;
      ++polls_in_flight_;
      ops_->Add(AliveKey(id), 0, [this, id = id, now](StatusOr<int64_t> r) {
        --polls_in_flight_;
        OnCounter(id, now, std::move(r));
      });
    }
  }
  poll_timer_ = loop_.AddTimerAfter(PollPeriod(), [this, g = std::weak_ptr<char>(alive_)] {
    if (g.expired()) return;
    poll_timer_ = 0;
    PollMembers();
  });
}

// Members beat every `interval`, but are read far more often, so a silent one is reported within
// kMaxPollPeriod of its deadline (the rendezvous watches only a couple of members per agent, so
// this costs a few small pipelined requests per period).
Duration StoreLog::PollPeriod() const { return std::min<Duration>(liveness_.interval, kMaxPollPeriod); }

// A delay that is a stall, not a slow moment: a beat interval, and at least 500 ms (the short
// intervals of tests on a loaded machine see slow answers that are no stall).
Duration StoreLog::StallAfter() const { return std::max<Duration>(liveness_.interval, std::chrono::milliseconds(500)); }

void StoreLog::RestartDeadlines(TimePoint now) {
  for (auto& [id, m] : members_) m.since = std::max(m.since, now);
}

void StoreLog::OnCounter(const std::string& id, TimePoint sent, StatusOr<int64_t> r) {
  if (!r.ok()) return;  // a failed round decides nothing
  auto it = members_.find(id);
  if (it == members_.end() || it->second.reported || id == self_id_) return;
  Member& m = it->second;
  const TimePoint now = loop_.Now();
  if (now - sent > StallAfter()) RestartDeadlines(now);  // the store stalled
  // The deadline runs from the last change seen, and from the first reading (a member first
  // polled up to one period after it was watched gets its whole deadline from there).
  if (!m.counter || *m.counter != *r) m.since = now;
  m.counter = *r;
  if (now - m.since < liveness_.deadline) return;
  m.reported = true;
  if (!on_lost_) return;
  auto on_lost = on_lost_;  // it may replace on_lost_ or destroy the log: nothing follows it
  const std::string lost = id;
  on_lost(lost);
}

}  // namespace ctrun::rdzv
