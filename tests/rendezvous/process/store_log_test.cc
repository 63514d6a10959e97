// StoreLog against a real StoreServer on the same EventLoop (one thread): racing appends, Head
// creating entry 0 once and walking past a stale hint, waits (fired, replaced), compaction,
// liveness (a silent member is reported once after about the deadline, beating ones never), and
// destruction. The loop runs until a condition holds or a deadline passes; fixed-length runs only
// check that something does NOT happen.
#include "rendezvous/store_log.h"

#include <gtest/gtest.h>

#include "helpers/loop_util.h"

#include <functional>
#include <memory>
#include <thread>
#include <vector>
#include <optional>

#include "store/async_store_client.h"
#include "store/store_server.h"
#include "sys/event_loop.h"

namespace ctrun::rdzv {
namespace {

using testing::Into;
using testing::IntoStatus;

using namespace std::chrono_literals;

class StoreLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store::ServerOptions o;
    o.token = "tok";
    auto s = store::StoreServer::Start(loop_, o);
    ASSERT_TRUE(s.ok()) << s.message();
    server_ = std::move(*s);
  }

  std::unique_ptr<StoreLog> Log(std::string token = "tok") {
    StoreLogOptions o;
    o.port = server_->port();
    o.run_id = "job1";
    o.token = std::move(token);
    o.connect_timeout = 5s;
    o.op_timeout = 5s;
    auto log = StoreLog::Create(loop_, o);
    EXPECT_TRUE(log.ok()) << log.message();
    return log.ok() ? std::move(*log) : nullptr;
  }

  // A raw client to inspect and prepare keys.
  std::unique_ptr<store::AsyncStoreClient> Raw() {
    store::AsyncClientOptions o;
    o.port = server_->port();
    o.token = "tok";
    auto c = store::AsyncStoreClient::Create(loop_, o);
    EXPECT_TRUE(c.ok()) << c.message();
    return c.ok() ? std::move(*c) : nullptr;
  }
  bool Exists(store::AsyncStoreClient& c, const std::string& key) {
    std::optional<StatusOr<bool>> r;
    c.Check({key}, [&](StatusOr<bool> v) { r.emplace(std::move(v)); });
    EXPECT_TRUE(RunUntil([&] { return r.has_value(); }));
    return r && r->ok() && r->value();
  }

  bool RunUntil(const std::function<bool()>& pred, Duration limit = 10s) {
    return testing::RunUntil(loop_, pred, limit);
  }
  void RunFor(Duration d) { testing::RunFor(loop_, d); }

  // Members "a" and "b" beat every 50 ms (deadline 200 ms), and so does the watcher "w", whose
  // reports of lost members land in `lost`.
  struct Beating {
    std::unique_ptr<StoreLog> a, b, watcher;
    std::vector<std::string> lost;
  };
  void StartBeating(Beating* t) {
    const LivenessOptions fast{50ms, 200ms};
    t->a = Log();
    t->b = Log();
    t->watcher = Log();
    t->watcher->SetOnLost([lost = &t->lost](const std::string& id) { lost->push_back(id); });
    t->a->StartLiveness("a", fast);
    t->b->StartLiveness("b", fast);
    t->watcher->StartLiveness("w", fast);
  }


  EventLoop loop_;
  std::unique_ptr<store::StoreServer> server_;
};

TEST_F(StoreLogTest, RacingAppendsHaveExactlyOneWinnerAndAgree) {
  auto a = Log(), b = Log();
  std::optional<StatusOr<LogEntry>> head;
  a->Head("init", Into(&head));
  ASSERT_TRUE(RunUntil([&] { return head.has_value(); }));
  ASSERT_TRUE(head->ok()) << head->message();
  for (uint64_t i = 1; i <= 20; ++i) {
    std::optional<StatusOr<AppendResult>> ra, rb;
    // Alternate who sends first, so both sides win some.
    if (i % 2) {
      a->Append(i, "a" + std::to_string(i), Into(&ra));
      b->Append(i, "b" + std::to_string(i), Into(&rb));
    } else {
      b->Append(i, "b" + std::to_string(i), Into(&rb));
      a->Append(i, "a" + std::to_string(i), Into(&ra));
    }
    ASSERT_TRUE(RunUntil([&] { return ra && rb; }));
    ASSERT_TRUE(ra->ok() && rb->ok());
    EXPECT_NE(ra->value().won, rb->value().won) << "index " << i;
    EXPECT_EQ(ra->value().value, rb->value().value);
    EXPECT_EQ(ra->value().value, (ra->value().won ? "a" : "b") + std::to_string(i));
  }
  // A third log sees the newest entry.
  auto c = Log();
  std::optional<StatusOr<LogEntry>> newest;
  c->Head("other", Into(&newest));
  ASSERT_TRUE(RunUntil([&] { return newest.has_value(); }));
  ASSERT_TRUE(newest->ok()) << newest->message();
  EXPECT_EQ(newest->value().index, 20u);
}

TEST_F(StoreLogTest, HeadOnAnEmptyLogCreatesEntryZeroOnce) {
  auto a = Log(), b = Log();
  std::optional<StatusOr<LogEntry>> ha, hb;
  a->Head("from-a", Into(&ha));
  b->Head("from-b", Into(&hb));
  EXPECT_FALSE(ha.has_value());  // never inside the call
  ASSERT_TRUE(RunUntil([&] { return ha && hb; }));
  ASSERT_TRUE(ha->ok() && hb->ok());
  EXPECT_EQ(ha->value().index, 0u);
  EXPECT_EQ(hb->value().index, 0u);
  EXPECT_EQ(ha->value().value, hb->value().value);
  EXPECT_TRUE(ha->value().value == "from-a" || ha->value().value == "from-b");
  std::optional<StatusOr<LogEntry>> again;
  a->Head("later", Into(&again));
  ASSERT_TRUE(RunUntil([&] { return again.has_value(); }));
  EXPECT_EQ(again->value().value, ha->value().value);
  auto raw = Raw();
  EXPECT_FALSE(Exists(*raw, a->EntryKey(1)));
}

TEST_F(StoreLogTest, HeadWalksForwardPastAStaleHint) {
  auto raw = Raw();
  auto log = Log();
  // Entries 0..5 written behind the log's back; the head counter says 2.
  for (int i = 0; i <= 5; ++i) raw->Set(log->EntryKey(i), "e" + std::to_string(i));
  raw->Add(log->HeadKey(), 2, nullptr);
  std::optional<StatusOr<LogEntry>> head;
  log->Head("init", Into(&head));
  ASSERT_TRUE(RunUntil([&] { return head.has_value(); }));
  ASSERT_TRUE(head->ok()) << head->message();
  EXPECT_EQ(head->value().index, 5u);
  EXPECT_EQ(head->value().value, "e5");

  // A hint past the entries (never produced by Append) is an error, not a dropped connection.
  raw->Add(log->HeadKey(), 10, nullptr);
  std::optional<StatusOr<LogEntry>> bad;
  log->Head("init", Into(&bad));
  ASSERT_TRUE(RunUntil([&] { return bad.has_value(); }));
  EXPECT_FALSE(bad->ok());
  std::optional<StatusOr<AppendResult>> still;
  log->Append(6, "e6", Into(&still));
  ASSERT_TRUE(RunUntil([&] { return still.has_value(); }));
  EXPECT_TRUE(still->ok() && still->value().won);
}

TEST_F(StoreLogTest, WaitFiresWhenAnotherLogAppends) {
  auto a = Log(), b = Log();
  std::optional<StatusOr<std::string>> got;
  a->Wait(1, Into(&got));
  ASSERT_TRUE(RunUntil([&] { return server_->num_waiting() == 1; }));
  // The parked wait does not hold back the waiting log's own appends.
  std::optional<StatusOr<AppendResult>> own;
  a->Append(0, "zero", Into(&own));
  ASSERT_TRUE(RunUntil([&] { return own.has_value(); }));
  EXPECT_TRUE(own->ok() && own->value().won);
  EXPECT_FALSE(got.has_value());
  std::optional<StatusOr<AppendResult>> app;
  b->Append(1, "one", Into(&app));
  ASSERT_TRUE(RunUntil([&] { return got.has_value(); }));
  ASSERT_TRUE(got->ok()) << got->message();
  EXPECT_EQ(got->value(), "one");

  // An existing entry: at once, but still from the loop.
  std::optional<StatusOr<std::string>> now;
  a->Wait(0, Into(&now));
  EXPECT_FALSE(now.has_value());
  ASSERT_TRUE(RunUntil([&] { return now.has_value(); }));
  EXPECT_EQ(now->value(), "zero");
}

TEST_F(StoreLogTest, ReplacingAWaitDropsTheOldCallback) {
  auto a = Log(), b = Log();
  bool old_ran = false;
  a->Wait(1, [&](StatusOr<std::string>) { old_ran = true; });
  ASSERT_TRUE(RunUntil([&] { return server_->num_waiting() == 1; }));
  std::optional<StatusOr<std::string>> got;
  a->Wait(2, Into(&got));
  std::optional<StatusOr<AppendResult>> r1, r2;
  b->Append(1, "one", Into(&r1));
  ASSERT_TRUE(RunUntil([&] { return r1.has_value(); }));
  b->Append(2, "two", Into(&r2));
  ASSERT_TRUE(RunUntil([&] { return got.has_value(); }));
  EXPECT_EQ(got->value(), "two");

  // Replaced while its entry already exists (the wait is answered at once, the read may be
  // under way): the old callback still never runs.
  a->Wait(1, [&](StatusOr<std::string>) { old_ran = true; });
  std::optional<StatusOr<std::string>> got3;
  a->Wait(3, Into(&got3));
  RunFor(50ms);
  EXPECT_FALSE(old_ran);
  std::optional<StatusOr<AppendResult>> r3;
  b->Append(3, "three", Into(&r3));
  ASSERT_TRUE(RunUntil([&] { return got3.has_value(); }));
  EXPECT_EQ(got3->value(), "three");
  RunFor(50ms);
  EXPECT_FALSE(old_ran);
  EXPECT_EQ(server_->num_waiting(), 0u);
}

TEST_F(StoreLogTest, OldEntriesAreCompactedTheNewest64StayAndALateReaderIsToldSo) {
  auto log = Log();
  std::optional<StatusOr<LogEntry>> head;
  log->Head("e0", Into(&head));
  ASSERT_TRUE(RunUntil([&] { return head.has_value(); }));
  constexpr uint64_t kLast = 70;
  for (uint64_t i = 1; i <= kLast; ++i) {
    std::optional<StatusOr<AppendResult>> r;
    log->Append(i, "e" + std::to_string(i), Into(&r));
    ASSERT_TRUE(RunUntil([&] { return r.has_value(); }));
    ASSERT_TRUE(r->ok() && r->value().won) << i;
  }
  auto raw = Raw();
  auto value = [&](uint64_t i) {
    std::optional<StatusOr<std::string>> v;
    raw->Get(log->EntryKey(i), Into(&v));
    EXPECT_TRUE(RunUntil([&] { return v.has_value(); }));
    return v && v->ok() ? v->value() : std::string("<error>");
  };
  for (uint64_t i = 0; i <= kLast - StoreLog::kKeepEntries; ++i) EXPECT_EQ(value(i), kCompactedEntry) << i;
  for (uint64_t i = kLast - StoreLog::kKeepEntries + 1; i <= kLast; ++i) EXPECT_EQ(value(i), "e" + std::to_string(i));

  // An agent that fell behind: its Append to a compacted index creates nothing, its Wait ends.
  std::optional<StatusOr<AppendResult>> late;
  log->Append(3, "late", Into(&late));
  ASSERT_TRUE(RunUntil([&] { return late.has_value(); }));
  ASSERT_TRUE(late->ok()) << late->message();
  EXPECT_FALSE(late->value().won);
  EXPECT_EQ(late->value().value, kCompactedEntry);
  std::optional<StatusOr<std::string>> waited;
  log->Wait(4, Into(&waited));
  ASSERT_TRUE(RunUntil([&] { return waited.has_value(); }));
  ASSERT_TRUE(waited->ok()) << waited->message();
  EXPECT_EQ(waited->value(), kCompactedEntry);

  std::optional<StatusOr<LogEntry>> newest;
  Log()->Head("ignored", Into(&newest));  // destroyed at once: no callback may run
  log->Head("ignored", Into(&newest));
  ASSERT_TRUE(RunUntil([&] { return newest.has_value(); }));
  ASSERT_TRUE(newest->ok()) << newest->message();
  EXPECT_EQ(newest->value().index, kLast);
  EXPECT_EQ(newest->value().value, "e70");

  // A head counter that points at a compacted entry, however often it is read: Head walks on
  // through the compacted entries to the newest one.
  std::optional<StatusOr<int64_t>> moved;
  raw->Add(log->HeadKey(), -66, Into(&moved));
  ASSERT_TRUE(RunUntil([&] { return moved.has_value(); }));
  ASSERT_TRUE(moved->ok() && moved->value() == 4);
  newest.reset();
  log->Head("ignored", Into(&newest));
  ASSERT_TRUE(RunUntil([&] { return newest.has_value(); }));
  ASSERT_TRUE(newest->ok()) << newest->message();
  EXPECT_EQ(newest->value().index, kLast);
  EXPECT_EQ(newest->value().value, "e70");
}

TEST_F(StoreLogTest, SilentMemberIsReportedOnceAfterTheDeadline) {
  Beating t;
  StartBeating(&t);
  auto& [a, b, watcher, lost] = t;
  const TimePoint t0 = loop_.Now();
  watcher->WatchMembers({"a", "b", "c", "w"});  // c never beats; w is itself
  ASSERT_TRUE(RunUntil([&] { return !lost.empty(); }, 5s));
  EXPECT_EQ(lost, std::vector<std::string>{"c"});
  EXPECT_GE(loop_.Now() - t0, 200ms);
  EXPECT_LT(loop_.Now() - t0, 2s);

  // Beating members are never reported, however long it runs.
  RunFor(800ms);
  EXPECT_EQ(lost, std::vector<std::string>{"c"});

  a->StopLiveness();
  const TimePoint t1 = loop_.Now();
  ASSERT_TRUE(RunUntil([&] { return lost.size() == 2; }, 5s));
  EXPECT_EQ(lost.back(), "a");
  EXPECT_GE(loop_.Now() - t1, 150ms);  // its last beat may predate the stop by one interval
  RunFor(500ms);
  EXPECT_EQ(lost, (std::vector<std::string>{"c", "a"}));

  // A member newly watched gets the full deadline from then on, even when long silent.
  watcher->WatchMembers({"a", "b", "c", "late"});
  const TimePoint t2 = loop_.Now();
  ASSERT_TRUE(RunUntil([&] { return lost.size() == 3; }, 5s));
  EXPECT_EQ(lost.back(), "late");
  EXPECT_GE(loop_.Now() - t2, 200ms);
}

// A store (or an agent) stopped for longer than the deadline (SIGSTOP of the agent hosting it, a
// paused VM) answers afterwards with counters nobody could bump meanwhile: no member is lost for
// that. Here the one loop that runs the store and every member stops for 3.5 times the deadline,
// a few times, while a poll may be in flight; the deadline then restarts, and a member that really
// stopped is still reported after it. (The store host's own stall, with the others running, is
// MultiNode.AStoppedRendezvousHostCostsNoNodeAndRunsNothingTwice.)
TEST_F(StoreLogTest, AStallOfTheStoreOrTheWatcherLosesNoMember) {
  Beating t;
  StartBeating(&t);
  auto& [a, b, watcher, lost] = t;
  watcher->WatchMembers({"a", "b", "w"});
  RunFor(300ms);
  for (int i = 0; i < 4; ++i) {
    std::this_thread::sleep_for(700ms);  // everything stops: store, beats and polls
    RunFor(30ms + 17ms * i);             // requests sent before the stall are answered now
    std::this_thread::sleep_for(700ms);
    RunFor(300ms);
  }
  EXPECT_EQ(lost, std::vector<std::string>{});
  b->StopLiveness();
  ASSERT_TRUE(RunUntil([&] { return !lost.empty(); }, 5s));
  EXPECT_EQ(lost, std::vector<std::string>{"b"});
}

TEST_F(StoreLogTest, DestroyingTheLogRunsNoCallback) {
  int ran = 0;
  auto count = [&](auto) { ++ran; };
  {
    auto log = Log();
    log->Head("x", count);
    log->Append(1, "y", count);
    log->Wait(5, count);
    log->SetOnLost([&](const std::string&) { ++ran; });
    log->StartLiveness("me", {50ms, 100ms});
    log->WatchMembers({"ghost"});
    loop_.RunOnce(0ms);  // requests are on their way
  }
  RunFor(400ms);
  EXPECT_EQ(ran, 0);
  // Also from inside one of its own callbacks.
  auto log = Log();
  log->Head("x", [&](StatusOr<LogEntry>) {
    ++ran;
    log.reset();
  });
  log->Wait(99, count);
  ASSERT_TRUE(RunUntil([&] { return ran > 0; }));
  RunFor(100ms);
  EXPECT_EQ(ran, 1);
}

TEST_F(StoreLogTest, ErrorsReachTheCallbacks) {
  auto wrong = Log("not-the-token");
  std::optional<StatusOr<LogEntry>> head;
  wrong->Head("x", Into(&head));
  ASSERT_TRUE(RunUntil([&] { return head.has_value(); }));
  ASSERT_FALSE(head->ok());
  EXPECT_NE(head->message().find("AUTH"), std::string::npos) << head->message();

  auto log = Log();
  std::optional<StatusOr<AppendResult>> empty;
  log->Append(1, "", Into(&empty));
  EXPECT_FALSE(empty.has_value());
  ASSERT_TRUE(RunUntil([&] { return empty.has_value(); }));
  EXPECT_FALSE(empty->ok());

  std::optional<StatusOr<std::string>> wait;
  log->Wait(9, Into(&wait));
  ASSERT_TRUE(RunUntil([&] { return server_->num_waiting() == 1; }));
  server_.reset();
  ASSERT_TRUE(RunUntil([&] { return wait.has_value(); }));
  EXPECT_FALSE(wait->ok());
  EXPECT_EQ(log->Describe().rfind("store at 127.0.0.1:", 0), 0u) << log->Describe();
}

}  // namespace
}  // namespace ctrun::rdzv
