// FakeRendezvousLog: an in-memory RendezvousLog shared by several agents of one test, with every
// callback deferred through a FakeTimerQueue (0-delay timers: Advance(0) runs them), so the
// rendezvous logic runs exactly as on the event loop, without sockets or real time.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "fakes/fake_timer_queue.h"
#include "rendezvous/rendezvous_log.h"

namespace ctrun::testing {

// The shared backend: the log entries and who is watching whom.
class FakeLogServer {
 public:
  std::map<uint64_t, std::string> entries;
  bool broken = false;  // every later operation fails
  struct Waiter {
    uint64_t index;
    rdzv::RendezvousLog::Callback<std::string> cb;
  };
  std::map<int, Waiter> waiters;  // client id -> its one outstanding wait
  std::map<int, std::function<void(const std::string&)>> on_lost;
  std::map<int, std::vector<std::string>> watched;
  int next_client = 1;
  uint64_t appends = 0;
  // Compaction (see rendezvous_log.h): once entry i + keep is stored, entry i holds
  // kCompactedEntry. 0: never.
  uint64_t keep = 0;
};

class FakeRendezvousLog final : public rdzv::RendezvousLog {
 public:
  FakeRendezvousLog(std::shared_ptr<FakeLogServer> server, FakeTimerQueue& timers)
      : server_(std::move(server)), timers_(timers), id_(server_->next_client++) {}
  ~FakeRendezvousLog() override {
    *alive_ = false;
    server_->waiters.erase(id_);
    server_->on_lost.erase(id_);
    server_->watched.erase(id_);
  }

  void Head(std::string initial, Callback<rdzv::LogEntry> done) override {
    Defer([this, initial, done] {
      if (server_->broken) return done(Status::Error("fake log broken"));
      if (server_->entries.empty()) Store(0, initial);
      auto last = std::prev(server_->entries.end());
      done(rdzv::LogEntry{last->first, last->second});
    });
  }
  void Append(uint64_t index, std::string value, Callback<rdzv::AppendResult> done) override {
    Defer([this, index, value, done] {
      if (server_->broken) return done(Status::Error("fake log broken"));
      rdzv::AppendResult r;
      auto it = server_->entries.find(index);
      if (it == server_->entries.end()) {
        ++server_->appends;
        Store(index, value);
        r.won = true;
        r.value = value;
      } else {
        r.value = it->second;
      }
      done(r);
    });
  }
  void Wait(uint64_t index, Callback<std::string> done) override {
    server_->waiters.erase(id_);
    auto it = server_->entries.find(index);
    if (it != server_->entries.end()) {
      std::string v = it->second;
      const uint64_t gen = ++wait_gen_;
      Defer([this, v, done, gen] {
        if (gen == wait_gen_) done(v);
      });
      return;
    }
    ++wait_gen_;
    server_->waiters[id_] = FakeLogServer::Waiter{index, std::move(done)};
  }
  void StartLiveness(const std::string& self_id, const rdzv::LivenessOptions&) override { self_ = self_id; }
  void StopLiveness() override { stopped_liveness_ = true; }
  void WatchMembers(const std::vector<std::string>& ids) override { server_->watched[id_] = ids; }
  void SetOnLost(std::function<void(const std::string&)> cb) override { server_->on_lost[id_] = std::move(cb); }
  std::string Describe() const override { return "fake log"; }

  bool stopped_liveness() const { return stopped_liveness_; }

 private:
  void Defer(std::function<void()> f) {
    std::weak_ptr<bool> alive = alive_;
    timers_.AddTimerAfter(Duration::zero(), [alive, f] {
      if (!alive.expired() && *alive.lock()) f();
    });
  }
  // Stores entry `index` and wakes (deferred) every client waiting for it, which reads the entry
  // when it wakes, as StoreLog does (it may have been compacted meanwhile).
  void Store(uint64_t index, const std::string& value) {
    server_->entries[index] = value;
    if (server_->keep && index >= server_->keep) server_->entries[index - server_->keep] = rdzv::kCompactedEntry;
    for (auto it = server_->waiters.begin(); it != server_->waiters.end();) {
      if (it->second.index != index) {
        ++it;
        continue;
      }
      auto cb = std::move(it->second.cb);
      it = server_->waiters.erase(it);
      timers_.AddTimerAfter(Duration::zero(), [cb, index, server = server_] { cb(server->entries[index]); });
    }
  }

  std::shared_ptr<FakeLogServer> server_;
  FakeTimerQueue& timers_;
  int id_;
  std::string self_;
  bool stopped_liveness_ = false;
  uint64_t wait_gen_ = 0;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

// Declares `id` lost to every client watching it (what a liveness deadline does).
inline void LoseNode(FakeLogServer& server, FakeTimerQueue& timers, const std::string& id) {
  for (auto& [client, ids] : server.watched) {
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) continue;
    auto cb = server.on_lost[client];
    if (cb) timers.AddTimerAfter(Duration::zero(), [cb, id] { cb(id); });
  }
}

}  // namespace ctrun::testing
