// StoreLog: the rendezvous log (rendezvous_log.h) on ctrun's TCP store, for the static and c10d
// backends. All keys live under `ctrun/rdzv/<run_id>/`:
//
//   log/<index>   entry `index` (decimal)
//   head          ADD counter: a hint at the newest index, never ahead of it
//   alive/<id>    ADD counter that member `id` bumps every liveness interval
//
// Two connections (AsyncStoreClient): one for every operation, one only for the parked WAIT, so a
// wait never holds back appends, reads or heartbeats.
//
// Entries:
//  - Append(i, v): COMPARE_SET(log/i, "", v) creates the entry unless it exists and returns what
//    it holds; we won when that is v (values carry their writer, so they are unique). The winner
//    of an index i >= 1 then sends ADD(head, 1) and, for i >= 64, SET(log/<i-64>, kCompactedEntry),
//    so the newest 64 entries always stay and old ones shrink to a few bytes. Entries are appended
//    densely (Append(i) once entry i-1 exists), so head, which counts winners of 1..n, never
//    points past the newest entry.
//  - Head: h = ADD(head, 0). h == 0: COMPARE_SET(log/0, "", initial) creates entry 0 unless it
//    exists (concurrent callers agree on it; when h == 0 no entry was compacted yet). h > 0: read
//    log/h. Then read log/h+1, log/h+2, ... until one is missing: the last one read is the result.
//    Should log/h or one read after it be compacted (64 appends while Head was reading, or a
//    head counter far behind), Head starts over; the third time it walks on through the
//    compacted entries, which ends at the newest entry.
//  - Reads never use GET, since a GET of a missing key makes the server close the connection and
//    fail everything pending on it. A read is COMPARE_SET(key, A, A) with a sentinel A that no
//    entry holds (Append and Head refuse it): the server returns the stored value, or A when the
//    key is missing, and stores nothing either way.
//  - Wait(i): WAIT(log/i) on the wait connection, then a read of log/i. A new Wait cancels the
//    previous one (CANCEL_WAIT; the client drops its callback) and a generation check drops a read
//    already under way. A Wait for a compacted entry finishes with kCompactedEntry.
//
// Liveness (timing uses the loop's clock only):
//  - StartLiveness: ADD(alive/<self>, 1) at once and every interval; a beat is skipped while the
//    previous one is unanswered. Failures are only logged: a broken store fails the rendezvous's
//    own Append/Wait/Head.
//  - WatchMembers: every min(interval, kMaxPollPeriod), one pipelined round of ADD(alive/<id>, 0)
//    for each watched id (ADD creates a missing key as 0, so it never closes the connection the
//    way GET would). A member whose counter has not changed for `deadline` since it was first read
//    or last changed is reported once, so a dead member is reported at most deadline +
//    kMaxPollPeriod (+ a round trip) after its last beat. A failed round decides nothing. Interval
//    and deadline come from the latest StartLiveness (LivenessOptions defaults before one).
//  - A stall restarts every deadline: an answer that took longer than an interval (at least
//    500 ms; the store's process was stopped: nobody's beat could land meanwhile, and the answers
//    that come after it show counters nobody could bump), or a poll round that ran that much late
//    (this agent was stopped). Members then get a whole deadline from the end of the stall; one that stopped
//    for real is reported that much later, none is reported for the stall.
//
// Errors: a request that fails after the client's own connect retries reaches the callback as an
// error Status (connection lost, op timeout, refused token, ...).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/rendezvous_log.h"
#include "store/async_store_client.h"
#include "sys/event_loop.h"

namespace ctrun::rdzv {

struct StoreLogOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string run_id;
  std::string token;                       // ctrun AUTH token; empty: none sent
  Duration connect_timeout = Seconds(60);  // retry refused connects this long (host may be late)
  Duration op_timeout = Seconds(30);       // per request; also tunes TCP keepalive
  std::function<void(const std::string&)> on_unreachable;  // see store::AsyncClientOptions
  std::function<void()> before_retry;                      // see store::AsyncClientOptions
};

class StoreLog final : public RendezvousLog {
 public:
  static constexpr uint64_t kKeepEntries = 64;
  static constexpr Duration kMaxPollPeriod = std::chrono::milliseconds(100);

  // Resolves the host (blocking, once); connects with the first request.
  static StatusOr<std::unique_ptr<StoreLog>> Create(EventLoop& loop, const StoreLogOptions& opts);
  ~StoreLog() override;
  StoreLog(const StoreLog&) = delete;
  StoreLog& operator=(const StoreLog&) = delete;

  void Head(std::string initial, Callback<LogEntry> done) override;
  void Append(uint64_t index, std::string value, Callback<AppendResult> done) override;
  void Wait(uint64_t index, Callback<std::string> done) override;

  void StartLiveness(const std::string& self_id, const LivenessOptions& opts) override;
  void StopLiveness() override;
  void WatchMembers(const std::vector<std::string>& ids) override;
  void SetOnLost(std::function<void(const std::string& id)> on_lost) override;

  std::string Describe() const override;  // "store at HOST:PORT" (c10d and static alike)

  // Store keys (tests).
  std::string EntryKey(uint64_t index) const { return base_ + "log/" + std::to_string(index); }
  std::string HeadKey() const { return base_ + "head"; }
  std::string AliveKey(const std::string& id) const { return base_ + "alive/" + id; }

 private:
  using ReadDone = std::function<void(StatusOr<std::optional<std::string>>)>;
  struct Member {
    TimePoint since;                 // first watched, or last seen changing
    std::optional<int64_t> counter;  // last value read
    bool reported = false;
  };

  StoreLog(EventLoop& loop, std::string base, std::unique_ptr<store::AsyncStoreClient> ops,
           std::unique_ptr<store::AsyncStoreClient> waiter);
  void Defer(std::function<void()> fn);  // runs fn from a loop timer, never inside the call

  // Value of `key`, or nullopt when it is missing (see "Reads" above).
  static void Read(store::AsyncStoreClient& client, std::string key, ReadDone done);
  void ReadHead(std::string initial, int attempts, Callback<LogEntry> done);
  void OnHeadHint(int64_t hint, std::string initial, int attempts, Callback<LogEntry> done);
  void WalkForward(LogEntry at, std::string initial, int attempts, Callback<LogEntry> done);
  void AfterWin(uint64_t index);
  void OnWaitDone(uint64_t gen, uint64_t index, StatusOr<bool> r, Callback<std::string> done);

  void Beat();
  void PollMembers();
  Duration PollPeriod() const;
  void OnCounter(const std::string& id, TimePoint sent, StatusOr<int64_t> r);
  void RestartDeadlines(TimePoint now);
  Duration StallAfter() const;

  EventLoop& loop_;
  std::string base_;  // "ctrun/rdzv/<run_id>/"
  std::unique_ptr<store::AsyncStoreClient> ops_;
  std::unique_ptr<store::AsyncStoreClient> waiter_;

  uint64_t wait_gen_ = 0;
  store::AsyncStoreClient::WaitId wait_id_ = 0;

  std::string self_id_;
  LivenessOptions liveness_;
  TimerQueue::TimerId beat_timer_ = 0;
  bool beat_in_flight_ = false;

  std::map<std::string, Member> members_;
  TimerQueue::TimerId poll_timer_ = 0;
  size_t polls_in_flight_ = 0;
  std::optional<TimePoint> poll_due_;  // when the pending poll round was due (stall detection)
  std::function<void(const std::string&)> on_lost_;

  std::map<uint64_t, TimerQueue::TimerId> deferred_;
  uint64_t next_deferred_ = 1;
  std::shared_ptr<char> alive_ = std::make_shared<char>(0);  // expires with the log
};

}  // namespace ctrun::rdzv
