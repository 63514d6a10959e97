// RendezvousLog: the storage a multi-node rendezvous runs on. It is an append-only log of state
// entries (a replicated state machine: every agent reads the same entries in the same order and
// applies the same pure transitions, rendezvous/rdzv_state.h) plus member liveness.
//
// Backends:
//   StoreLog (rendezvous/store_log.h)  ctrun's TCP store (static and c10d backends)
//   EtcdLog  (rendezvous/etcd_log.h)   etcd's v3 API (etcd and etcd-v2 backends)
//
// Contract (every backend):
//  - Asynchronous and single-threaded: every call returns at once; its callback runs later on the
//    event loop's thread, never from inside the call itself, so a callback may call into the log.
//  - Entry i (i >= 0) is written at most once, by whichever Append(i, ...) reaches the backend
//    first; afterwards everyone reads that same value for it (linearizable create-if-absent).
//    Values are small (< 64 KiB).
//  - Compaction: once entry i + 64 exists, entry i may be compacted: its value is replaced with
//    kCompactedEntry (never removed, so an Append to that index cannot create it again and a Wait
//    for it finishes). A caller that reads kCompactedEntry, from Wait() or as the value Append()
//    found, fell more than 64 entries behind: it reads Head() again. Head() never returns it.
//  - Head() may return an entry a little older than the newest; callers walk forward with Append()
//    (which returns the winner's value when the entry already exists) and Wait().
//  - A callback with an error Status means the backend gave up (its connection or the server is
//    gone past its own retry deadline, authentication was refused, ...). The rendezvous treats
//    that as fatal for this agent.
//  - Destroying the log cancels everything: no callback runs afterwards, heartbeats stop.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "base/clock.h"
#include "base/status.h"

namespace ctrun::rdzv {

// The value of a compacted entry (see the contract above). No rendezvous state encodes to it.
inline constexpr std::string_view kCompactedEntry = "ctrun:compacted-entry";

struct LogEntry {
  uint64_t index = 0;
  std::string value;
};

struct AppendResult {
  bool won = false;   // our value is now entry `index`
  std::string value;  // the value stored at `index` (ours when won)
};

struct LivenessOptions {
  Duration interval = Seconds(5);  // how often a member proves it is alive
  Duration deadline = Seconds(15);  // silence after which a member counts as lost
};

class RendezvousLog {
 public:
  template <typename T>
  using Callback = std::function<void(StatusOr<T>)>;
  virtual ~RendezvousLog() = default;

  // The newest entry known to the backend. On an empty log, entry 0 is created with `initial`
  // first (create-if-absent, so concurrent callers agree on it).
  virtual void Head(std::string initial, Callback<LogEntry> done) = 0;
  // Creates entry `index` with `value` unless it exists. done: which value entry `index` now holds.
  virtual void Append(uint64_t index, std::string value, Callback<AppendResult> done) = 0;
  // done(value) once entry `index` exists (at once, asynchronously, when it already does). At most
  // one wait is outstanding: a new Wait() replaces the previous one, whose callback never runs.
  virtual void Wait(uint64_t index, Callback<std::string> done) = 0;

  // --- liveness ----------------------------------------------------------------------------------
  // Starts proving that `self_id` is alive, every opts.interval, until the log is destroyed or
  // StopLiveness(). Errors go to the lost callback's owner through Wait/Append failing later.
  virtual void StartLiveness(const std::string& self_id, const LivenessOptions& opts) = 0;
  // Stops proving liveness (the others will see this member as lost after their deadline).
  virtual void StopLiveness() = 0;
  // The members to watch (replaces the previous set; self may be included and is ignored).
  // on_lost(id) runs once for each watched member that stayed silent past the deadline; a member
  // is given the full deadline from the moment it is first watched.
  virtual void WatchMembers(const std::vector<std::string>& ids) = 0;
  virtual void SetOnLost(std::function<void(const std::string& id)> on_lost) = 0;

  // A short description for messages, e.g. "store at 10.0.0.1:29400".
  virtual std::string Describe() const = 0;
};

}  // namespace ctrun::rdzv
