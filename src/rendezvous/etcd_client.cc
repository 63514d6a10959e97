#include "rendezvous/etcd_client.h"

#include "rendezvous/curl_api.h"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <utility>

namespace ctrun::rdzv {
namespace {

using Json = nlohmann::json;

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

bool Has(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

std::string SecondsText(Duration d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1fs", ToSeconds(d));
  return buf;
}

const char* SortOrderName(EtcdSortOrder o) {
  switch (o) {
    case EtcdSortOrder::kAscend:
      return "ASCEND";
    case EtcdSortOrder::kDescend:
      return "DESCEND";
    default:
      return "NONE";
  }
}

const char* SortTargetName(EtcdSortTarget t) {
  switch (t) {
    case EtcdSortTarget::kVersion:
      return "VERSION";
    case EtcdSortTarget::kCreate:
      return "CREATE";
    case EtcdSortTarget::kMod:
      return "MOD";
    case EtcdSortTarget::kValue:
      return "VALUE";
    default:
      return "KEY";
  }
}

Json KeyRange(const std::string& key, bool prefix) {
  Json j = {{"key", EtcdBase64(key)}};
  if (prefix) j["range_end"] = EtcdBase64(EtcdPrefixEnd(key));
  return j;
}

StatusOr<std::vector<std::string>> NormalizeEndpoints(const std::vector<std::string>& given) {
  std::vector<std::string> out;
  for (const std::string& entry : given) {
    size_t start = 0;
    while (start <= entry.size()) {  // entries may themselves be comma-separated lists
      size_t comma = std::min(entry.find(',', start), entry.size());
      std::string ep = entry.substr(start, comma - start);
      start = comma + 1;
      ep.erase(0, ep.find_first_not_of(" \t"));
      ep.erase(ep.find_last_not_of(" \t/") + 1);
      if (ep.empty()) continue;
      if (!Has(ep, "://")) ep = "http://" + ep;
      if (ep.rfind("http://", 0) != 0 && ep.rfind("https://", 0) != 0)
        return Status::Error("etcd endpoint '" + ep + "': expected http://host:port or https://host:port");
      out.push_back(ep);
    }
  }
  if (out.empty()) return Status::Error("etcd: no endpoints given");
  return out;
}

}  // namespace

std::string EtcdPrefixEnd(const std::string& key) {
  std::string end = key;
  while (!end.empty()) {
    auto c = static_cast<unsigned char>(end.back());
    if (c < 0xff) {
      end.back() = static_cast<char>(c + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key >= `key`
}

struct EtcdClient::Call {
  uint64_t id = 0;
  std::string path;
  std::string body;
  bool with_token = true;
  TimePoint deadline;
  int failures = 0;      // attempts that failed in a retryable way
  int auth_retries = 0;  // re-authentications for this call
  std::string last_error;
  size_t endpoint = 0;
  std::string token_used;
  CurlLoop::TransferId transfer = 0;
  TimerQueue::TimerId timer = 0;
  std::function<void(StatusOr<std::string>)> done;
};

struct EtcdClient::WatchState {
  WatchId id = 0;
  EtcdWatchRequest request;
  int64_t next_revision = 0;  // where a reconnect resumes (0: from "now" until created)
  WatchCallback on_events;
  CurlLoop::TransferId transfer = 0;
  TimerQueue::TimerId timer = 0;
  std::string buffer;  // a partial message line
  int failures = 0;    // since the stream was last healthy
  int auth_retries = 0;
  TimePoint outage_deadline;
  size_t endpoint = 0;
  std::string token_used;
};

struct EtcdClient::KeepAlive {
  int64_t lease = 0;
  Duration interval{};
  std::function<void(Status, bool expired)> on_lost;
  TimerQueue::TimerId timer = 0;
  uint64_t call = 0;
};

StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(EventLoop* loop, EtcdOptions options) {
  auto endpoints = NormalizeEndpoints(options.endpoints);
  if (!endpoints.ok()) return endpoints.status();
  if (auto curl = LoadCurl(); !curl.ok()) return curl.status();
  return std::unique_ptr<EtcdClient>(new EtcdClient(loop, std::move(options), std::move(*endpoints)));
}

EtcdClient::EtcdClient(EventLoop* loop, EtcdOptions options, std::vector<std::string> endpoints)
    : loop_(loop), options_(std::move(options)), endpoints_(std::move(endpoints)), curl_(loop) {}

EtcdClient::~EtcdClient() {
  alive_.reset();
  // Transfers die with curl_; timers are the loop's and must go now.
  for (auto& [id, c] : calls_)
    if (c->timer) loop_->CancelTimer(c->timer);
  for (auto& [id, w] : watches_)
    if (w->timer) loop_->CancelTimer(w->timer);
  for (auto& [id, k] : keepalives_)
    if (k->timer) loop_->CancelTimer(k->timer);
}

std::string EtcdClient::Describe() const {
  std::string out;
  for (const auto& ep : endpoints_) out += (out.empty() ? "" : ",") + ep;
  return out;
}

// --- requests with failover ----------------------------------------------------------------------

HttpRequest EtcdClient::MakeRequest(size_t endpoint, const std::string& path, std::string body,
                                    const std::string& token, Duration timeout) const {
  HttpRequest r;
  r.url = endpoints_[endpoint] + path;
  r.body = std::move(body);
  r.headers.push_back("Content-Type: application/json");
  if (!token.empty()) r.headers.push_back("Authorization: " + token);
  r.timeout = timeout;
  r.connect_timeout = options_.connect_timeout;
  r.tls = options_.tls;
  return r;
}

void EtcdClient::NextEndpoint(size_t failed) {
  // Several requests may fail on the same endpoint at once: only the first moves the client on.
  if (failed == current_) current_ = (current_ + 1) % endpoints_.size();
}

// At once while this request has not yet tried every endpoint, then 50 ms doubling up to 1 s.
Duration EtcdClient::RetryDelay(int failures) const {
  const int n = static_cast<int>(endpoints_.size());
  if (failures < n) return Duration::zero();
  return std::min<Duration>(Seconds(1), std::chrono::milliseconds(50 << std::min(failures - n, 5)));
}

// request_timeout for the first two attempts, then doubling up to 4x: a slow but healthy cluster
// still gets through, while a write stuck on a follower after a leader change (the dead leader
// dropped its proposal; the follower would hold it until etcd's own ~7 s timeout) costs only
// one request_timeout before it is sent again.
Duration EtcdClient::AttemptTimeout(int failures) const {
  return options_.request_timeout * (1 << std::clamp(failures - 1, 0, 2));
}

uint64_t EtcdClient::Request(std::string path, const Json& body, bool with_token,
                             std::function<void(StatusOr<std::string>)> done) {
  auto c = std::make_unique<Call>();
  const uint64_t id = c->id = next_id_++;
  c->path = std::move(path);
  c->body = Dump(body);
  c->with_token = with_token;
  c->deadline = loop_->Now() + options_.retry_deadline;
  c->done = std::move(done);
  // The first attempt starts from the loop too, so no answer (not even an error) is synchronous.
  c->timer = loop_->AddTimerAfter(Duration::zero(), [this, id] {
    calls_.at(id)->timer = 0;
    Attempt(id);
  });
  calls_.emplace(id, std::move(c));
  return id;
}

void EtcdClient::Attempt(uint64_t id) {
  auto it = calls_.find(id);
  if (it == calls_.end()) return;
  Call& c = *it->second;
  if (c.with_token && NeedsToken()) {
    WaitForToken([this, id](const Status& st) {
      if (!st.ok()) return FinishCall(id, st);
      Attempt(id);
    });
    return;
  }
  const Duration left = c.deadline - loop_->Now();
  if (c.failures > 0 && left <= Duration::zero()) {
    FinishCall(id, Status::Error("etcd " + c.path + " failed for " + SecondsText(options_.retry_deadline) +
                                 " on " + Describe() + "; last error: " + c.last_error));
    return;
  }
  const Duration timeout = std::max<Duration>(std::min(AttemptTimeout(c.failures), left), std::chrono::milliseconds(50));
  c.endpoint = current_;
  c.token_used = token_;
  c.transfer = curl_.Post(MakeRequest(c.endpoint, c.path, c.body, token_, timeout),
                          [this, id](HttpResult r) { OnAttemptDone(id, std::move(r)); });
}

void EtcdClient::OnAttemptDone(uint64_t id, HttpResult r) {
  auto it = calls_.find(id);
  if (it == calls_.end()) return;
  Call& c = *it->second;
  c.transfer = 0;
  if (!r.error.ok()) {
    if (r.permanent) return FinishCall(id, r.error);
    // Said once every endpoint has failed this call (a fail-over that works at once is no outage).
    if (!said_unreachable_ && options_.on_unreachable && static_cast<size_t>(c.failures) + 1 >= endpoints_.size()) {
      said_unreachable_ = true;
      options_.on_unreachable("cannot reach etcd at " + Describe() + " yet (" + r.error.message() +
                              "); retrying for up to " + SecondsText(options_.retry_deadline));
    }
    return RetryCall(c, r.error.message());
  }
  said_unreachable_ = false;  // an answer: the next outage is said again
  const std::string where = "etcd " + c.path + " at " + endpoints_[c.endpoint] + ": ";
  EtcdAnswer answer = ClassifyEtcdAnswer(r.status, r.body);
  switch (answer.verdict) {
    case EtcdVerdict::kOk:
      return FinishCall(id, std::move(r.body));
    case EtcdVerdict::kAuth:
      if (c.with_token && !options_.user.empty() && c.auth_retries < 3) {
        ++c.auth_retries;  // the token expired (or etcd restarted and forgot it): log in again
        InvalidateToken(c.token_used);
        return Attempt(id);
      }
      if (options_.user.empty()) answer.message += " (etcd requires authentication: configure a user and password)";
      return FinishCall(id, Status::Error(where + answer.message));
    case EtcdVerdict::kRetry:
      return RetryCall(c, where + "HTTP " + std::to_string(answer.status) + ": " + answer.message);
    case EtcdVerdict::kFail:
      break;
  }
  FinishCall(id, Status::Error(where + answer.message));
}

void EtcdClient::RetryCall(Call& c, std::string why) {
  c.last_error = std::move(why);
  ++c.failures;
  NextEndpoint(c.endpoint);
  const Duration left = c.deadline - loop_->Now();
  const uint64_t id = c.id;
  c.timer = loop_->AddTimerAfter(std::max(Duration::zero(), std::min(RetryDelay(c.failures), left)), [this, id] {
    calls_.at(id)->timer = 0;
    Attempt(id);
  });
}

void EtcdClient::FinishCall(uint64_t id, StatusOr<std::string> result) {
  auto it = calls_.find(id);
  if (it == calls_.end()) return;
  std::unique_ptr<Call> c = std::move(it->second);
  calls_.erase(it);
  if (c->timer) loop_->CancelTimer(c->timer);
  if (c->transfer) curl_.Cancel(c->transfer);
  c->done(std::move(result));
}

void EtcdClient::CancelCall(uint64_t id) {
  auto it = calls_.find(id);
  if (it == calls_.end()) return;
  if (it->second->timer) loop_->CancelTimer(it->second->timer);
  if (it->second->transfer) curl_.Cancel(it->second->transfer);
  calls_.erase(it);
}

// --- authentication ------------------------------------------------------------------------------

bool EtcdClient::NeedsToken() const { return !options_.user.empty() && !have_token_; }

void EtcdClient::WaitForToken(TokenWaiter waiter) {
  token_waiters_.push_back(std::move(waiter));
  if (!authenticating_) Authenticate();
}

void EtcdClient::Authenticate() {
  authenticating_ = true;
  Json body = {{"name", options_.user}, {"password", options_.password}};
  Request("/v3/auth/authenticate", body, /*with_token=*/false,
          [this](StatusOr<std::string> answer) { OnAuthenticated(std::move(answer)); });
}

void EtcdClient::OnAuthenticated(StatusOr<std::string> body) {
  authenticating_ = false;
  Status st;
  StatusOr<std::string> answer = body.ok() ? DecodeEtcdAuthToken(*body) : body.status();
  if (answer.ok()) {
    token_ = std::move(*answer);
    have_token_ = true;
  } else if (Has(answer.message(), "authentication is not enabled")) {
    token_.clear();  // the server does not check tokens: go without
    have_token_ = true;
  } else {
    st = Status::Error("etcd authentication as user '" + options_.user + "' failed: " + answer.message());
  }
  std::weak_ptr<bool> alive = alive_;
  for (auto& waiter : std::exchange(token_waiters_, {})) {
    waiter(st);
    if (alive.expired()) return;
  }
}

void EtcdClient::InvalidateToken(const std::string& used) {
  if (have_token_ && token_ == used) {
    have_token_ = false;
    token_.clear();
  }
}

// --- key-value -----------------------------------------------------------------------------------

void EtcdClient::Range(EtcdRangeRequest req, Callback<EtcdRangeResult> done) {
  Json body = KeyRange(req.key, req.prefix);
  if (req.limit > 0) body["limit"] = std::to_string(req.limit);
  if (req.sort_order != EtcdSortOrder::kNone) {
    body["sort_order"] = SortOrderName(req.sort_order);
    body["sort_target"] = SortTargetName(req.sort_target);
  }
  Request("/v3/kv/range", body, true, [done = std::move(done)](StatusOr<std::string> r) {
    if (!r.ok()) return done(r.status());
    done(DecodeEtcdRange(*r));
  });
}

void EtcdClient::Put(std::string key, std::string value, int64_t lease, Callback<int64_t> done) {
  Json body = {{"key", EtcdBase64(key)}, {"value", EtcdBase64(value)}};
  if (lease) body["lease"] = std::to_string(lease);
  Request("/v3/kv/put", body, true, [done = std::move(done)](StatusOr<std::string> r) {
    if (!r.ok()) return done(r.status());
    done(DecodeEtcdRevision(*r));
  });
}

void EtcdClient::CreateIfAbsent(std::string key, std::string value, int64_t lease,
                                Callback<EtcdCreateResult> done) {
  Json put = {{"key", EtcdBase64(key)}, {"value", EtcdBase64(value)}};
  if (lease) put["lease"] = std::to_string(lease);
  Json body = {
      {"compare", Json::array({{{"key", EtcdBase64(key)}, {"target", "CREATE"}, {"result", "EQUAL"}, {"create_revision", "0"}}})},
      {"success", Json::array({{{"request_put", put}}})},
      {"failure", Json::array({{{"request_range", {{"key", EtcdBase64(key)}}}}})},
  };
  Request("/v3/kv/txn", body,
          true, [done = std::move(done), key = std::move(key), value = std::move(value), lease](StatusOr<std::string> r) {
            if (!r.ok()) return done(r.status());
            done(DecodeEtcdCreate(*r, key, value, lease));
          });
}

void EtcdClient::DeleteRange(std::string key, bool prefix, Callback<EtcdDeleteResult> done) {
  Request("/v3/kv/deleterange", KeyRange(key, prefix), true, [done = std::move(done)](StatusOr<std::string> r) {
    if (!r.ok()) return done(r.status());
    done(DecodeEtcdDelete(*r));
  });
}

// --- leases --------------------------------------------------------------------------------------

void EtcdClient::LeaseGrant(int64_t ttl_seconds, Callback<EtcdLease> done) {
  Json body = {{"TTL", std::to_string(ttl_seconds)}};
  Request("/v3/lease/grant", body, true, [done = std::move(done)](StatusOr<std::string> r) {
    if (!r.ok()) return done(r.status());
    done(DecodeEtcdLeaseGrant(*r));
  });
}

void EtcdClient::LeaseRevoke(int64_t lease, Callback<int64_t> done) {
  Json body = {{"ID", std::to_string(lease)}};
  Request("/v3/lease/revoke", body, true, [done = std::move(done)](StatusOr<std::string> r) {
    if (!r.ok() && Has(r.message(), "requested lease not found")) return done(int64_t{0});
    if (!r.ok()) return done(r.status());
    done(DecodeEtcdRevision(*r));
  });
}

void EtcdClient::LeaseKeepAliveOnce(int64_t lease, Callback<int64_t> done) {
  // A bidirectional stream in gRPC; through the gateway one request gets one answer and the end.
  Json body = {{"ID", std::to_string(lease)}};
  Request("/v3/lease/keepalive", body, true, [done = std::move(done), lease](StatusOr<std::string> r) {
    if (!r.ok()) return done(r.status());
    StatusOr<int64_t> ttl = DecodeEtcdKeepAlive(*r);
    if (!ttl.ok()) return done(ttl.status());
    if (*ttl <= 0) return done(Status::Error("etcd lease " + std::to_string(lease) + " expired or was revoked"));
    done(ttl);
  });
}

EtcdClient::KeepAliveId EtcdClient::StartKeepAlive(int64_t lease, Duration interval,
                                                   std::function<void(Status, bool expired)> on_lost) {
  auto k = std::make_unique<KeepAlive>();
  const KeepAliveId id = next_id_++;
  k->lease = lease;
  k->interval = interval;
  k->on_lost = std::move(on_lost);
  k->timer = loop_->AddTimerAfter(interval, [this, id] { KeepAliveTick(id); });
  keepalives_.emplace(id, std::move(k));
  return id;
}

void EtcdClient::StopKeepAlive(KeepAliveId id) {
  auto it = keepalives_.find(id);
  if (it == keepalives_.end()) return;
  if (it->second->timer) loop_->CancelTimer(it->second->timer);
  CancelCall(it->second->call);
  keepalives_.erase(it);
}

void EtcdClient::KeepAliveTick(KeepAliveId id) {
  KeepAlive& k = *keepalives_.at(id);
  k.timer = 0;
  const TimePoint sent = loop_->Now();
  Json body = {{"ID", std::to_string(k.lease)}};
  k.call = Request("/v3/lease/keepalive", body, true, [this, id, sent](StatusOr<std::string> r) {
    auto it = keepalives_.find(id);
    if (it == keepalives_.end()) return;
    KeepAlive& ka = *it->second;
    ka.call = 0;
    StatusOr<int64_t> ttl = r.ok() ? DecodeEtcdKeepAlive(*r) : r.status();
    Status st = ttl.status();
    const bool expired = st.ok() && *ttl <= 0;
    if (expired) st = Status::Error("etcd lease " + std::to_string(ka.lease) + " expired or was revoked");
    if (!st.ok()) {
      auto on_lost = std::move(ka.on_lost);
      keepalives_.erase(it);
      return on_lost(st, expired);
    }
    const Duration wait = std::max(Duration::zero(), sent + ka.interval - loop_->Now());
    ka.timer = loop_->AddTimerAfter(wait, [this, id] { KeepAliveTick(id); });
  });
}

// --- watches -------------------------------------------------------------------------------------

EtcdClient::WatchId EtcdClient::Watch(EtcdWatchRequest request, WatchCallback on_events) {
  auto w = std::make_unique<WatchState>();
  const WatchId id = w->id = next_id_++;
  w->next_revision = request.start_revision;
  w->request = std::move(request);
  w->on_events = std::move(on_events);
  w->timer = loop_->AddTimerAfter(Duration::zero(), [this, id] { AttemptWatch(id); });
  watches_.emplace(id, std::move(w));
  return id;
}

void EtcdClient::CancelWatch(WatchId id) {
  auto it = watches_.find(id);
  if (it == watches_.end()) return;
  if (it->second->timer) loop_->CancelTimer(it->second->timer);
  if (it->second->transfer) curl_.Cancel(it->second->transfer);  // closing the stream ends it in etcd
  watches_.erase(it);
}

void EtcdClient::AttemptWatch(WatchId id) {
  auto it = watches_.find(id);
  if (it == watches_.end()) return;
  WatchState& w = *it->second;
  w.timer = 0;
  if (NeedsToken()) {
    WaitForToken([this, id](const Status& st) {
      if (!st.ok()) return FailWatch(id, st);
      AttemptWatch(id);
    });
    return;
  }
  Json create = KeyRange(w.request.key, w.request.prefix);
  if (w.next_revision > 0) create["start_revision"] = std::to_string(w.next_revision);
  // An idle watch (a round that runs for hours) learns now and then that nothing happened up to
  // a revision, so a reconnect resumes there and not at its creation, which compaction removes.
  create["progress_notify"] = true;
  w.endpoint = current_;
  w.token_used = token_;
  w.buffer.clear();
  HttpRequest r = MakeRequest(w.endpoint, "/v3/watch", Dump(Json{{"create_request", create}}), token_, Duration::zero());
  // Ask the member to end the stream when it loses its leader (a partitioned member would
  // otherwise keep a silent watch open); we then reconnect elsewhere.
  r.headers.push_back("Grpc-Metadata-hasleader: true");
  w.transfer = curl_.Stream(
      std::move(r), [this, id](std::string_view chunk) { OnWatchData(id, chunk); },
      [this, id](HttpResult res) { OnWatchEnd(id, std::move(res)); });
}

void EtcdClient::OnWatchData(WatchId id, std::string_view chunk) {
  auto it = watches_.find(id);
  if (it == watches_.end()) return;
  it->second->buffer.append(chunk);
  // One JSON message per line. Each message may end the watch or the client (user callbacks).
  std::weak_ptr<bool> alive = alive_;
  for (;;) {
    if (alive.expired()) return;
    it = watches_.find(id);
    if (it == watches_.end()) return;
    std::string& buf = it->second->buffer;
    const size_t nl = buf.find('\n');
    if (nl == std::string::npos) return;
    std::string line = buf.substr(0, nl);
    buf.erase(0, nl + 1);
    if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
    if (!OnWatchMessage(id, line)) return;
  }
}

bool EtcdClient::OnWatchMessage(WatchId id, const std::string& line) {
  WatchState& w = *watches_.at(id);
  StatusOr<EtcdWatchMessage> decoded = DecodeEtcdWatchMessage(line);
  if (!decoded.ok()) {
    RetryWatch(w, decoded.message());
    return false;
  }
  EtcdWatchMessage& m = *decoded;
  using Kind = EtcdWatchMessage::Kind;
  switch (m.kind) {
    case Kind::kError:
      RetryWatch(w, "etcd watch stream error: " + m.text, m.token_error);
      return false;
    case Kind::kCanceled:
      if (m.compact_revision > 0 && w.request.on_compacted) {
        EndCompactedWatch(id);
      } else if (m.compact_revision > 0) {
        FailWatch(id, Status::Error("etcd watch on " + w.request.key + ": revision " + std::to_string(w.next_revision) +
                                    " was compacted (oldest kept: " + std::to_string(m.compact_revision) + ")"));
      } else if (Has(m.text, "permission denied")) {
        FailWatch(id, Status::Error("etcd watch on " + w.request.key + ": " + m.text));
      } else {
        RetryWatch(w, "etcd canceled the watch: " + m.text, m.token_error);
      }
      return false;
    case Kind::kCreated:
      w.failures = 0;
      w.auth_retries = 0;
      if (w.next_revision == 0) w.next_revision = m.revision + 1;  // "from now" is now pinned
      return true;
    case Kind::kProgress:
      // Every event up to its revision has been sent.
      if (w.next_revision > 0) w.next_revision = std::max(w.next_revision, m.revision + 1);
      return true;
    case Kind::kEvents:
      break;
  }
  for (const EtcdWatchEvent& e : m.events) w.next_revision = std::max(w.next_revision, e.kv.mod_revision + 1);
  DeliverEvents(id, std::move(m.events));
  return true;  // OnWatchData looks the watch up again
}

void EtcdClient::DeliverEvents(WatchId id, std::vector<EtcdWatchEvent> events) {
  WatchCallback cb = watches_.at(id)->on_events;  // a copy: the callback may cancel its watch
  cb(std::move(events));
}

void EtcdClient::OnWatchEnd(WatchId id, HttpResult res) {
  auto it = watches_.find(id);
  if (it == watches_.end()) return;
  WatchState& w = *it->second;
  w.transfer = 0;
  if (!res.error.ok()) {
    if (res.permanent) return FailWatch(id, res.error);
    return RetryWatch(w, res.error.message());
  }
  if (res.status == 200) return RetryWatch(w, "etcd closed the watch stream");
  const std::string msg = "HTTP " + std::to_string(res.status) + ": " + EtcdErrorMessage(res.body);
  const bool auth = IsEtcdTokenError(res.status, msg);
  if (auth || res.status >= 500 || res.status == 429) return RetryWatch(w, msg, auth);
  FailWatch(id, Status::Error("etcd watch on " + w.request.key + " at " + endpoints_[w.endpoint] + ": " + msg));
}

void EtcdClient::RetryWatch(WatchState& w, std::string why, bool auth_failed) {
  if (w.transfer) curl_.Cancel(w.transfer);
  w.transfer = 0;
  w.buffer.clear();
  const WatchId id = w.id;
  if (auth_failed) {
    if (options_.user.empty() || w.auth_retries >= 3) {
      if (options_.user.empty()) why += " (etcd requires authentication: configure a user and password)";
      return FailWatch(id, Status::Error("etcd watch on " + w.request.key + ": " + why));
    }
    ++w.auth_retries;
    InvalidateToken(w.token_used);
    w.timer = loop_->AddTimerAfter(Duration::zero(), [this, id] { AttemptWatch(id); });
    return;
  }
  const TimePoint now = loop_->Now();
  if (w.failures == 0) w.outage_deadline = now + options_.retry_deadline;
  ++w.failures;
  NextEndpoint(w.endpoint);
  if (now >= w.outage_deadline) {
    return FailWatch(id, Status::Error("etcd watch on " + w.request.key + " failed for " +
                                       SecondsText(options_.retry_deadline) + " on " + Describe() +
                                       "; last error: " + why));
  }
  const Duration delay = std::min(RetryDelay(w.failures), w.outage_deadline - now);
  w.timer = loop_->AddTimerAfter(delay, [this, id] { AttemptWatch(id); });
}

std::unique_ptr<EtcdClient::WatchState> EtcdClient::RemoveWatch(WatchId id) {
  auto it = watches_.find(id);
  if (it == watches_.end()) return nullptr;
  std::unique_ptr<WatchState> w = std::move(it->second);
  watches_.erase(it);
  if (w->timer) loop_->CancelTimer(w->timer);
  if (w->transfer) curl_.Cancel(w->transfer);
  return w;
}

void EtcdClient::EndCompactedWatch(WatchId id) {
  if (std::unique_ptr<WatchState> w = RemoveWatch(id)) w->request.on_compacted();
}

void EtcdClient::FailWatch(WatchId id, Status why) {
  if (std::unique_ptr<WatchState> w = RemoveWatch(id)) w->on_events(std::move(why));
}

}  // namespace ctrun::rdzv
