#include "rendezvous/etcd_log.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <optional>
#include <utility>

namespace ctrun::rdzv {
namespace {

std::optional<uint64_t> ParseIndex(const std::string& key, const std::string& log_prefix) {
  if (key.size() <= log_prefix.size() || key.compare(0, log_prefix.size(), log_prefix) != 0) return std::nullopt;
  uint64_t index = 0;
  const char* begin = key.data() + log_prefix.size();
  const char* end = key.data() + key.size();
  auto [ptr, ec] = std::from_chars(begin, end, index);
  if (ec != std::errc() || ptr != end) return std::nullopt;
  return index;
}

}  // namespace

StatusOr<std::unique_ptr<EtcdLog>> EtcdLog::Create(EventLoop* loop, EtcdLogOptions options) {
  auto client = EtcdClient::Create(loop, std::move(options.etcd));
  if (!client.ok()) return client.status();
  return std::make_unique<EtcdLog>(loop, std::move(*client), options.prefix, options.run_id);
}

EtcdLog::EtcdLog(EventLoop* loop, std::unique_ptr<EtcdClient> client, const std::string& prefix,
                 const std::string& run_id)
    : loop_(loop), client_(std::move(client)) {
  std::string p = prefix;
  while (!p.empty() && p.back() == '/') p.pop_back();
  base_ = p + "/" + run_id + "/";
}

EtcdLog::~EtcdLog() {
  alive_.reset();
  for (auto& [key, timer] : deferred_) loop_->CancelTimer(timer);
  for (auto& [id, m] : members_)
    if (m.timer) loop_->CancelTimer(m.timer);
  // client_ goes next: every request, watch and keepalive with it, no callback afterwards.
}

std::string EtcdLog::Describe() const { return "etcd at " + client_->Describe(); }

std::string EtcdLog::EntryKey(uint64_t index) const {
  char digits[24];
  std::snprintf(digits, sizeof digits, "%020llu", static_cast<unsigned long long>(index));
  return base_ + "log/" + digits;
}

std::string EtcdLog::AliveKey(const std::string& id) const { return base_ + "alive/" + id; }

void EtcdLog::Defer(std::function<void()> fn) {
  const uint64_t key = next_deferred_++;
  deferred_[key] = loop_->AddTimerAfter(Duration::zero(), [this, key, fn = std::move(fn)] {
    deferred_.erase(key);
    fn();
  });
}

// --- entries -------------------------------------------------------------------------------------

void EtcdLog::Head(std::string initial, Callback<LogEntry> done) {
  if (!broken_.ok()) return Defer([done, st = broken_] { done(st); });
  EtcdRangeRequest req;
  req.key = base_ + "log/";
  req.prefix = true;
  req.limit = 1;
  req.sort_order = EtcdSortOrder::kDescend;
  req.sort_target = EtcdSortTarget::kKey;
  client_->Range(std::move(req), [this, initial = std::move(initial), done = std::move(done)](
                                     StatusOr<EtcdRangeResult> r) mutable {
    if (!r.ok()) return done(r.status());
    if (!r->kvs.empty()) {
      const EtcdKeyValue& kv = r->kvs.front();
      auto index = ParseIndex(kv.key, base_ + "log/");
      if (!index) return done(Status::Error("etcd: unexpected key in the rendezvous log: " + kv.key));
      return done(LogEntry{*index, kv.value});
    }
    // Empty log: everyone races to create entry 0; the transaction picks one value for all.
    client_->CreateIfAbsent(EntryKey(0), std::move(initial), 0, [done](StatusOr<EtcdCreateResult> c) {
      if (!c.ok()) return done(c.status());
      done(LogEntry{0, c->kv.value});
    });
  });
}

void EtcdLog::Append(uint64_t index, std::string value, Callback<AppendResult> done) {
  if (!broken_.ok()) return Defer([done, st = broken_] { done(st); });
  std::string key = EntryKey(index);
  client_->CreateIfAbsent(std::move(key), value, 0, [this, index, value, done](StatusOr<EtcdCreateResult> r) {
    if (!r.ok()) return done(r.status());
    const bool won = r->created || r->kv.value == value;
    if (won && index >= kKeepEntries) {
      // Best effort: a failed put leaves one old value behind, nothing worse.
      client_->Put(EntryKey(index - kKeepEntries), std::string(kCompactedEntry), 0, [](StatusOr<int64_t>) {});
    }
    done(AppendResult{won, r->kv.value});
  });
}

void EtcdLog::Wait(uint64_t index, Callback<std::string> done) {
  CancelWait();
  const uint64_t gen = wait_gen_;
  wait_done_ = std::move(done);
  if (!broken_.ok()) return Defer([this, gen] {
      if (gen == wait_gen_) FinishWait(broken_);
    });
  EtcdRangeRequest req;
  req.key = EntryKey(index);
  client_->Range(std::move(req), [this, gen, index](StatusOr<EtcdRangeResult> r) {
    if (gen != wait_gen_) return;  // replaced meanwhile
    if (!r.ok()) return FinishWait(r.status());
    if (!r->kvs.empty()) return FinishWait(r->kvs.front().value);
    // From the range's revision on, so a put that landed after the range is still seen.
    EtcdWatchRequest w;
    w.key = EntryKey(index);
    w.start_revision = r->revision + 1;
    // Resumed past a compaction (after a cut stream): the put may be among the lost events, so
    // the entry is read again and watched from that read.
    w.on_compacted = [this, gen, index] {
      if (gen != wait_gen_) return;
      wait_watch_ = 0;
      Wait(index, std::move(wait_done_));
    };
    wait_watch_ = client_->Watch(std::move(w), [this, gen](StatusOr<std::vector<EtcdWatchEvent>> events) {
      if (gen != wait_gen_) return;
      if (!events.ok()) {
        wait_watch_ = 0;  // an error ends the watch
        return FinishWait(events.status());
      }
      for (const EtcdWatchEvent& e : *events)
        if (e.type == EtcdEventType::kPut) return FinishWait(e.kv.value);
    });
  });
}

void EtcdLog::CancelWait() {
  ++wait_gen_;
  wait_done_ = nullptr;
  if (wait_watch_) client_->CancelWatch(wait_watch_);
  wait_watch_ = 0;
}

void EtcdLog::FinishWait(StatusOr<std::string> value) {
  Callback<std::string> done = std::move(wait_done_);
  CancelWait();
  if (done) done(std::move(value));
}

void EtcdLog::Broken(const std::string& what, const Status& why) {
  if (!broken_.ok()) return;
  broken_ = Status::Error(what + ": " + why.message());
  if (wait_done_) FinishWait(broken_);
}

// --- liveness ------------------------------------------------------------------------------------

void EtcdLog::StartLiveness(const std::string& self_id, const LivenessOptions& opts) {
  StopLiveness();
  self_id_ = self_id;
  liveness_ = opts;
  const uint64_t gen = liveness_gen_;
  const auto ttl = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(ToSeconds(opts.deadline))));
  client_->LeaseGrant(ttl, [this, gen](StatusOr<EtcdLease> lease) {
    if (gen != liveness_gen_) {  // stopped meanwhile: give the lease back
      if (lease.ok()) client_->LeaseRevoke(lease->id, [](StatusOr<int64_t>) {});
      return;
    }
    if (!lease.ok()) return Broken("etcd liveness of " + self_id_, lease.status());
    lease_ = lease->id;
    client_->Put(AliveKey(self_id_), self_id_, lease_, [this, gen](StatusOr<int64_t> put) {
      if (gen == liveness_gen_ && !put.ok()) Broken("etcd liveness of " + self_id_, put.status());
    });
    keepalive_ = client_->StartKeepAlive(lease_, liveness_.interval, [this, gen](Status st, bool expired) {
      if (gen != liveness_gen_) return;
      keepalive_ = 0;
      // A lease that ran out (this process was stopped longer than its TTL: Ctrl-Z, SIGSTOP, a
      // VM pause) is not a broken log: the others have dropped this member by now; it comes back
      // under a new lease, and the rendezvous finds itself dropped and joins again, as with the
      // store backend. An etcd unreachable past the retry deadline breaks the log.
      if (expired) return StartLiveness(self_id_, liveness_);
      Broken("etcd liveness of " + self_id_, st);
    });
  });
}

void EtcdLog::StopLiveness() {
  ++liveness_gen_;
  if (keepalive_) client_->StopKeepAlive(keepalive_);
  keepalive_ = 0;
}

void EtcdLog::RevokeLiveness(std::function<void(Status)> done) {
  StopLiveness();
  const int64_t lease = std::exchange(lease_, 0);
  if (!lease) return Defer([done] { done(Status::Ok()); });
  client_->LeaseRevoke(lease, [done](StatusOr<int64_t> r) { done(r.status()); });
}

// --- watched members -----------------------------------------------------------------------------

void EtcdLog::SetOnLost(std::function<void(const std::string& id)> on_lost) { on_lost_ = std::move(on_lost); }

void EtcdLog::WatchMembers(const std::vector<std::string>& ids) {
  std::set<std::string> wanted(ids.begin(), ids.end());
  wanted.erase(self_id_);
  for (auto it = members_.begin(); it != members_.end();) {
    if (wanted.count(it->first)) {
      ++it;
      continue;
    }
    if (it->second.timer) loop_->CancelTimer(it->second.timer);
    it = members_.erase(it);
  }
  for (const std::string& id : wanted)
    if (!members_.count(id)) AddMember(id);
  if (!members_watch_started_ && !members_.empty()) StartMembersWatch();
}

void EtcdLog::AddMember(const std::string& id) {
  Member& m = members_[id];
  if (snapshot_ && present_.count(id)) {
    m.state = MemberState::kPresent;
    return;
  }
  // Absent (or not known yet): it has the full deadline from now to show up.
  m.timer = loop_->AddTimerAfter(liveness_.deadline, [this, id] {
    Member& silent = members_.at(id);
    silent.timer = 0;
    silent.state = MemberState::kReported;
    Report({id});
  });
}

void EtcdLog::MarkPresent(const std::string& id) {
  auto it = members_.find(id);
  if (it == members_.end() || it->second.state != MemberState::kPending) return;
  if (it->second.timer) loop_->CancelTimer(it->second.timer);
  it->second.timer = 0;
  it->second.state = MemberState::kPresent;
}

void EtcdLog::StartMembersWatch() {
  members_watch_started_ = true;
  EtcdRangeRequest req;
  req.key = AliveKey("");
  req.prefix = true;
  client_->Range(std::move(req), [this](StatusOr<EtcdRangeResult> r) {
    if (!r.ok()) return Broken("etcd member watch", r.status());
    const std::string prefix = AliveKey("");
    std::set<std::string> now;
    for (const EtcdKeyValue& kv : r->kvs) now.insert(kv.key.substr(prefix.size()));
    // Read again after a compaction: a key gone since the last read went by a delete event
    // that was compacted away, and counts as that delete.
    std::vector<EtcdWatchEvent> gone;
    for (const std::string& id : present_)
      if (!now.count(id)) gone.push_back(EtcdWatchEvent{EtcdEventType::kDelete, EtcdKeyValue{prefix + id}});
    present_.insert(now.begin(), now.end());
    snapshot_ = true;
    for (const std::string& id : now) MarkPresent(id);
    EtcdWatchRequest w;
    w.key = prefix;
    w.prefix = true;
    w.start_revision = r->revision + 1;
    w.on_compacted = [this] {
      members_watch_ = 0;
      StartMembersWatch();
    };
    members_watch_ = client_->Watch(std::move(w), [this](StatusOr<std::vector<EtcdWatchEvent>> events) {
      OnAliveEvents(std::move(events));
    });
    if (!gone.empty()) OnAliveEvents(std::move(gone));  // last: reporting may destroy this log
  });
}

void EtcdLog::OnAliveEvents(StatusOr<std::vector<EtcdWatchEvent>> events) {
  if (!events.ok()) {
    members_watch_ = 0;
    return Broken("etcd member watch", events.status());
  }
  const size_t skip = AliveKey("").size();
  std::vector<std::string> lost;
  for (const EtcdWatchEvent& e : *events) {
    const std::string id = e.kv.key.substr(skip);
    if (e.type == EtcdEventType::kPut) {
      present_.insert(id);
      MarkPresent(id);
      continue;
    }
    present_.erase(id);  // the lease expired or was revoked
    auto it = members_.find(id);
    if (it == members_.end() || it->second.state == MemberState::kReported) continue;
    if (it->second.timer) loop_->CancelTimer(it->second.timer);
    it->second.timer = 0;
    it->second.state = MemberState::kReported;
    lost.push_back(id);
  }
  Report(lost);
}

void EtcdLog::Report(const std::vector<std::string>& ids) {
  std::weak_ptr<bool> alive = alive_;
  for (const std::string& id : ids) {
    if (!on_lost_) return;
    auto on_lost = on_lost_;  // a copy: the callback may replace it or destroy the log
    on_lost(id);
    if (alive.expired()) return;
  }
}

}  // namespace ctrun::rdzv
