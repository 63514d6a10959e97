// EtcdLog: the rendezvous log (rendezvous_log.h) on etcd's v3 API, for the etcd and etcd-v2
// backends. All keys live under `<prefix>/<run_id>/`:
//
//   log/<index as 20 zero-padded digits>   entry `index` (key order is index order)
//   alive/<member id>                      present while that member's lease lives
//
// Entries:
//  - Append(i, v) is one transaction: create_revision(log/i) == 0 ? put v : range log/i. The
//    answer says who won; `won` is also true when the stored value equals ours (a retried
//    transaction whose first try committed reads back our own value; rendezvous values carry
//    their writer, so equal values mean the same write).
//  - Head: the greatest log/ key (one range, sorted by key, descending, limit 1); on an empty log
//    entry 0 is created with `initial` by the same transaction as Append.
//  - Wait(i): a range on log/i, and when absent a watch on log/i from the range's revision + 1,
//    so a put between the two is never missed. A new Wait cancels the previous one.
//  - Compaction: whoever creates entry i puts kCompactedEntry into log/<i-64>; the newest 64
//    entries always stay, old ones shrink to a few bytes and are never created again.
//    etcd's own revision history is left to etcd's --auto-compaction settings.
//
// Liveness uses etcd leases, so the server, not the peers, measures silence:
//  - StartLiveness grants a lease with TTL = ceil(deadline) seconds (at least 1; etcd raises it
//    to its minimum, ceil(1.5 x election timeout): 2 s with default settings), puts alive/<self>
//    with it, and refreshes it every `interval` through /v3/lease/keepalive.
//  - WatchMembers: one range over alive/ and a watch from the next revision. A watched member's
//    DELETE (its lease expired: it was silent for the TTL, or it revoked it) reports it lost. A
//    watched member whose key is absent gets `deadline` (from StartLiveness's options; defaults
//    otherwise) from the moment it is first watched to appear, or it is reported lost.
//    etcd expires leases in a sweep every 500 ms, so "lost" comes 0-0.5 s after the TTL.
//  - StopLiveness only stops the refreshes (the lease runs out on its own); RevokeLiveness also
//    revokes it, so the others see this member lost at once.
//  - A lease that expired (this process was stopped past its TTL) is replaced: a new lease, the
//    alive key put again; the others have reported this member lost meanwhile, and the caller
//    (the rendezvous) finds itself dropped and joins again. If refreshing fails for good (etcd
//    unreachable past the client's retry deadline), or the members' watch fails, the log is
//    broken: the pending Wait and every later call fail with that error.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "rendezvous/etcd_client.h"
#include "rendezvous/rendezvous_log.h"
#include "sys/event_loop.h"

namespace ctrun::rdzv {

struct EtcdLogOptions {
  EtcdOptions etcd;
  std::string prefix = "/torchelastic/p2p";  // rdzv_conf etcd_prefix
  std::string run_id;
};

class EtcdLog final : public RendezvousLog {
 public:
  static constexpr uint64_t kKeepEntries = 64;

  static StatusOr<std::unique_ptr<EtcdLog>> Create(EventLoop* loop, EtcdLogOptions options);
  EtcdLog(EventLoop* loop, std::unique_ptr<EtcdClient> client, const std::string& prefix,
          const std::string& run_id);
  ~EtcdLog() override;
  EtcdLog(const EtcdLog&) = delete;
  EtcdLog& operator=(const EtcdLog&) = delete;

  void Head(std::string initial, Callback<LogEntry> done) override;
  void Append(uint64_t index, std::string value, Callback<AppendResult> done) override;
  void Wait(uint64_t index, Callback<std::string> done) override;

  void StartLiveness(const std::string& self_id, const LivenessOptions& opts) override;
  void StopLiveness() override;
  // StopLiveness, then revokes the lease (alive/<self> goes at once). done: the revoke's outcome
  // (Ok when there was no lease). The loop must keep running until done for the revoke to happen.
  void RevokeLiveness(std::function<void(Status)> done);
  void WatchMembers(const std::vector<std::string>& ids) override;
  void SetOnLost(std::function<void(const std::string& id)> on_lost) override;

  std::string Describe() const override;  // "etcd at http://a:2379,http://b:2379"

  std::string EntryKey(uint64_t index) const;
  std::string AliveKey(const std::string& id) const;
  EtcdClient& client() { return *client_; }

 private:
  enum class MemberState { kPending, kPresent, kReported };
  struct Member {
    MemberState state = MemberState::kPending;
    TimerQueue::TimerId timer = 0;  // while pending: the deadline to appear
  };

  void Defer(std::function<void()> fn);  // runs fn from a loop timer (never inside the call)
  void FinishWait(StatusOr<std::string> value);
  void CancelWait();
  void Broken(const std::string& what, const Status& why);

  void AddMember(const std::string& id);
  void StartMembersWatch();
  void OnAliveEvents(StatusOr<std::vector<EtcdWatchEvent>> events);
  void MarkPresent(const std::string& id);
  void Report(const std::vector<std::string>& ids);

  EventLoop* loop_;
  std::unique_ptr<EtcdClient> client_;
  std::string base_;  // "<prefix>/<run_id>/"
  Status broken_;     // set once liveness or the members' watch failed for good

  // The one outstanding Wait.
  uint64_t wait_gen_ = 0;
  Callback<std::string> wait_done_;
  EtcdClient::WatchId wait_watch_ = 0;

  // This member's liveness.
  std::string self_id_;
  LivenessOptions liveness_;
  uint64_t liveness_gen_ = 0;
  int64_t lease_ = 0;
  EtcdClient::KeepAliveId keepalive_ = 0;

  // The watched members.
  std::map<std::string, Member> members_;
  std::set<std::string> present_;  // alive/ keys as last seen (valid once snapshot_)
  bool snapshot_ = false;
  bool members_watch_started_ = false;
  EtcdClient::WatchId members_watch_ = 0;
  std::function<void(const std::string&)> on_lost_;

  std::map<uint64_t, TimerQueue::TimerId> deferred_;
  uint64_t next_deferred_ = 1;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace ctrun::rdzv
