// AsyncStoreClient against a real StoreServer on the same EventLoop (one thread): every
// operation, pipelining and FIFO callbacks, callbacks never synchronous, connect retry and
// deadline, server loss, tokens, op timeout, waits (timeout, cancel, hold-back), destruction with
// requests pending, and the socket options. The loop runs until a condition holds or a deadline
// passes; fixed-length runs only check that something does NOT happen.
#include "store/async_store_client.h"

#include <gtest/gtest.h>

#include "helpers/free_port.h"
#include "helpers/loop_util.h"
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <functional>
#include <optional>

#include "store/client_util.h"
#include "store/store_server.h"
#include "sys/event_loop.h"

namespace ctrun::store {
namespace {

using testing::Into;
using testing::IntoStatus;

using namespace std::chrono_literals;

using testing::FreePort;

class AsyncClientTest : public ::testing::Test {
 protected:
  void StartServer(int port = 0, std::string token = "") {
    ServerOptions o;
    o.port = port;
    o.token = std::move(token);
    auto s = StoreServer::Start(loop_, o);
    ASSERT_TRUE(s.ok()) << s.message();
    server_ = std::move(*s);
    port_ = server_->port();
  }

  std::unique_ptr<AsyncStoreClient> Client(AsyncClientOptions o = {}) {
    if (o.port == 0) o.port = port_;
    if (o.connect_timeout == AsyncClientOptions{}.connect_timeout) o.connect_timeout = 10s;
    if (o.op_timeout == AsyncClientOptions{}.op_timeout) o.op_timeout = 10s;
    auto c = AsyncStoreClient::Create(loop_, o);
    EXPECT_TRUE(c.ok()) << c.message();
    return c.ok() ? std::move(*c) : nullptr;
  }

  // Runs the loop until pred() holds; false if `limit` passed first.
  bool RunUntil(const std::function<bool()>& pred, Duration limit = 10s) {
    return testing::RunUntil(loop_, pred, limit);
  }
  void RunFor(Duration d) { testing::RunFor(loop_, d); }


  EventLoop loop_;
  std::unique_ptr<StoreServer> server_;
  int port_ = 0;
};

TEST_F(AsyncClientTest, EveryOperation) {
  StartServer();
  auto c = Client();
  std::optional<Status> set, ping;
  std::optional<StatusOr<int64_t>> add1, add2;
  std::optional<StatusOr<std::string>> get, cas_hit, cas_miss, cas_new, cas_ghost;
  std::optional<StatusOr<bool>> check_yes, check_no, del_yes, del_no, wait;
  std::optional<StatusOr<std::vector<std::string>>> mget;
  c->Set("a", "1", IntoStatus(&set));
  c->Get("a", Into(&get));
  c->Add("n", 5, Into(&add1));
  c->Add("n", -7, Into(&add2));
  c->CompareSet("a", "1", "2", Into(&cas_hit));
  c->CompareSet("a", "1", "3", Into(&cas_miss));
  c->CompareSet("new", "", "x", Into(&cas_new));
  c->CompareSet("ghost", "exp", "y", Into(&cas_ghost));
  c->Check({"a", "n"}, Into(&check_yes));
  c->Check({"a", "ghost"}, Into(&check_no));
  c->DeleteKey("new", Into(&del_yes));
  c->DeleteKey("new", Into(&del_no));
  c->MultiGet({"n", "a"}, Into(&mget));
  c->Wait({"a"}, 1s, Into(&wait));
  c->Ping(IntoStatus(&ping));
  ASSERT_TRUE(RunUntil([&] { return ping.has_value(); }));
  EXPECT_TRUE(set->ok());
  EXPECT_EQ(get->value(), "1");
  EXPECT_EQ(add1->value(), 5);
  EXPECT_EQ(add2->value(), -2);
  EXPECT_EQ(cas_hit->value(), "2");
  EXPECT_EQ(cas_miss->value(), "2");
  EXPECT_EQ(cas_new->value(), "x");
  EXPECT_EQ(cas_ghost->value(), "exp");
  EXPECT_TRUE(check_yes->value());
  EXPECT_FALSE(check_no->value());
  EXPECT_TRUE(del_yes->value());
  EXPECT_FALSE(del_no->value());
  EXPECT_EQ(mget->value(), (std::vector<std::string>{"-2", "2"}));
  EXPECT_TRUE(wait->value());
  EXPECT_TRUE(ping->ok()) << ping->message();
  EXPECT_EQ(c->pending(), 0u);
  EXPECT_TRUE(c->connected());
  EXPECT_EQ(server_->num_keys(), 2u);
}

TEST_F(AsyncClientTest, LargeValuesCrossManyReadsAndWrites) {
  StartServer();
  auto c = Client();
  std::string big(8u << 20, 'z');
  big[12345] = '\0';
  std::optional<StatusOr<std::string>> got;
  std::optional<StatusOr<std::vector<std::string>>> both;
  c->Set("big", big);
  c->Set("big2", big + "2");
  c->Get("big", Into(&got));
  c->MultiGet({"big2", "big"}, Into(&both));
  ASSERT_TRUE(RunUntil([&] { return both.has_value(); }));
  ASSERT_TRUE(got->ok()) << got->message();
  EXPECT_TRUE(got->value() == big);
  ASSERT_TRUE(both->ok()) << both->message();
  ASSERT_EQ(both->value().size(), 2u);
  EXPECT_TRUE(both->value()[0] == big + "2");
  EXPECT_TRUE(both->value()[1] == big);
}

TEST_F(AsyncClientTest, PipelinedRequestsCompleteInRequestOrder) {
  StartServer();
  auto c = Client();
  constexpr int kN = 300;
  std::vector<int> order;
  std::vector<int64_t> counts;
  for (int i = 0; i < kN; ++i) {
    switch (i % 3) {
      case 0:
        c->Add("n", 1, [&, i](StatusOr<int64_t> r) {
          order.push_back(i);
          counts.push_back(r.ok() ? *r : -1);
        });
        break;
      case 1:
        c->Set("k" + std::to_string(i), "v", [&, i](Status s) {
          EXPECT_TRUE(s.ok()) << s.message();
          order.push_back(i);
        });
        break;
      default:
        c->Check({"k" + std::to_string(i - 1)}, [&, i](StatusOr<bool> r) {
          EXPECT_TRUE(r.ok() && *r);  // the SET just before it was applied first
          order.push_back(i);
        });
    }
  }
  EXPECT_EQ(c->pending(), static_cast<size_t>(kN));
  ASSERT_TRUE(RunUntil([&] { return order.size() == kN; }));
  for (int i = 0; i < kN; ++i) ASSERT_EQ(order[i], i);
  for (size_t i = 0; i < counts.size(); ++i) EXPECT_EQ(counts[i], static_cast<int64_t>(i + 1));
}

TEST_F(AsyncClientTest, CallbacksNeverRunInsideTheCall) {
  StartServer();
  auto c = Client();
  std::optional<Status> first;
  c->Ping(IntoStatus(&first));
  ASSERT_TRUE(RunUntil([&] { return first.has_value(); }));  // connected now
  bool ran = false;
  c->Ping([&](Status) { ran = true; });
  c->Set("k", "v", [&](Status) { ran = true; });
  c->Wait({"k"}, std::nullopt, [&](StatusOr<bool>) { ran = true; });
  EXPECT_FALSE(ran);
  ASSERT_TRUE(RunUntil([&] { return ran; }));

  // Errors too: nothing listens and the connect deadline is zero.
  AsyncClientOptions o;
  o.port = FreePort();
  o.connect_timeout = Duration::zero();
  auto dead = AsyncStoreClient::Create(loop_, o);
  ASSERT_TRUE(dead.ok());
  std::optional<Status> err;
  (*dead)->Ping(IntoStatus(&err));
  EXPECT_FALSE(err.has_value());
  ASSERT_TRUE(RunUntil([&] { return err.has_value(); }));
  EXPECT_FALSE(err->ok());
}

TEST_F(AsyncClientTest, ConnectRetriesUntilTheServerListens) {
  const int port = FreePort();
  AsyncClientOptions o;
  o.port = port;
  auto c = Client(o);
  std::optional<Status> ping;
  c->Ping(IntoStatus(&ping));
  bool late_start = false;
  loop_.AddTimerAfter(300ms, [&] {
    StartServer(port);
    late_start = true;
  });
  ASSERT_TRUE(RunUntil([&] { return ping.has_value(); }));
  EXPECT_TRUE(late_start);
  EXPECT_TRUE(ping->ok()) << ping->message();
}

TEST_F(AsyncClientTest, ConnectGivesUpAtItsDeadline) {
  AsyncClientOptions o;
  o.port = FreePort();
  o.connect_timeout = 300ms;
  auto c = Client(o);
  std::optional<Status> ping;
  const TimePoint t0 = loop_.Now();
  c->Ping(IntoStatus(&ping));
  ASSERT_TRUE(RunUntil([&] { return ping.has_value(); }));
  EXPECT_FALSE(ping->ok());
  EXPECT_NE(ping->message().find("could not connect"), std::string::npos) << ping->message();
  EXPECT_GE(loop_.Now() - t0, 250ms);
  EXPECT_LT(loop_.Now() - t0, 3s);
}

TEST_F(AsyncClientTest, ServerLossFailsEveryPendingRequestThenReconnects) {
  StartServer();
  const int port = port_;
  auto c = Client();
  std::optional<StatusOr<bool>> wait;
  std::optional<StatusOr<int64_t>> add;  // held back behind the parked wait
  c->Wait({"never"}, std::nullopt, Into(&wait));
  c->Add("n", 1, Into(&add));
  ASSERT_TRUE(RunUntil([&] { return server_->num_waiting() == 1; }));
  RunFor(50ms);
  EXPECT_FALSE(add.has_value());
  server_.reset();
  ASSERT_TRUE(RunUntil([&] { return wait.has_value() && add.has_value(); }));
  EXPECT_FALSE(wait->ok());
  EXPECT_FALSE(add->ok());
  EXPECT_NE(wait->message().find("lost"), std::string::npos) << wait->message();
  EXPECT_FALSE(c->connected());

  StartServer(port);
  std::optional<StatusOr<int64_t>> again;
  c->Add("n", 1, Into(&again));
  ASSERT_TRUE(RunUntil([&] { return again.has_value(); }));
  ASSERT_TRUE(again->ok()) << again->message();
  EXPECT_EQ(again->value(), 1);
}

TEST_F(AsyncClientTest, TokenIsRequired) {
  StartServer(0, "s3cret");
  AsyncClientOptions good, wrong, none;
  good.token = "s3cret";
  wrong.token = "guess";
  auto cg = Client(good), cw = Client(wrong), cn = Client(none);
  std::optional<StatusOr<int64_t>> g, w, n;
  cg->Add("x", 1, Into(&g));
  cw->Add("x", 1, Into(&w));
  cn->Add("x", 1, Into(&n));
  ASSERT_TRUE(RunUntil([&] { return g && w && n; }));
  ASSERT_TRUE(g->ok()) << g->message();
  EXPECT_EQ(g->value(), 1);
  ASSERT_FALSE(w->ok());
  EXPECT_NE(w->message().find("AUTH"), std::string::npos) << w->message();
  ASSERT_FALSE(n->ok());
  EXPECT_NE(n->message().find("AUTH"), std::string::npos) << n->message();
  EXPECT_EQ(server_->num_keys(), 1u);
}

TEST_F(AsyncClientTest, MissingReplyPastTheOpTimeoutDropsTheConnection) {
  // A listener that never accepts: the kernel completes the handshake, nobody ever answers.
  UniqueFd mute(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(mute.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(mute.get(), 8), 0);
  ASSERT_EQ(::getsockname(mute.get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
  AsyncClientOptions o;
  o.port = ntohs(a.sin_port);
  o.op_timeout = 300ms;
  auto c = Client(o);
  std::optional<Status> ping;
  std::optional<StatusOr<int64_t>> add;
  const TimePoint t0 = loop_.Now();
  c->Ping(IntoStatus(&ping));
  c->Add("n", 1, Into(&add));
  ASSERT_TRUE(RunUntil([&] { return ping && add; }));
  EXPECT_GE(loop_.Now() - t0, 250ms);
  ASSERT_FALSE(ping->ok());
  EXPECT_NE(ping->message().find("no reply"), std::string::npos) << ping->message();
  EXPECT_FALSE(add->ok());
  EXPECT_FALSE(c->connected());
}

TEST_F(AsyncClientTest, WaitTimeoutCancelsAndKeepsTheConnection) {
  StartServer();
  auto c = Client();
  std::optional<StatusOr<bool>> wait;
  std::optional<StatusOr<int64_t>> add;
  c->Wait({"never"}, 200ms, Into(&wait));
  c->Add("n", 1, Into(&add));  // sent once CANCEL_WAIT unparked the connection
  ASSERT_TRUE(RunUntil([&] { return wait && add; }));
  ASSERT_TRUE(wait->ok()) << wait->message();
  EXPECT_FALSE(wait->value());
  ASSERT_TRUE(add->ok()) << add->message();
  EXPECT_EQ(server_->num_waiting(), 0u);
  EXPECT_EQ(server_->num_connections(), 1u);  // the same connection throughout
}

TEST_F(AsyncClientTest, WaitIsWokenByAnotherClientAndHoldsBackLaterRequests) {
  StartServer();
  auto waiter = Client();
  auto setter = Client();
  std::vector<std::string> events;
  waiter->Wait({"k1", "k2"}, std::nullopt,
               [&](StatusOr<bool> r) { events.push_back(r.ok() && *r ? "wait" : "wait failed"); });
  waiter->Add("n", 1,
              [&](StatusOr<int64_t> r) { events.push_back(r.ok() ? "add" : "add failed"); });
  ASSERT_TRUE(RunUntil([&] { return server_->num_waiting() == 1; }));
  setter->Set("k1", "x");
  RunFor(50ms);
  EXPECT_TRUE(events.empty());
  EXPECT_EQ(server_->num_keys(), 1u);  // the ADD was not sent yet
  setter->Set("k2", "y");
  ASSERT_TRUE(RunUntil([&] { return events.size() == 2; }));
  EXPECT_EQ(events, (std::vector<std::string>{"wait", "add"}));
}

TEST_F(AsyncClientTest, CancelWaitDropsItsCallback) {
  StartServer();
  auto c = Client();
  bool ran = false;
  auto id = c->Wait({"k"}, std::nullopt, [&](StatusOr<bool>) { ran = true; });
  ASSERT_TRUE(RunUntil([&] { return server_->num_waiting() == 1; }));
  c->CancelWait(id);
  std::optional<StatusOr<int64_t>> add;
  c->Add("n", 1, Into(&add));
  ASSERT_TRUE(RunUntil([&] { return add.has_value(); }));
  EXPECT_TRUE(add->ok()) << add->message();
  EXPECT_EQ(server_->num_waiting(), 0u);

  // Canceled while still queued behind another wait, and a wait whose reply is already due.
  auto parked = c->Wait({"k"}, std::nullopt, [&](StatusOr<bool>) { ran = true; });
  auto queued = c->Wait({"n"}, std::nullopt, [&](StatusOr<bool>) { ran = true; });
  c->CancelWait(queued);
  ASSERT_TRUE(RunUntil([&] { return server_->num_waiting() == 1; }));
  c->CancelWait(parked);
  auto due = c->Wait({"n"}, std::nullopt, [&](StatusOr<bool>) { ran = true; });
  std::optional<Status> ping;
  c->Ping([&](Status s) {
    ping = s;
    c->CancelWait(due);  // too late: `due` already completed before this PING
  });
  ASSERT_TRUE(RunUntil([&] { return ping.has_value(); }));
  EXPECT_TRUE(ran);  // `due` completed before the PING's callback, in order
  ran = false;
  c->CancelWait(123456);  // unknown: no-op
  RunFor(50ms);
  EXPECT_FALSE(ran);
  EXPECT_EQ(server_->num_waiting(), 0u);
}

TEST_F(AsyncClientTest, CancelWaitInsideAnEarlierCallbackOfTheSameBatch) {
  StartServer();
  auto c = Client();
  std::optional<Status> first;
  c->Ping(IntoStatus(&first));
  ASSERT_TRUE(RunUntil([&] { return first.has_value(); }));
  bool ran = false;
  AsyncStoreClient::WaitId id = 0;
  std::optional<Status> ping;
  // PING's reply and the immediate STOP_WAITING arrive together; canceling the wait from the
  // PING's callback must still drop the wait's callback.
  c->Set("k", "v");
  c->Ping([&](Status s) {
    ping = s;
    c->CancelWait(id);
  });
  id = c->Wait({"k"}, std::nullopt, [&](StatusOr<bool>) { ran = true; });
  ASSERT_TRUE(RunUntil([&] { return ping.has_value(); }));
  RunFor(50ms);
  EXPECT_FALSE(ran);
}

TEST_F(AsyncClientTest, DestroyingWithRequestsPendingRunsNoCallback) {
  StartServer();
  int ran = 0;
  auto count = [&](auto) { ++ran; };
  {
    auto c = Client();  // never connected
    c->Ping(count);
    c->Add("n", 1, count);
  }
  {
    auto c = Client();  // connected, requests on the wire and a parked wait
    std::optional<Status> up;
    c->Ping(IntoStatus(&up));
    ASSERT_TRUE(RunUntil([&] { return up.has_value(); }));
    c->Add("n", 1, count);
    c->Wait({"never"}, 100ms, count);
    c->Ping(count);
    loop_.RunOnce(0ms);  // the kick: requests are sent, no reply is read yet
  }
  RunFor(300ms);
  EXPECT_EQ(ran, 0);

  // Destroyed by its own callback: later callbacks of the same batch do not run.
  auto c = Client();
  c->Ping([&](Status) {
    ++ran;
    c.reset();
  });
  c->Ping(count);
  c->Ping(count);
  ASSERT_TRUE(RunUntil([&] { return ran > 0; }));
  RunFor(100ms);
  EXPECT_EQ(ran, 1);
}

TEST_F(AsyncClientTest, GetOfAMissingKeyFailsAndTheNextRequestReconnects) {
  StartServer();
  auto c = Client();
  std::optional<StatusOr<int64_t>> before;
  std::optional<StatusOr<std::string>> get;
  c->Add("n", 1, Into(&before));
  c->Get("missing", Into(&get));
  ASSERT_TRUE(RunUntil([&] { return get.has_value(); }));
  EXPECT_TRUE(before->ok());  // its reply came before the close
  ASSERT_FALSE(get->ok());
  EXPECT_NE(get->message().find("missing key"), std::string::npos) << get->message();
  std::optional<StatusOr<int64_t>> after;
  c->Add("n", 1, Into(&after));
  ASSERT_TRUE(RunUntil([&] { return after.has_value(); }));
  ASSERT_TRUE(after->ok()) << after->message();
  EXPECT_EQ(after->value(), 2);
}

TEST(AsyncStoreClientCreate, RejectsABadPort) {
  EventLoop loop;
  AsyncClientOptions o;
  o.port = 0;
  EXPECT_FALSE(AsyncStoreClient::Create(loop, o).ok());
}

// A name that does not resolve yet (a pod's DNS record comes after the other pods start) is
// retried like a refused connect until the connect deadline, with one line for the user, as
// torch's TCPStore client retries; it used to end the agent at once.
TEST_F(AsyncClientTest, AHostThatDoesNotResolveYetIsRetriedUntilTheConnectDeadline) {
  AsyncClientOptions o;
  o.host = "no-such-host.invalid";
  o.port = 29500;
  o.connect_timeout = 600ms;
  std::vector<std::string> said;
  o.on_unreachable = [&](const std::string& line) { said.push_back(line); };
  auto c = Client(o);
  ASSERT_NE(c, nullptr);
  std::optional<Status> ping;
  const TimePoint t0 = loop_.Now();
  c->Ping(IntoStatus(&ping));
  ASSERT_TRUE(RunUntil([&] { return ping.has_value(); }));
  EXPECT_FALSE(ping->ok());
  EXPECT_NE(ping->message().find("cannot resolve it"), std::string::npos) << ping->message();
  EXPECT_GE(loop_.Now() - t0, 550ms);
  ASSERT_EQ(said.size(), 1u);
  EXPECT_NE(said[0].find("cannot reach no-such-host.invalid:29500 yet (cannot resolve it: "), std::string::npos)
      << said[0];
}

// "Retrying for up to N s" is for a server never reached: after a loss the owner reports the
// loss (a rendezvous that lost its store ends at once; the line was false).
TEST_F(AsyncClientTest, UnreachableIsSaidOnlyBeforeTheFirstConnection) {
  StartServer();
  AsyncClientOptions o;
  o.connect_timeout = 300ms;
  int said = 0;
  o.on_unreachable = [&](const std::string&) { ++said; };
  auto c = Client(o);
  std::optional<Status> first, second;
  c->Ping(IntoStatus(&first));
  ASSERT_TRUE(RunUntil([&] { return first.has_value(); }));
  ASSERT_TRUE(first->ok()) << first->message();
  server_.reset();
  c->Ping(IntoStatus(&second));
  ASSERT_TRUE(RunUntil([&] { return second.has_value(); }));
  EXPECT_FALSE(second->ok());
  EXPECT_EQ(said, 0);
}

// The hook before each retry may bring up the server the client waits for (a rendezvous host
// that found its port taken): the next attempt reaches it. Not called once connected.
TEST_F(AsyncClientTest, TheRetryHookCanStartTheServerTheClientWaitsFor) {
  const int port = FreePort();  // nobody listens there yet
  AsyncClientOptions o;
  o.port = port;
  o.connect_timeout = 10s;
  int calls = 0;
  o.before_retry = [&] {
    if (++calls == 2) StartServer(port);
  };
  auto c = Client(o);
  std::optional<Status> first, second;
  c->Ping(IntoStatus(&first));
  ASSERT_TRUE(RunUntil([&] { return first.has_value(); }));
  EXPECT_TRUE(first->ok()) << first->message();
  EXPECT_EQ(calls, 2);
  server_.reset();
  c->Ping(IntoStatus(&second));
  ASSERT_TRUE(RunUntil([&] { return second.has_value(); }));
  EXPECT_FALSE(second->ok());
  EXPECT_EQ(calls, 2) << "a lost connection is its owner's to report, not a server to bring up";
}

TEST(TunePeerSocket, KeepaliveDetectsACutLinkWithinTheOpTimeout) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  TunePeerSocket(fd.get(), 30s);
  auto get = [&](int level, int opt) {
    int v = -1;
    socklen_t len = sizeof v;
    ::getsockopt(fd.get(), level, opt, &v, &len);
    return v;
  };
  EXPECT_EQ(get(SOL_SOCKET, SO_KEEPALIVE), 1);
  EXPECT_EQ(get(IPPROTO_TCP, TCP_NODELAY), 1);
  EXPECT_EQ(get(IPPROTO_TCP, TCP_KEEPIDLE), 15);
  EXPECT_EQ(get(IPPROTO_TCP, TCP_KEEPINTVL), 5);
  EXPECT_EQ(get(IPPROTO_TCP, TCP_KEEPCNT), 3);
  EXPECT_EQ(get(IPPROTO_TCP, TCP_USER_TIMEOUT), 30000);
}

}  // namespace
}  // namespace ctrun::store
