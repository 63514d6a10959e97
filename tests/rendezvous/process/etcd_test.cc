// CurlLoop, EtcdClient and EtcdLog against real etcd servers the tests start on loopback
// (etcd_fixture.h): key-value calls, create-if-absent races, watches, leases, the rendezvous log's
// contract, failover when the leader of a 3-member cluster dies, an etcd restart, user/password
// authentication and TLS with client certificates.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "rendezvous/curl_loop.h"
#include "rendezvous/etcd_client.h"
#include "rendezvous/etcd_log.h"
#include "rendezvous/process/etcd_fixture.h"

namespace ctrun::rdzv {
namespace {

using namespace std::chrono_literals;
using ctrun::testing::Await;
using ctrun::testing::EtcdCluster;
using ctrun::testing::EtcdClusterOptions;
using ctrun::testing::RunFor;
using ctrun::testing::RunUntil;

using Events = std::vector<EtcdWatchEvent>;

class EtcdTest : public ::testing::Test {
 public:  // also used by the scenario functions below
  void SetUp() override {
    if (!ctrun::testing::EtcdAvailable())
      GTEST_SKIP() << "etcd is not installed at /usr/bin/etcd (Debian package etcd-server): etcd tests skipped";
  }

  ::testing::AssertionResult StartCluster(EtcdClusterOptions options = {}) {
    cluster_ = std::make_unique<EtcdCluster>(std::move(options));
    Status st = cluster_->Start();
    if (!st.ok()) return ::testing::AssertionFailure() << st.message();
    return ::testing::AssertionSuccess();
  }

  EtcdOptions Options() const {
    EtcdOptions o;
    o.endpoints = cluster_->endpoints();
    o.tls = cluster_->client_tls();
    o.retry_deadline = Seconds(20);
    return o;
  }

  std::unique_ptr<EtcdClient> Client(EtcdOptions o) {
    auto c = EtcdClient::Create(&loop_, std::move(o));
    EXPECT_TRUE(c.ok()) << c.message();
    return c.ok() ? std::move(*c) : nullptr;
  }
  std::unique_ptr<EtcdClient> Client() { return Client(Options()); }

  std::unique_ptr<EtcdLog> Log(const std::string& run_id, EtcdOptions o) {
    EtcdLogOptions lo;
    lo.etcd = std::move(o);
    lo.run_id = run_id;
    auto log = EtcdLog::Create(&loop_, std::move(lo));
    EXPECT_TRUE(log.ok()) << log.message();
    return log.ok() ? std::move(*log) : nullptr;
  }
  std::unique_ptr<EtcdLog> Log(const std::string& run_id) { return Log(run_id, Options()); }

  // Synchronous wrappers (the loop runs until the answer is there).
  StatusOr<EtcdRangeResult> Range(EtcdClient& c, EtcdRangeRequest req) {
    return Await<EtcdRangeResult>(loop_, [&](auto cb) { c.Range(req, cb); });
  }
  StatusOr<EtcdRangeResult> Get(EtcdClient& c, const std::string& key) {
    EtcdRangeRequest req;
    req.key = key;
    return Range(c, req);
  }
  StatusOr<int64_t> Put(EtcdClient& c, const std::string& key, const std::string& value, int64_t lease = 0) {
    return Await<int64_t>(loop_, [&](auto cb) { c.Put(key, value, lease, cb); });
  }
  StatusOr<EtcdDeleteResult> Delete(EtcdClient& c, const std::string& key, bool prefix) {
    return Await<EtcdDeleteResult>(loop_, [&](auto cb) { c.DeleteRange(key, prefix, cb); });
  }
  StatusOr<EtcdLease> Grant(EtcdClient& c, int64_t ttl) {
    return Await<EtcdLease>(loop_, [&](auto cb) { c.LeaseGrant(ttl, cb); });
  }
  StatusOr<LogEntry> Head(EtcdLog& log, const std::string& initial) {
    return Await<LogEntry>(loop_, [&](auto cb) { log.Head(initial, cb); });
  }
  StatusOr<AppendResult> Append(EtcdLog& log, uint64_t index, const std::string& value) {
    return Await<AppendResult>(loop_, [&](auto cb) { log.Append(index, value, cb); });
  }

  double Since(TimePoint t) const { return ToSeconds(loop_.Now() - t); }

  // The set-up of the outage tests: `writer` alive (500 ms refreshes, 5 s deadline) with `more`,
  // a reader that watches them all, a log of init and entry 1, and the reader waiting for
  // entry 2 (its watch open). Not movable: the callbacks hold its address.
  struct WatchedLog {
    std::unique_ptr<EtcdLog> writer, reader;
    std::vector<std::unique_ptr<EtcdLog>> more;  // further live members, as named
    std::vector<std::string> lost;                // what the reader reported lost
    std::optional<StatusOr<std::string>> got;     // the reader's entry 2
  };
  ::testing::AssertionResult StartWatchedLog(const std::string& run_id, const std::vector<std::string>& more,
                                             WatchedLog* w) {
    w->writer = Log(run_id);
    w->reader = Log(run_id);
    LivenessOptions live;
    live.interval = 500ms;
    live.deadline = 5s;
    w->reader->SetOnLost([w](const std::string& id) { w->lost.push_back(id); });
    w->writer->StartLiveness("writer", live);
    std::vector<std::string> members{"writer"};
    for (const std::string& id : more) {
      w->more.push_back(Log(run_id));
      w->more.back()->StartLiveness(id, live);
      members.push_back(id);
    }
    w->reader->WatchMembers(members);
    if (!Head(*w->writer, "init").ok()) return ::testing::AssertionFailure() << "head";
    if (!Append(*w->writer, 1, "before").ok()) return ::testing::AssertionFailure() << "append 1";
    w->reader->Wait(2, [w](StatusOr<std::string> v) { w->got.emplace(std::move(v)); });
    RunFor(loop_, 300ms);  // the wait is watching now
    return ::testing::AssertionSuccess();
  }

  EventLoop loop_;
  std::unique_ptr<EtcdCluster> cluster_;
};

// --- CurlLoop ------------------------------------------------------------------------------------

TEST_F(EtcdTest, CurlLoopRunsCallbacksFromTheLoopOnlyAndNeverAfterCancelOrDestroy) {
  ASSERT_TRUE(StartCluster());
  auto curl = std::make_unique<CurlLoop>(&loop_);
  HttpRequest req;
  req.url = cluster_->endpoint(0) + "/v3/kv/range";
  req.body = R"({"key":"eA=="})";
  req.headers = {"Content-Type: application/json"};
  req.timeout = Seconds(5);

  std::optional<HttpResult> first;
  curl->Post(req, [&](HttpResult r) { first = std::move(r); });
  EXPECT_FALSE(first) << "a callback ran inside Post";
  ASSERT_TRUE(RunUntil(loop_, [&] { return first.has_value(); }, 10s));
  EXPECT_TRUE(first->error.ok()) << first->error.message();
  EXPECT_EQ(first->status, 200);
  EXPECT_NE(first->body.find("\"header\""), std::string::npos) << first->body;

  bool cancelled_ran = false, other_ran = false;
  auto id = curl->Post(req, [&](HttpResult) { cancelled_ran = true; });
  curl->Post(req, [&](HttpResult) { other_ran = true; });
  curl->Cancel(id);
  ASSERT_TRUE(RunUntil(loop_, [&] { return other_ran; }, 10s));
  EXPECT_FALSE(cancelled_ran);
  EXPECT_EQ(curl->active(), 0u);

  // A callback destroys the CurlLoop: the other transfer's callback never runs.
  int calls = 0;
  for (int i = 0; i < 3; ++i)
    curl->Post(req, [&](HttpResult) {
      ++calls;
      curl.reset();
    });
  ASSERT_TRUE(RunUntil(loop_, [&] { return curl == nullptr; }, 10s));
  RunFor(loop_, 300ms);
  EXPECT_EQ(calls, 1);

  // No server: a transport error (retryable), not an HTTP status.
  CurlLoop other(&loop_);
  req.url = "http://127.0.0.1:" + std::to_string(ctrun::testing::FreePort()) + "/v3/kv/range";
  std::optional<HttpResult> refused;
  other.Post(req, [&](HttpResult r) { refused = std::move(r); });
  ASSERT_TRUE(RunUntil(loop_, [&] { return refused.has_value(); }, 10s));
  EXPECT_FALSE(refused->error.ok());
  EXPECT_FALSE(refused->permanent);
  EXPECT_EQ(refused->status, 0);
  EXPECT_NE(refused->error.message().find("POST http://127.0.0.1:"), std::string::npos) << refused->error.message();
}

TEST_F(EtcdTest, CurlLoopStreamsChunksAsTheyArrive) {
  ASSERT_TRUE(StartCluster());
  CurlLoop curl(&loop_);
  HttpRequest req;
  req.url = cluster_->endpoint(0) + "/v3/watch";
  req.body = R"({"create_request":{"key":"cQ=="}})";  // key "q"
  req.headers = {"Content-Type: application/json"};
  std::string streamed;
  bool done = false;
  auto id = curl.Stream(req, [&](std::string_view chunk) { streamed.append(chunk); }, [&](HttpResult) { done = true; });
  ASSERT_TRUE(RunUntil(loop_, [&] { return streamed.find("\"created\":true") != std::string::npos; }, 10s)) << streamed;
  auto client = Client();
  ASSERT_TRUE(Put(*client, "q", "streamed").ok());
  // "streamed" in base64: the event arrives while the response is still open.
  ASSERT_TRUE(RunUntil(loop_, [&] { return streamed.find("c3RyZWFtZWQ=") != std::string::npos; }, 10s)) << streamed;
  EXPECT_FALSE(done);
  curl.Cancel(id);
  RunFor(loop_, 100ms);
  EXPECT_FALSE(done);
}

// --- EtcdClient ----------------------------------------------------------------------------------

TEST_F(EtcdTest, ClientPutRangeDeleteRoundTripBinaryValues) {
  ASSERT_TRUE(StartCluster());
  auto c = Client();
  std::string binary;
  for (int i = 0; i < 256; ++i) binary += static_cast<char>(i);
  ASSERT_TRUE(Put(*c, "t/a", "1").ok());
  ASSERT_TRUE(Put(*c, "t/b", binary).ok());
  auto put = Put(*c, "t/c", "3");
  ASSERT_TRUE(put.ok()) << put.message();
  ASSERT_TRUE(Put(*c, "u/a", "x").ok());

  EtcdRangeRequest all;
  all.key = "t/";
  all.prefix = true;
  auto r = Range(*c, all);
  ASSERT_TRUE(r.ok()) << r.message();
  ASSERT_EQ(r->kvs.size(), 3u);
  EXPECT_EQ(r->kvs[0].key, "t/a");
  EXPECT_EQ(r->kvs[1].value, binary);
  EXPECT_EQ(r->kvs[2].mod_revision, *put);
  EXPECT_EQ(r->count, 3);
  EXPECT_GE(r->revision, *put);

  EtcdRangeRequest newest = all;
  newest.limit = 1;
  newest.sort_order = EtcdSortOrder::kDescend;
  newest.sort_target = EtcdSortTarget::kKey;
  r = Range(*c, newest);
  ASSERT_TRUE(r.ok()) << r.message();
  ASSERT_EQ(r->kvs.size(), 1u);
  EXPECT_EQ(r->kvs[0].key, "t/c");
  EXPECT_TRUE(r->more);
  EXPECT_EQ(r->count, 3);

  r = Get(*c, "t/none");
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_TRUE(r->kvs.empty());
  EXPECT_GT(r->revision, 0);

  auto d = Delete(*c, "t/b", false);
  ASSERT_TRUE(d.ok()) << d.message();
  EXPECT_EQ(d->deleted, 1);
  d = Delete(*c, "t/", true);
  ASSERT_TRUE(d.ok()) << d.message();
  EXPECT_EQ(d->deleted, 2);
  r = Get(*c, "u/a");
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->kvs.size(), 1u);
  EXPECT_EQ(r->kvs[0].value, "x");
  EXPECT_EQ(EtcdPrefixEnd("a\xff\xff"), "b");
  EXPECT_EQ(EtcdPrefixEnd("\xff"), std::string(1, '\0'));
}

TEST_F(EtcdTest, CreateIfAbsentRaceHasExactlyOneWinner) {
  ASSERT_TRUE(StartCluster());
  constexpr int kClients = 8;
  std::vector<std::unique_ptr<EtcdClient>> clients;
  for (int i = 0; i < kClients; ++i) clients.push_back(Client());
  for (int round = 0; round < 5; ++round) {
    const std::string key = "race/" + std::to_string(round);
    std::vector<std::optional<StatusOr<EtcdCreateResult>>> results(kClients);
    for (int i = 0; i < kClients; ++i)
      clients[i]->CreateIfAbsent(key, "v" + std::to_string(i), 0,
                                 [&results, i](StatusOr<EtcdCreateResult> r) { results[i].emplace(std::move(r)); });
    ASSERT_TRUE(RunUntil(
        loop_, [&] { return std::all_of(results.begin(), results.end(), [](auto& r) { return r.has_value(); }); },
        20s));
    int winners = 0;
    std::string winner_value;
    for (int i = 0; i < kClients; ++i) {
      ASSERT_TRUE(results[i]->ok()) << results[i]->message();
      if ((*results[i])->created) {
        ++winners;
        winner_value = "v" + std::to_string(i);
      }
    }
    ASSERT_EQ(winners, 1) << key;
    for (int i = 0; i < kClients; ++i) EXPECT_EQ((*results[i])->kv.value, winner_value);
  }
}

TEST_F(EtcdTest, WatchDeliversLaterPutsAndDeletesFromARevisionAndStopsOnCancel) {
  ASSERT_TRUE(StartCluster());
  auto c = Client();
  auto start = Get(*c, "w/k");
  ASSERT_TRUE(start.ok()) << start.message();

  Events seen;
  std::optional<Status> error;
  auto record = [](Events* out, std::optional<Status>* err) {
    return [out, err](StatusOr<Events> r) {
      if (r.ok())
        out->insert(out->end(), r->begin(), r->end());
      else
        err->emplace(r.status());
    };
  };
  auto id = c->Watch({"w/k", false, start->revision + 1}, record(&seen, &error));
  Events prefix_seen;
  c->Watch({"w/", true, start->revision + 1}, record(&prefix_seen, &error));
  ASSERT_TRUE(Put(*c, "w/k", "one").ok());
  ASSERT_TRUE(Put(*c, "w/other", "o").ok());
  ASSERT_TRUE(Delete(*c, "w/k", false).ok());
  ASSERT_TRUE(RunUntil(loop_, [&] { return seen.size() >= 2 && prefix_seen.size() >= 3; }, 10s));
  ASSERT_FALSE(error) << error->message();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].type, EtcdEventType::kPut);
  EXPECT_EQ(seen[0].kv.value, "one");
  EXPECT_EQ(seen[1].type, EtcdEventType::kDelete);
  EXPECT_EQ(seen[1].kv.key, "w/k");
  EXPECT_EQ(prefix_seen[1].kv.key, "w/other");

  c->CancelWatch(id);
  Events after;
  auto now = Get(*c, "w/k");
  ASSERT_TRUE(now.ok());
  c->Watch({"w/k", false, now->revision + 1}, record(&after, &error));
  ASSERT_TRUE(Put(*c, "w/k", "two").ok());
  ASSERT_TRUE(RunUntil(loop_, [&] { return !after.empty(); }, 10s));
  EXPECT_EQ(after[0].kv.value, "two");
  EXPECT_EQ(seen.size(), 2u) << "a cancelled watch delivered events";

  // From an old revision: the history is replayed.
  Events replay;
  c->Watch({"w/k", false, start->revision + 1}, record(&replay, &error));
  ASSERT_TRUE(RunUntil(loop_, [&] { return replay.size() >= 3; }, 10s));
  EXPECT_EQ(replay[0].kv.value, "one");
  EXPECT_EQ(replay[2].kv.value, "two");
}

TEST_F(EtcdTest, LeaseExpiryDeletesKeysAndKeepAliveHoldsThem) {
  ASSERT_TRUE(StartCluster());
  auto c = Client();
  auto brief = Grant(*c, 1);
  auto held = Grant(*c, 1);
  ASSERT_TRUE(brief.ok()) << brief.message();
  ASSERT_TRUE(held.ok()) << held.message();
  EXPECT_EQ(brief->ttl, 1);  // allowed by the fixture's 500 ms election timeout
  bool lost = false;
  Status lost_why;
  auto ka = c->StartKeepAlive(held->id, 250ms, [&](Status st, bool) {
    lost = true;
    lost_why = st;
  });
  ASSERT_TRUE(Put(*c, "l/held", "h", held->id).ok());
  auto put = Put(*c, "l/brief", "b", brief->id);
  ASSERT_TRUE(put.ok());
  const TimePoint t0 = loop_.Now();

  std::map<std::string, TimePoint> deleted;
  c->Watch({"l/", true, *put + 1}, [&](StatusOr<Events> r) {
    ASSERT_TRUE(r.ok()) << r.message();
    for (auto& e : *r)
      if (e.type == EtcdEventType::kDelete) deleted.emplace(e.kv.key, loop_.Now());
  });
  ASSERT_TRUE(RunUntil(loop_, [&] { return deleted.count("l/brief"); }, 10s));
  const double expired_after = ToSeconds(deleted["l/brief"] - t0);
  EXPECT_GT(expired_after, 0.5);
  EXPECT_LT(expired_after, 3.0);
  std::printf("lease TTL 1 s: key deleted %.2f s after the put\n", expired_after);

  RunFor(loop_, 2s);  // the kept-alive lease outlives its TTL several times over
  EXPECT_FALSE(deleted.count("l/held"));
  EXPECT_FALSE(lost) << lost_why.message();
  auto r = Get(*c, "l/held");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->kvs.size(), 1u);

  auto once = Await<int64_t>(loop_, [&](auto cb) { c->LeaseKeepAliveOnce(brief->id, cb); });
  ASSERT_FALSE(once.ok());
  EXPECT_NE(once.message().find("expired"), std::string::npos) << once.message();

  // Revoked under a running keepalive: the key goes at once, on_lost reports it.
  auto revoked = Await<int64_t>(loop_, [&](auto cb) { c->LeaseRevoke(held->id, cb); });
  ASSERT_TRUE(revoked.ok()) << revoked.message();
  ASSERT_TRUE(RunUntil(loop_, [&] { return deleted.count("l/held") && lost; }, 5s));
  EXPECT_NE(lost_why.message().find("expired or was revoked"), std::string::npos) << lost_why.message();
  c->StopKeepAlive(ka);  // after on_lost: a no-op
}

TEST_F(EtcdTest, DestroyingTheClientOrLogInsideACallbackIsSafe) {
  ASSERT_TRUE(StartCluster());
  auto c = Client();
  auto start = Get(*c, "d/k");
  ASSERT_TRUE(start.ok());
  int calls = 0;
  for (int i = 0; i < 3; ++i)  // three watches see the same put; the first callback ends them all
    c->Watch({"d/k", false, start->revision + 1}, [&](StatusOr<Events>) {
      ++calls;
      c.reset();
    });
  auto writer = Client();
  RunFor(loop_, 200ms);
  ASSERT_TRUE(Put(*writer, "d/k", "x").ok());
  ASSERT_TRUE(RunUntil(loop_, [&] { return c == nullptr; }, 10s));
  RunFor(loop_, 300ms);
  EXPECT_EQ(calls, 1);

  auto log = Log("destroy");
  int appended = 0;
  for (uint64_t i = 0; i < 3; ++i)
    log->Append(i, "v", [&](StatusOr<AppendResult>) {
      ++appended;
      log.reset();
    });
  ASSERT_TRUE(RunUntil(loop_, [&] { return log == nullptr; }, 10s));
  RunFor(loop_, 300ms);
  EXPECT_EQ(appended, 1);
}

// --- EtcdLog -------------------------------------------------------------------------------------

TEST_F(EtcdTest, LogHeadAppendWaitFollowTheContractAcrossTwoInstances) {
  ASSERT_TRUE(StartCluster());
  auto a = Log("job1");
  auto b = Log("job1");
  EXPECT_EQ(a->Describe(), "etcd at " + cluster_->endpoints_csv());

  // Empty log: both race to create entry 0 and agree on it.
  std::optional<StatusOr<LogEntry>> ha, hb;
  a->Head("init-a", [&](StatusOr<LogEntry> r) { ha.emplace(std::move(r)); });
  b->Head("init-b", [&](StatusOr<LogEntry> r) { hb.emplace(std::move(r)); });
  EXPECT_FALSE(ha || hb) << "a callback ran inside Head";
  ASSERT_TRUE(RunUntil(loop_, [&] { return ha && hb; }, 10s));
  ASSERT_TRUE(ha->ok() && hb->ok());
  EXPECT_EQ((*ha)->index, 0u);
  EXPECT_EQ((*hb)->index, 0u);
  EXPECT_EQ((*ha)->value, (*hb)->value);
  EXPECT_TRUE((*ha)->value == "init-a" || (*ha)->value == "init-b");

  // Racing appends: one winner, one value for everyone.
  std::optional<StatusOr<AppendResult>> ra, rb;
  a->Append(1, "a1", [&](StatusOr<AppendResult> r) { ra.emplace(std::move(r)); });
  b->Append(1, "b1", [&](StatusOr<AppendResult> r) { rb.emplace(std::move(r)); });
  ASSERT_TRUE(RunUntil(loop_, [&] { return ra && rb; }, 10s));
  ASSERT_TRUE(ra->ok() && rb->ok());
  EXPECT_NE((*ra)->won, (*rb)->won);
  const std::string winner = (*ra)->won ? "a1" : "b1";
  EXPECT_EQ((*ra)->value, winner);
  EXPECT_EQ((*rb)->value, winner);
  auto late = Append(*a, 1, "late");
  ASSERT_TRUE(late.ok());
  EXPECT_FALSE(late->won);
  EXPECT_EQ(late->value, winner);

  // Wait on an existing entry: answered, but never inside the call.
  std::optional<StatusOr<std::string>> existing;
  b->Wait(1, [&](StatusOr<std::string> v) { existing.emplace(std::move(v)); });
  EXPECT_FALSE(existing);
  ASSERT_TRUE(RunUntil(loop_, [&] { return existing.has_value(); }, 10s));
  ASSERT_TRUE(existing->ok());
  EXPECT_EQ(**existing, winner);

  // A new Wait replaces the old one, whose callback never runs.
  int replaced_calls = 0;
  std::optional<StatusOr<std::string>> waited;
  b->Wait(2, [&](StatusOr<std::string>) { ++replaced_calls; });
  RunFor(loop_, 200ms);  // let the first wait reach its watch
  b->Wait(2, [&](StatusOr<std::string> v) { waited.emplace(std::move(v)); });
  RunFor(loop_, 200ms);
  EXPECT_FALSE(waited);
  ASSERT_TRUE(Append(*a, 2, "two").ok());
  ASSERT_TRUE(RunUntil(loop_, [&] { return waited.has_value(); }, 10s));
  ASSERT_TRUE(waited->ok()) << waited->message();
  EXPECT_EQ(**waited, "two");
  RunFor(loop_, 200ms);
  EXPECT_EQ(replaced_calls, 0);

  auto head = Head(*b, "unused");
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(head->index, 2u);
  EXPECT_EQ(head->value, "two");

  auto other_run = Log("job2");
  auto other_head = Head(*other_run, "job2-init");
  ASSERT_TRUE(other_head.ok());
  EXPECT_EQ(other_head->index, 0u);
  EXPECT_EQ(other_head->value, "job2-init");
}

TEST_F(EtcdTest, LogKeepsTheNewest64EntriesAndALateReaderIsToldSo) {
  ASSERT_TRUE(StartCluster());
  auto log = Log("compact");
  ASSERT_TRUE(Head(*log, "e0").ok());
  for (uint64_t i = 1; i <= 70; ++i) {
    auto r = Append(*log, i, "e" + std::to_string(i));
    ASSERT_TRUE(r.ok() && r->won) << i;
  }
  std::string oldest;
  const TimePoint deadline = loop_.Now() + 10s;
  while (oldest != kCompactedEntry && loop_.Now() < deadline) {  // the puts are fire-and-forget
    auto r = Get(log->client(), log->EntryKey(6));
    ASSERT_TRUE(r.ok() && r->kvs.size() == 1);
    oldest = r->kvs.front().value;
  }
  EXPECT_EQ(oldest, kCompactedEntry);
  auto kept = Get(log->client(), log->EntryKey(7));
  ASSERT_TRUE(kept.ok() && kept->kvs.size() == 1u);
  EXPECT_EQ(kept->kvs.front().value, "e7");
  EXPECT_EQ(log->EntryKey(7), "/torchelastic/p2p/compact/log/00000000000000000007");

  // An agent that fell behind: its Append to a compacted index creates nothing, its Wait ends.
  auto late = Append(*log, 6, "late");
  ASSERT_TRUE(late.ok()) << late.message();
  EXPECT_FALSE(late->won);
  EXPECT_EQ(late->value, kCompactedEntry);
  auto waited = Await<std::string>(loop_, [&](auto cb) { log->Wait(6, cb); });
  ASSERT_TRUE(waited.ok()) << waited.message();
  EXPECT_EQ(*waited, kCompactedEntry);
  auto head = Head(*log, "unused");
  ASSERT_TRUE(head.ok());
  EXPECT_EQ(head->index, 70u);
}

TEST_F(EtcdTest, LogReportsMembersLostAfterTheirDeadlineAndRevokedAtOnce) {
  ASSERT_TRUE(StartCluster());
  LivenessOptions opts;
  opts.interval = 250ms;
  opts.deadline = 1s;
  auto a = Log("live"), b = Log("live"), c = Log("live");
  std::map<std::string, int> reports;
  std::map<std::string, TimePoint> reported_at;
  b->SetOnLost([&](const std::string& id) {
    ++reports[id];
    reported_at.emplace(id, loop_.Now());
  });
  a->StartLiveness("a", opts);
  b->StartLiveness("b", opts);
  c->StartLiveness("c", opts);
  EtcdRangeRequest alive;
  alive.key = b->AliveKey("");
  alive.prefix = true;
  ASSERT_TRUE(RunUntil(loop_, [&] {
    auto r = Range(b->client(), alive);
    return r.ok() && r->kvs.size() == 3;
  }, 10s));

  const TimePoint watched = loop_.Now();
  b->WatchMembers({"a", "b", "c", "ghost"});
  ASSERT_TRUE(RunUntil(loop_, [&] { return reports.count("ghost"); }, 5s));
  const double ghost_after = ToSeconds(reported_at["ghost"] - watched);
  EXPECT_GE(ghost_after, 0.95);
  EXPECT_LT(ghost_after, 2.0);

  RunFor(loop_, 2500ms);  // > TTL + etcd's expiry sweep: live members are not reported
  EXPECT_EQ(reports.size(), 1u);

  // When a's last periodic refresh reached etcd is unknown (one can slip under load), so the
  // test refreshes a's lease once itself after stopping them: etcd resets it to `ttl` at some
  // moment after `refreshed`, and a must not be reported lost before that TTL has run out.
  EtcdRangeRequest a_key;
  a_key.key = b->AliveKey("a");
  auto a_alive = Range(b->client(), a_key);
  ASSERT_TRUE(a_alive.ok() && a_alive->kvs.size() == 1u);
  a->StopLiveness();
  const TimePoint refreshed = loop_.Now();
  auto ttl = Await<int64_t>(loop_, [&](auto cb) {
    b->client().LeaseKeepAliveOnce(a_alive->kvs[0].lease, cb);
  });
  ASSERT_TRUE(ttl.ok()) << ttl.message();
  ASSERT_GE(*ttl, 1);
  ASSERT_TRUE(RunUntil(loop_, [&] { return reports.count("a"); }, 6s));
  const double a_after = ToSeconds(reported_at["a"] - refreshed);
  EXPECT_GE(a_after, static_cast<double>(*ttl) - 0.05);  // etcd's clock against ours
  EXPECT_LT(a_after, static_cast<double>(*ttl) + 2.0);
  std::printf("deadline 1 s: lease TTL %lld s, stopped member reported lost %.2f s after its "
              "last refresh\n", static_cast<long long>(*ttl), a_after);

  std::optional<Status> revoked;
  const TimePoint revoking = loop_.Now();
  c->RevokeLiveness([&](Status st) { revoked = st; });
  ASSERT_TRUE(RunUntil(loop_, [&] { return revoked && reports.count("c"); }, 5s));
  EXPECT_TRUE(revoked->ok()) << revoked->message();
  EXPECT_LT(ToSeconds(reported_at["c"] - revoking), 0.9);

  RunFor(loop_, 1500ms);
  EXPECT_EQ(reports, (std::map<std::string, int>{{"a", 1}, {"c", 1}, {"ghost", 1}}));
}

// --- failures and recovery -----------------------------------------------------------------------

// A writer appends and a reader waits for each entry while the leader of a 3-member cluster is
// killed; both also keep leases alive and the reader watches the writer. With default client
// options a step costs at most about one request_timeout (2 s) across the leader change.
void LeaderKillScenario(EtcdTest& t, bool clients_start_on_leader) {
  EtcdClusterOptions three;
  three.members = 3;
  ASSERT_TRUE(t.StartCluster(three));
  EtcdCluster& cluster = *t.cluster_;
  EventLoop& loop = t.loop_;
  const int leader = cluster.Leader();
  ASSERT_GE(leader, 0);
  EtcdOptions o = t.Options();
  o.endpoints.clear();
  for (int i = 0; i < 3; ++i)
    if (i != leader) o.endpoints.push_back(cluster.endpoint(i));
  if (clients_start_on_leader)
    o.endpoints.insert(o.endpoints.begin(), cluster.endpoint(leader));
  else
    o.endpoints.push_back(cluster.endpoint(leader));
  auto writer = t.Log("ha", o);
  auto reader = t.Log("ha", o);
  LivenessOptions live;
  live.interval = 500ms;
  live.deadline = 5s;
  std::vector<std::string> lost;
  reader->SetOnLost([&](const std::string& id) { lost.push_back(id); });
  writer->StartLiveness("writer", live);
  reader->StartLiveness("reader", live);
  reader->WatchMembers({"writer"});
  ASSERT_TRUE(t.Head(*writer, "init").ok());

  double worst_after_kill = 0;
  for (uint64_t i = 1; i <= 25; ++i) {
    if (i == 11) cluster.Kill(leader);
    const TimePoint start = loop.Now();
    std::optional<StatusOr<std::string>> got;
    std::optional<StatusOr<AppendResult>> put;
    reader->Wait(i, [&](StatusOr<std::string> v) { got.emplace(std::move(v)); });
    writer->Append(i, "v" + std::to_string(i), [&](StatusOr<AppendResult> r) { put.emplace(std::move(r)); });
    ASSERT_TRUE(RunUntil(loop, [&] { return got && put; }, 30s)) << "step " << i;
    ASSERT_TRUE(put->ok()) << put->message();
    ASSERT_TRUE(got->ok()) << got->message();
    EXPECT_TRUE((*put)->won);
    EXPECT_EQ(**got, "v" + std::to_string(i));
    if (i >= 11) worst_after_kill = std::max(worst_after_kill, t.Since(start));
  }
  std::printf("clients on the %s: worst step after the leader was killed: %.2f s\n",
              clients_start_on_leader ? "leader" : "followers", worst_after_kill);
  EXPECT_LT(worst_after_kill, 6.0);
  EXPECT_NE(writer->client().current_endpoint(), cluster.endpoint(leader));
  RunFor(loop, 1s);
  EXPECT_TRUE(lost.empty()) << lost.front();
}

TEST_F(EtcdTest, ThreeMemberClusterKeepsServingWhenTheLeaderUnderTheClientsIsKilled) {
  LeaderKillScenario(*this, true);
}

TEST_F(EtcdTest, ThreeMemberClusterKeepsServingWhenTheLeaderBehindTheClientsIsKilled) {
  LeaderKillScenario(*this, false);
}

TEST_F(EtcdTest, ClientRecoversWhenEtcdRestartsWithItsData) {
  ASSERT_TRUE(StartCluster());
  WatchedLog w;
  ASSERT_TRUE(StartWatchedLog("restart", {}, &w));
  auto& writer = w.writer;
  auto& got = w.got;
  const std::vector<std::string>& lost = w.lost;

  cluster_->Kill(0);
  std::optional<StatusOr<AppendResult>> put;
  writer->Append(2, "during-outage", [&](StatusOr<AppendResult> r) { put.emplace(std::move(r)); });
  RunFor(loop_, 1s);
  EXPECT_FALSE(put) << "an append succeeded with etcd down";
  EXPECT_FALSE(got);
  Status st = cluster_->Restart(0);
  ASSERT_TRUE(st.ok()) << st.message();

  ASSERT_TRUE(RunUntil(loop_, [&] { return got && put; }, 30s));
  ASSERT_TRUE(put->ok()) << put->message();
  EXPECT_TRUE((*put)->won);
  ASSERT_TRUE(got->ok()) << got->message();
  EXPECT_EQ(**got, "during-outage");
  auto next = Append(*writer, 3, "after");
  ASSERT_TRUE(next.ok()) << next.message();
  EXPECT_TRUE(next->won);
  RunFor(loop_, 1s);
  EXPECT_TRUE(lost.empty()) << "the lease did not survive the restart";
}

// The watches resume at the revision they last knew; an etcd that compacted past it (one shared
// with other jobs, auto-compaction on) cancels them. The log then reads again what it watches
// and goes on: its Wait still gets the entry appended during the outage, and the member watch
// still reports a member that goes afterwards.
TEST_F(EtcdTest, LogWatchesSurviveACompactionPastTheRevisionTheyResumeAt) {
  ASSERT_TRUE(StartCluster());
  WatchedLog w;
  ASSERT_TRUE(StartWatchedLog("compact", {"doomed"}, &w));  // watches open at revisions nothing will touch
  auto& writer = w.writer;
  auto& doomed = w.more[0];
  auto& got = w.got;
  const std::vector<std::string>& lost = w.lost;

  // Other jobs' keys move the revision on; everything before it is compacted away.
  int64_t revision = 0;
  for (int i = 0; i < 5; ++i) {
    auto put = Put(writer->client(), "other-job/" + std::to_string(i), "x");
    ASSERT_TRUE(put.ok()) << put.message();
    revision = *put;
  }
  long status = 0;
  auto compacted = ctrun::testing::BlockingPost(cluster_->endpoint(0) + "/v3/kv/compaction",
                                "{\"revision\":\"" + std::to_string(revision) + "\",\"physical\":true}",
                                cluster_->client_tls(), &status);
  ASSERT_TRUE(compacted && status == 200) << status << " " << compacted.value_or("");

  // The watches' streams are cut; they come back at revisions that are gone now.
  cluster_->Kill(0);
  std::optional<StatusOr<AppendResult>> put;
  writer->Append(2, "during-outage", [&](StatusOr<AppendResult> r) { put.emplace(std::move(r)); });
  RunFor(loop_, 500ms);
  Status st = cluster_->Restart(0);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_TRUE(RunUntil(loop_, [&] { return got && put; }, 30s));
  ASSERT_TRUE(put->ok()) << put->message();
  ASSERT_TRUE(got->ok()) << got->message();
  EXPECT_EQ(**got, "during-outage");

  std::optional<Status> revoked;
  doomed->RevokeLiveness([&](Status s) { revoked = s; });
  ASSERT_TRUE(RunUntil(loop_, [&] { return revoked && !lost.empty(); }, 15s)) << "the member watch is gone";
  EXPECT_EQ(lost, std::vector<std::string>{"doomed"});
}

// --- authentication and TLS ----------------------------------------------------------------------

TEST_F(EtcdTest, UserPasswordAuthenticationAndTokenRenewal) {
  EtcdClusterOptions o;
  o.extra_flags = {"--auth-token-ttl=1"};  // simple tokens die after 1 s idle
  ASSERT_TRUE(StartCluster(o));
  auto r = cluster_->Etcdctl({"user", "add", "root:s3cret"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  cluster_->Etcdctl({"user", "grant-role", "root", "root"});  // already granted on some versions
  r = cluster_->Etcdctl({"auth", "enable"});
  ASSERT_EQ(r.exit_code, 0) << r.err;

  EtcdOptions good = Options();
  good.user = "root";
  good.password = "s3cret";
  auto c = Client(good);
  ASSERT_TRUE(Put(*c, "auth/k", "v").ok());
  auto got = Get(*c, "auth/k");
  ASSERT_TRUE(got.ok()) << got.message();
  ASSERT_EQ(got->kvs.size(), 1u);

  Events seen;
  c->Watch({"auth/k", false, got->revision + 1}, [&](StatusOr<Events> e) {
    ASSERT_TRUE(e.ok()) << e.message();
    seen.insert(seen.end(), e->begin(), e->end());
  });

  // Let the tokens expire (checked with one of our own), then the client must log in again.
  auto raw = ctrun::testing::BlockingPost(cluster_->endpoint(0) + "/v3/auth/authenticate",
                                          R"({"name":"root","password":"s3cret"})");
  ASSERT_TRUE(raw);
  const std::string token = nlohmann::json::parse(*raw).value("token", "");
  ASSERT_FALSE(token.empty()) << *raw;
  RunFor(loop_, 3s);
  long status = 0;
  ctrun::testing::BlockingPost(cluster_->endpoint(0) + "/v3/kv/range", R"({"key":"eA=="})", {}, &status, token);
  EXPECT_EQ(status, 401) << "tokens did not expire: the renewal is not exercised";
  // A watch created with the expired token is refused by etcd, logs in again and proceeds.
  Events later;
  c->Watch({"auth/k", false, got->revision + 1}, [&](StatusOr<Events> e) {
    ASSERT_TRUE(e.ok()) << e.message();
    later.insert(later.end(), e->begin(), e->end());
  });
  RunFor(loop_, 300ms);
  ASSERT_TRUE(Put(*c, "auth/k", "after-expiry").ok());
  ASSERT_TRUE(RunUntil(loop_, [&] { return !seen.empty() && !later.empty(); }, 10s));
  EXPECT_EQ(seen[0].kv.value, "after-expiry");
  EXPECT_EQ(later[0].kv.value, "after-expiry");

  auto log = Log("authed", good);
  auto head = Head(*log, "init");
  ASSERT_TRUE(head.ok()) << head.message();

  EtcdOptions bad = good;
  bad.password = "wrong";
  auto wrong = Client(bad);
  TimePoint t = loop_.Now();
  auto denied = Get(*wrong, "auth/k");
  ASSERT_FALSE(denied.ok());
  EXPECT_NE(denied.message().find("authentication as user 'root' failed"), std::string::npos) << denied.message();
  EXPECT_NE(denied.message().find("invalid user ID or password"), std::string::npos) << denied.message();
  EXPECT_LT(Since(t), 5.0);

  auto anonymous = Client(Options());
  t = loop_.Now();
  auto refused = Get(*anonymous, "auth/k");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.message().find("configure a user and password"), std::string::npos) << refused.message();
  EXPECT_LT(Since(t), 5.0);
}

// Writes a self-signed CA and a server and a client certificate signed by it, and an unrelated
// CA (EC P-256).
bool MakeCertificates(const std::string& dir) {
  auto run = [](std::vector<std::string> argv) {
    argv.insert(argv.begin(), "/usr/bin/openssl");
    auto r = ctrun::testing::RunCommand(argv, {}, std::chrono::seconds(30));
    if (r.exit_code != 0) ADD_FAILURE() << "openssl " << argv[1] << ": " << r.err;
    return r.exit_code == 0;
  };
  std::ofstream(dir + "/server.ext") << "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n";
  std::ofstream(dir + "/client.ext") << "extendedKeyUsage=clientAuth\n";
  const std::vector<std::string> ec = {"-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"};
  auto req = [&](std::vector<std::string> head, std::vector<std::string> tail) {
    head.insert(head.end(), ec.begin(), ec.end());
    head.insert(head.end(), tail.begin(), tail.end());
    return run(head);
  };
  for (const std::string ca : {"ca", "other-ca"}) {
    if (!req({"req", "-x509"}, {"-keyout", dir + "/" + ca + ".key", "-out", dir + "/" + ca + ".crt", "-days", "2",
                                "-subj", "/CN=ctrun-test-" + ca}))
      return false;
  }
  for (const std::string name : {"server", "client"}) {
    if (!req({"req"}, {"-keyout", dir + "/" + name + ".key", "-out", dir + "/" + name + ".csr", "-subj", "/CN=" + name}))
      return false;
    if (!run({"x509", "-req", "-in", dir + "/" + name + ".csr", "-CA", dir + "/ca.crt", "-CAkey", dir + "/ca.key",
              "-CAcreateserial", "-out", dir + "/" + name + ".crt", "-days", "2", "-extfile", dir + "/" + name + ".ext"}))
      return false;
  }
  return true;
}

TEST_F(EtcdTest, TlsWithClientCertificates) {
  if (access("/usr/bin/openssl", X_OK) != 0) GTEST_SKIP() << "openssl is not installed: TLS test skipped";
  ctrun::testing::TempDir certs;
  ASSERT_TRUE(MakeCertificates(certs.path()));
  EtcdClusterOptions o;
  o.tls = true;
  o.server_cert = certs / "server.crt";
  o.server_key = certs / "server.key";
  o.ca_file = certs / "ca.crt";
  o.client_tls = {certs / "ca.crt", certs / "client.crt", certs / "client.key"};
  ASSERT_TRUE(StartCluster(o));
  ASSERT_EQ(cluster_->endpoint(0).rfind("https://", 0), 0u);

  auto c = Client();
  auto put = Put(*c, "tls/k", "secure");
  ASSERT_TRUE(put.ok()) << put.message();
  Events seen;
  c->Watch({"tls/k", false, *put}, [&](StatusOr<Events> e) {
    ASSERT_TRUE(e.ok()) << e.message();
    seen.insert(seen.end(), e->begin(), e->end());
  });
  ASSERT_TRUE(RunUntil(loop_, [&] { return !seen.empty(); }, 10s));
  EXPECT_EQ(seen[0].kv.value, "secure");

  // A server certificate we cannot verify is a configuration error: no retrying until the deadline.
  EtcdOptions untrusted = Options();
  untrusted.tls.ca_file = certs / "other-ca.crt";
  auto u = Client(untrusted);
  TimePoint t = loop_.Now();
  auto r = Get(*u, "tls/k");
  ASSERT_FALSE(r.ok());
  EXPECT_LT(Since(t), 5.0) << r.message();
  EXPECT_NE(r.message().find("certificate"), std::string::npos) << r.message();
  std::printf("untrusted server: %s\n", r.message().c_str());

  // Without a client certificate the server refuses us (here after the short retry deadline).
  EtcdOptions anonymous = Options();
  anonymous.tls.cert_file.clear();
  anonymous.tls.key_file.clear();
  anonymous.retry_deadline = Seconds(1);
  auto n = Client(anonymous);
  r = Get(*n, "tls/k");
  ASSERT_FALSE(r.ok());
  std::printf("no client certificate: %s\n", r.message().c_str());
}

}  // namespace
}  // namespace ctrun::rdzv
