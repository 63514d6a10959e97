// EtcdClient: an asynchronous etcd v3 client over etcd's JSON gateway (POST /v3/kv/range, ...)
// on a CurlLoop, on ctrun's event loop. Keys and values are bytes (base64 on the wire); revisions,
// leases and TTLs are int64 (JSON strings on the wire).
//
// Contract:
//  - Every call returns at once; its callback runs later on the loop, never inside the call, and
//    exactly once (a watch's callback: once per batch of events, then at most one error).
//  - Destroying the client cancels everything: no callback runs afterwards.
//  - Failover: a request that meets a connection error, a timeout or a 5xx/429 answer moves the
//    client to the next endpoint (for every later request too) and is retried there, at once while
//    untried endpoints remain, then with a backoff up to 1 s, until options.retry_deadline after
//    the request started; then it fails with the last error. Watches reconnect the same way and
//    resume after the last revision they delivered (a watch gives up after retry_deadline of
//    continuous failure). Other 4xx answers, and TLS set-up errors (bad files, a server
//    certificate that does not verify), fail at once.
//  - Attempt timeouts: request_timeout (short: a healthy etcd answers in milliseconds), doubling
//    from the third attempt up to 4x. After a leader change, a follower may hold a forwarded write
//    that the dead leader dropped until etcd's own timeout (~7 s); resending it elsewhere is the
//    fast way out, so a leader change costs about one request_timeout.
//  - Retried writes may be applied twice: Put is idempotent, CreateIfAbsent then reports the
//    existing value (compare it with yours), LeaseGrant may leave an unused lease that expires,
//    LeaseRevoke treats an unknown lease as revoked.
//  - Authentication: with a user, the client gets a token from /v3/auth/authenticate before its
//    first request and sends it as the `Authorization` header. A request refused for an invalid
//    token (expired: etcd's --auth-token-ttl, or etcd restarted) makes the client authenticate
//    again and retry. A refused password fails the waiting requests with etcd's message.
//  - Reads are linearizable (etcd's default: the member confirms with the leader first), so a
//    successful CreateIfAbsent is visible to every later Range on any member.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/clock.h"
#include "base/status.h"
#include "rendezvous/curl_loop.h"
#include "rendezvous/etcd_response.h"
#include "sys/event_loop.h"

namespace ctrun::rdzv {

struct EtcdOptions {
  // "http://host:port" or "https://host:port"; a bare "host:port" means http://.
  std::vector<std::string> endpoints;
  std::string user;  // non-empty: authenticate with user/password
  std::string password;
  TlsFiles tls;  // for https:// endpoints
  Duration request_timeout = Seconds(2);  // one HTTP attempt on one endpoint (see above)
  Duration connect_timeout = Seconds(2);
  Duration retry_deadline = Seconds(30);  // failing over and retrying stops after this
  // Called once per outage, from the loop: a request reached no endpoint and is being retried
  // ("cannot reach etcd at ... yet (why); retrying for up to N s"). An answer ends the outage.
  std::function<void(const std::string&)> on_unreachable;
};

enum class EtcdSortOrder { kNone, kAscend, kDescend };
enum class EtcdSortTarget { kKey, kVersion, kCreate, kMod, kValue };

struct EtcdRangeRequest {
  std::string key;
  bool prefix = false;  // every key that starts with `key`
  int64_t limit = 0;    // 0: all
  EtcdSortOrder sort_order = EtcdSortOrder::kNone;
  EtcdSortTarget sort_target = EtcdSortTarget::kKey;
};

struct EtcdWatchRequest {
  std::string key;
  bool prefix = false;
  int64_t start_revision = 0;  // 0: from now
  // A watch resumes where it left off (after a cut stream, a leader change, a restarted member);
  // when etcd has compacted that revision away, the events in between are gone. With this set,
  // the watch then ends by calling it (not on_events): the watcher reads what it watches again
  // (a Range) and watches anew from there. Without it, the watch ends with an error.
  std::function<void()> on_compacted;
};

class EtcdClient {
 public:
  template <typename T>
  using Callback = std::function<void(StatusOr<T>)>;
  // Events in revision order, in batches; an error ends the watch (no callback after it).
  using WatchCallback = std::function<void(StatusOr<std::vector<EtcdWatchEvent>>)>;
  using WatchId = uint64_t;
  using KeepAliveId = uint64_t;

  // Checks the options (endpoints present, schemes known).
  static StatusOr<std::unique_ptr<EtcdClient>> Create(EventLoop* loop, EtcdOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  void Range(EtcdRangeRequest request, Callback<EtcdRangeResult> done);
  // done: the revision of the put. lease 0: none.
  void Put(std::string key, std::string value, int64_t lease, Callback<int64_t> done);
  void CreateIfAbsent(std::string key, std::string value, int64_t lease, Callback<EtcdCreateResult> done);
  void DeleteRange(std::string key, bool prefix, Callback<EtcdDeleteResult> done);

  void LeaseGrant(int64_t ttl_seconds, Callback<EtcdLease> done);
  // done: the revision (0 when the lease was already gone: expired, or revoked by an earlier try).
  void LeaseRevoke(int64_t lease, Callback<int64_t> done);
  // Refreshes the lease once. done: the TTL it was reset to; an error when the lease is gone.
  void LeaseKeepAliveOnce(int64_t lease, Callback<int64_t> done);
  // Refreshes the lease every `interval` (first after one interval) until StopKeepAlive. on_lost
  // runs at most once, when etcd says the lease is gone (expired true: it ran out, e.g. while
  // this process was stopped, or was revoked) or refreshing failed past retry_deadline (expired
  // false); refreshing stops then.
  KeepAliveId StartKeepAlive(int64_t lease, Duration interval, std::function<void(Status, bool expired)> on_lost);
  void StopKeepAlive(KeepAliveId id);

  WatchId Watch(EtcdWatchRequest request, WatchCallback on_events);
  // The watch's callback never runs afterwards. Unknown ids are ignored.
  void CancelWatch(WatchId id);

  // "http://a:2379,http://b:2379"
  std::string Describe() const;
  // The endpoint requests go to now (moves on failover).
  const std::string& current_endpoint() const { return endpoints_[current_]; }

 private:
  struct Call;
  struct WatchState;
  struct KeepAlive;
  using Json = nlohmann::json;
  using TokenWaiter = std::function<void(const Status&)>;

  EtcdClient(EventLoop* loop, EtcdOptions options, std::vector<std::string> endpoints);

  // One logical request: attempts on endpoints until success, a final error, or its deadline.
  // `done` gets the body of a successful answer (decode it with etcd_response.h).
  uint64_t Request(std::string path, const Json& body, bool with_token,
                   std::function<void(StatusOr<std::string>)> done);
  void Attempt(uint64_t id);
  void OnAttemptDone(uint64_t id, HttpResult result);
  void RetryCall(Call& c, std::string why);
  void FinishCall(uint64_t id, StatusOr<std::string> result);
  void CancelCall(uint64_t id);

  // Authentication: runs `waiter` once a token is there (Ok) or authentication failed (error).
  bool NeedsToken() const;
  void WaitForToken(TokenWaiter waiter);
  void Authenticate();
  void OnAuthenticated(StatusOr<std::string> answer);
  void InvalidateToken(const std::string& used);

  void AttemptWatch(uint64_t id);
  void OnWatchData(uint64_t id, std::string_view chunk);
  bool OnWatchMessage(WatchId id, const std::string& line);  // false: stop reading this stream
  void OnWatchEnd(uint64_t id, HttpResult result);
  void RetryWatch(WatchState& w, std::string why, bool auth_failed = false);
  void DeliverEvents(WatchId id, std::vector<EtcdWatchEvent> events);
  std::unique_ptr<WatchState> RemoveWatch(WatchId id);  // with its timer and stream; null if unknown
  void FailWatch(uint64_t id, Status why);
  void EndCompactedWatch(WatchId id);  // request.on_compacted instead of an error

  void KeepAliveTick(KeepAliveId id);

  void NextEndpoint(size_t failed);
  Duration RetryDelay(int failures) const;
  Duration AttemptTimeout(int failures) const;
  HttpRequest MakeRequest(size_t endpoint, const std::string& path, std::string body,
                          const std::string& token, Duration timeout) const;

  EventLoop* loop_;
  EtcdOptions options_;
  std::vector<std::string> endpoints_;  // normalized, no trailing '/'
  size_t current_ = 0;
  CurlLoop curl_;

  std::map<uint64_t, std::unique_ptr<Call>> calls_;
  std::map<WatchId, std::unique_ptr<WatchState>> watches_;
  std::map<KeepAliveId, std::unique_ptr<KeepAlive>> keepalives_;
  uint64_t next_id_ = 1;

  std::string token_;  // empty: none (no user, or auth not enabled on the server)
  bool have_token_ = false;
  bool said_unreachable_ = false;  // on_unreachable was called for the current outage
  bool authenticating_ = false;
  std::vector<TokenWaiter> token_waiters_;

  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

// The range_end that makes [key, range_end) every key with prefix `key` (etcd's convention).
std::string EtcdPrefixEnd(const std::string& key);

}  // namespace ctrun::rdzv
