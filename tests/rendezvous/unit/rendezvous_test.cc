#include "rendezvous/rendezvous.h"

#include <gtest/gtest.h>

#include <algorithm>

#include <map>
#include <memory>

#include "fakes/fake_rendezvous_log.h"
#include "fakes/fake_timer_queue.h"

namespace ctrun::rdzv {
namespace {

using testing::FakeLogServer;
using testing::FakeRendezvousLog;
using testing::FakeTimerQueue;

// One agent: its Rendezvous and what it was told. By default it "stops its workers" at once
// when told to and joins the next round, like an agent whose workers die instantly.
struct Node : RendezvousListener {
  std::string id;
  int nproc;
  std::unique_ptr<Rendezvous> rdzv;
  std::vector<RoundInfo> rounds;
  std::vector<std::string> stops;
  std::optional<JobEnd> end;
  std::vector<std::string> logs;
  bool auto_rejoin = true;

  void OnRoundReady(const RoundInfo& r) override { rounds.push_back(r); }
  void OnRoundStopping(const std::string& why) override {
    stops.push_back(why);
    if (auto_rejoin) JoinNow();
  }
  void OnJobEnd(const JobEnd& e) override { end = e; }
  void OnRendezvousLog(int, const std::string& msg) override { logs.push_back(msg); }
  bool Logged(const std::string& part) const {
    return std::any_of(logs.begin(), logs.end(), [&](const std::string& l) { return l.find(part) != std::string::npos; });
  }
  void JoinNow() {
    NodeDesc d;
    d.host = "host-" + id;
    d.addr = "10.0.0." + id;
    d.store_port = 5000 + static_cast<int>(rounds.size());
    d.nproc = nproc;
    rdzv->Join(d);
  }
};

class RendezvousTest : public ::testing::Test {
 protected:
  Node& Add(const std::string& id, int nproc = 2) {
    auto n = std::make_unique<Node>();
    n->id = id;
    n->nproc = nproc;
    n->rdzv = std::make_unique<Rendezvous>(std::make_unique<FakeRendezvousLog>(server_, timers_), timers_, options_,
                                           id);
    n->rdzv->SetListener(n.get());
    nodes_.push_back(std::move(n));
    return *nodes_.back();
  }
  void Settle() { timers_.Advance(Duration::zero()); }
  // Adds agents "1".."n", joins them all, and lets the round complete (after `last_call`, for an
  // elastic round below MAX).
  std::vector<Node*> Start(int n, Duration last_call = Duration::zero()) {
    std::vector<Node*> out;
    for (int i = 1; i <= n; ++i) out.push_back(&Add(std::to_string(i)));
    for (Node* node : out) node->JoinNow();
    Settle();
    if (last_call > Duration::zero()) timers_.Advance(last_call);
    return out;
  }

  std::shared_ptr<FakeLogServer> server_ = std::make_shared<FakeLogServer>();
  FakeTimerQueue timers_;
  RendezvousOptions options_;
  std::vector<std::unique_ptr<Node>> nodes_;
};

TEST_F(RendezvousTest, TwoNodesGetContiguousRanksAndNodeZerosStore) {
  options_.params = Params{2, 2, 0, false};
  Node& a = Add("1", 4);
  Node& b = Add("2", 2);
  a.JoinNow();
  Settle();
  b.JoinNow();
  Settle();
  ASSERT_EQ(a.rounds.size(), 1u);
  ASSERT_EQ(b.rounds.size(), 1u);
  EXPECT_EQ(a.rounds[0].node_rank, 0);
  EXPECT_EQ(b.rounds[0].node_rank, 1);
  EXPECT_EQ(b.rounds[0].base_rank, 4);
  EXPECT_EQ(a.rounds[0].world_size, 6);
  EXPECT_EQ(b.rounds[0].num_nodes, 2);
  EXPECT_EQ(b.rounds[0].master_addr, "10.0.0.1");
  EXPECT_EQ(b.rounds[0].master_port, 5000);
}

// The job's rules are the first node's; a node with other flags is refused before it joins,
// whatever the order, instead of completing rounds by its own count.
TEST_F(RendezvousTest, ANodeWhoseFlagsDifferFromTheJobsIsRefusedAndNamesThem) {
  options_.params = Params{2, 2, 0, true};
  Node& a = Add("1");
  a.JoinNow();
  Settle();
  options_.params = Params{3, 3, 1, true};
  Node& b = Add("2");
  b.JoinNow();
  Settle();
  ASSERT_TRUE(b.end);
  EXPECT_TRUE(b.end->rendezvous_error);
  EXPECT_EQ(b.end->exit_code, kExitRendezvous);
  EXPECT_NE(b.end->message.find("--nnodes=3 here, 2 in the job"), std::string::npos) << b.end->message;
  EXPECT_NE(b.end->message.find("--max_restarts=1 here, 0 in the job"), std::string::npos) << b.end->message;
  EXPECT_NE(b.end->message.find("set by 1, the node that started the rendezvous"), std::string::npos) << b.end->message;
  EXPECT_TRUE(b.rounds.empty());
  EXPECT_FALSE(a.end) << "the job's own node keeps waiting for a node with its flags";
  EXPECT_TRUE(a.rounds.empty());
  // The job's node says who was refused and why, at once and again when its join times out.
  EXPECT_TRUE(a.Logged("node 2 was refused: its flags differ from this job's (--nnodes=3 there, 2 in the job; "
                       "--max_restarts=1 there, 0 in the job)"))
      << ::testing::PrintToString(a.logs);
  timers_.Advance(options_.join_timeout);
  ASSERT_TRUE(a.end);
  EXPECT_NE(a.end->message.find("; node 2 was refused: its flags differ"), std::string::npos) << a.end->message;
}

TEST_F(RendezvousTest, AnElasticRangeAndABackendThatDifferAreNamedToo) {
  options_.params = Params{1, 4, 3, false};
  Add("1").JoinNow();
  Settle();
  options_.params = Params{2, 4, 3, true};
  Node& b = Add("2");
  b.JoinNow();
  Settle();
  ASSERT_TRUE(b.end);
  EXPECT_NE(b.end->message.find("--nnodes=2:4 here, 1:4 in the job"), std::string::npos) << b.end->message;
  EXPECT_NE(b.end->message.find("the rendezvous backend is static here, an elastic one (c10d or etcd) in the job"),
            std::string::npos)
      << b.end->message;
}

TEST_F(RendezvousTest, AFailureOnOneNodeRestartsEveryNodeWithOneJobWideCount) {
  options_.params = Params{2, 2, 3, false};
  auto nodes = Start(2);
  Node& a = *nodes[0];
  Node& b = *nodes[1];
  ASSERT_EQ(a.rounds.size(), 1u);
  Cause c;
  c.host = "host-2";
  c.rank = 3;
  c.what = "exited with code 1";
  b.rdzv->ReportFailure(c);
  b.JoinNow();  // its own workers are stopped by its agent
  Settle();
  ASSERT_EQ(a.stops.size(), 1u);
  EXPECT_NE(a.stops[0].find("node 1 (host-2): rank 3 exited with code 1"), std::string::npos) << a.stops[0];
  ASSERT_EQ(a.rounds.size(), 2u);
  ASSERT_EQ(b.rounds.size(), 2u);
  EXPECT_EQ(a.rounds[1].restart_count, 1);
  EXPECT_EQ(b.rounds[1].restart_count, 1);
  EXPECT_EQ(a.rounds[1].node_rank, 0) << "ranks are stable across restarts";
  EXPECT_EQ(b.rounds[1].master_port, 5001) << "the new round's store of node 0";
}

TEST_F(RendezvousTest, NoRestartsLeftEveryAgentEndsWithTheRootCausesCode) {
  options_.params = Params{2, 2, 0, false};
  auto nodes = Start(2);
  Node& a = *nodes[0];
  Node& b = *nodes[1];
  Cause c;
  c.host = "host-1";
  c.rank = 1;
  c.what = "was killed by signal 9 (SIGKILL)";
  c.exit_code = 137;
  a.rdzv->ReportFailure(c);
  a.JoinNow();
  Settle();
  ASSERT_TRUE(a.end);
  ASSERT_TRUE(b.end);
  EXPECT_EQ(a.end->exit_code, 137);
  EXPECT_EQ(b.end->exit_code, 137);
  EXPECT_TRUE(a.end->cause_is_local);
  EXPECT_FALSE(b.end->cause_is_local);
  ASSERT_TRUE(b.end->cause);
  EXPECT_EQ(b.end->cause->node_rank, 0);
  EXPECT_FALSE(b.end->rendezvous_error);
}

TEST_F(RendezvousTest, ALogLostAfterTheJobClosedDoesNotChangeTheOutcome) {
  options_.params = Params{2, 2, 0, false};
  Node& a = Add("1");
  Node& b = Add("2");
  b.auto_rejoin = false;  // b's workers take long to stop
  a.JoinNow();
  b.JoinNow();
  Settle();
  Cause c;
  c.exit_code = 5;
  a.rdzv->ReportFailure(c);
  a.JoinNow();
  Settle();
  ASSERT_EQ(b.stops.size(), 1u);
  server_->broken = true;  // the store host is gone
  b.JoinNow();             // b's workers are finally gone
  Settle();
  ASSERT_TRUE(b.end);
  EXPECT_FALSE(b.end->rendezvous_error);
  EXPECT_EQ(b.end->exit_code, 5);
}

TEST_F(RendezvousTest, SuccessWaitsForEveryNode) {
  options_.params = Params{2, 2, 0, false};
  auto nodes = Start(2);
  Node& a = *nodes[0];
  Node& b = *nodes[1];
  a.rdzv->ReportSucceeded();
  Settle();
  EXPECT_FALSE(a.end) << "exit barrier: node 2 is still running";
  b.rdzv->ReportSucceeded();
  Settle();
  ASSERT_TRUE(a.end);
  ASSERT_TRUE(b.end);
  EXPECT_EQ(a.end->exit_code, 0);
  EXPECT_EQ(b.end->exit_code, 0);
}

TEST_F(RendezvousTest, SucceededNodeRestartsWhenAnotherFails) {
  options_.params = Params{2, 2, 1, false};
  auto nodes = Start(2);
  Node& a = *nodes[0];
  Node& b = *nodes[1];
  a.rdzv->ReportSucceeded();
  Settle();
  Cause c;
  c.host = "host-2";
  b.rdzv->ReportFailure(c);
  b.JoinNow();
  Settle();
  EXPECT_EQ(a.rounds.size(), 2u);
  EXPECT_EQ(b.rounds.size(), 2u);
  EXPECT_FALSE(a.end);
}

TEST_F(RendezvousTest, JoinTimeoutNamesWhoJoined) {
  options_.params = Params{3, 3, 0, false};
  options_.join_timeout = Seconds(10);
  auto nodes = Start(2);
  Node& a = *nodes[0];
  timers_.Advance(Seconds(11));
  ASSERT_TRUE(a.end);
  EXPECT_TRUE(a.end->rendezvous_error);
  EXPECT_EQ(a.end->exit_code, kExitRendezvous);
  EXPECT_NE(a.end->message.find("timed out after 10 s"), std::string::npos) << a.end->message;
  EXPECT_NE(a.end->message.find("2 node(s) joined round 0 (host-1, host-2), need at least 3"), std::string::npos)
      << a.end->message;
}

TEST_F(RendezvousTest, StaticJoinTimeoutNamesTheMissingNodeRanks) {
  options_.params = Params{3, 3, 0, true};
  options_.join_timeout = Seconds(5);
  Node& a = Add("1");
  NodeDesc d;
  d.host = "host-1";
  d.declared_rank = 1;
  a.rdzv->Join(d);
  Settle();
  timers_.Advance(Seconds(6));
  ASSERT_TRUE(a.end);
  EXPECT_NE(a.end->message.find("host-1 (node 1)"), std::string::npos) << a.end->message;
  EXPECT_NE(a.end->message.find("missing node rank(s): 0, 2"), std::string::npos) << a.end->message;
}

TEST_F(RendezvousTest, ALogOfAnEndedJobIsNotMistakenForThisJobsOutcome) {
  options_.params = Params{1, 1, 0, false};
  options_.run_id = "reused";
  Node& a = Add("1");
  a.JoinNow();
  Settle();
  a.rdzv->ReportSucceeded();
  Settle();
  ASSERT_TRUE(a.end);
  EXPECT_EQ(a.end->exit_code, 0);
  // A new job with the same run id on the same (persistent) log.
  Node& b = Add("2");
  b.JoinNow();
  Settle();
  ASSERT_TRUE(b.end);
  EXPECT_TRUE(b.end->rendezvous_error);
  EXPECT_NE(b.end->message.find("run id 'reused'"), std::string::npos) << b.end->message;
  EXPECT_NE(b.end->message.find("another --rdzv_id"), std::string::npos) << b.end->message;
}

TEST_F(RendezvousTest, LastCallCompletesAnElasticRoundAboveMin) {
  options_.params = Params{2, 4, 0, false};
  options_.last_call = Seconds(2);
  auto nodes = Start(2);
  Node& a = *nodes[0];
  Node& b = *nodes[1];
  EXPECT_TRUE(a.rounds.empty());
  timers_.Advance(Seconds(2));
  ASSERT_EQ(a.rounds.size(), 1u);
  ASSERT_EQ(b.rounds.size(), 1u);
  EXPECT_EQ(a.rounds[0].num_nodes, 2);
}

// A round that falls below MIN before its last call and reaches MIN again gets a last call of
// its own: the one armed first found too few members and completed nothing.
TEST_F(RendezvousTest, ARoundThatFallsBelowMinAndReachesItAgainCompletesAfterAFreshLastCall) {
  options_.params = Params{2, 4, 0, false};
  options_.last_call = Seconds(2);
  auto nodes = Start(2);
  Node& a = *nodes[0];
  Node& b = *nodes[1];
  timers_.Advance(Seconds(1));
  // Node 2 stalls (SIGSTOP, a network cut) past its liveness deadline: it sees nothing of the
  // log until its own overdue last call runs, which finds it dropped, and it joins again.
  server_->waiters.erase(2);
  testing::LoseNode(*server_, timers_, "2");
  Settle();
  timers_.Advance(Seconds(1));
  EXPECT_TRUE(a.rounds.empty()) << "one node is below MIN";
  timers_.Advance(Seconds(2));
  ASSERT_EQ(a.rounds.size(), 1u) << "the round waited for a last call that had passed";
  ASSERT_EQ(b.rounds.size(), 1u);
  EXPECT_EQ(a.rounds[0].num_nodes, 2);
}

TEST_F(RendezvousTest, LostNodeLeavesTheOthersRunningAsASmallerJobWithoutCounting) {
  options_.params = Params{2, 4, 0, false};
  options_.last_call = Seconds(1);
  auto nodes = Start(3, Seconds(1));
  Node& a = *nodes[0];
  Node& b = *nodes[1];
  Node& c = *nodes[2];
  ASSERT_EQ(a.rounds.size(), 1u);
  // Node 3 dies: its Rendezvous is gone, and the liveness deadline reports it.
  c.rdzv.reset();
  testing::LoseNode(*server_, timers_, "3");
  Settle();
  ASSERT_EQ(a.rounds.size(), 2u);
  ASSERT_EQ(b.rounds.size(), 2u);
  EXPECT_EQ(a.rounds[1].num_nodes, 2);
  EXPECT_EQ(a.rounds[1].restart_count, 0);
  EXPECT_NE(a.stops[0].find("host-3"), std::string::npos) << a.stops[0];
}

TEST_F(RendezvousTest, NewNodeJoinsARunningJobAndEveryoneRestartsAsBiggerWithoutCounting) {
  options_.params = Params{2, 4, 0, false};
  options_.last_call = Seconds(1);
  auto nodes = Start(2, Seconds(1));
  Node& a = *nodes[0];
  ASSERT_EQ(a.rounds.size(), 1u);
  Node& c = Add("3");
  c.JoinNow();
  Settle();
  ASSERT_EQ(a.rounds.size(), 2u);
  ASSERT_EQ(c.rounds.size(), 1u);
  EXPECT_EQ(c.rounds[0].num_nodes, 3);
  EXPECT_EQ(c.rounds[0].node_rank, 2);
  EXPECT_EQ(c.rounds[0].restart_count, 0);
}

TEST_F(RendezvousTest, LeaveOfOneAgentRestartsTheOthersWhenMinRemains) {
  options_.params = Params{2, 3, 0, false};
  options_.last_call = Seconds(1);
  auto nodes = Start(3);
  Node& a = *nodes[0];
  Node& c = *nodes[2];
  ASSERT_EQ(a.rounds.size(), 1u);
  c.rdzv->Leave();
  Settle();
  EXPECT_TRUE(c.rdzv->idle());
  ASSERT_EQ(a.rounds.size(), 2u);
  EXPECT_EQ(a.rounds[1].num_nodes, 2);
  EXPECT_FALSE(a.end);
}

TEST_F(RendezvousTest, ABrokenLogEndsTheAgentWithARendezvousError) {
  options_.params = Params{2, 2, 0, false};
  Node& a = Add("1");
  a.JoinNow();
  Settle();
  server_->broken = true;
  Node& b = Add("2");
  Settle();
  ASSERT_TRUE(b.end);
  EXPECT_TRUE(b.end->rendezvous_error);
  EXPECT_NE(b.end->message.find("fake log broken"), std::string::npos);
}

// Every worker of this node succeeded, then the rendezvous is lost (the store host died): only
// the exit barrier is lost, so the node ends with 0, as torchrun's does, and says so.
TEST_F(RendezvousTest, ANodeThatSucceededAndThenLosesTheRendezvousEndsWith0) {
  options_.params = Params{2, 2, 0, false};
  auto nodes = Start(2);
  server_->broken = true;
  nodes[0]->rdzv->ReportSucceeded();
  Settle();
  ASSERT_TRUE(nodes[0]->end);
  EXPECT_EQ(nodes[0]->end->exit_code, 0);
  EXPECT_FALSE(nodes[0]->end->rendezvous_error);
  EXPECT_NE(nodes[0]->end->message.find("fake log broken; every worker on this node had succeeded (the other nodes' "
                                        "outcome is not known here)"),
            std::string::npos)
      << nodes[0]->end->message;
}

// A log that an earlier job with the same run id closed is named as such, even when that job's
// rules differ from this node's.
TEST_F(RendezvousTest, AClosedLogOfAnEarlierJobIsNamedWhateverItsRules) {
  options_.params = Params{1, 1, 0, false};
  auto first = Start(1);
  first[0]->rdzv->ReportSucceeded();
  Settle();
  ASSERT_TRUE(first[0]->end);
  options_.params = Params{2, 2, 0, false};
  Node& late = Add("9");
  late.JoinNow();
  Settle();
  ASSERT_TRUE(late.end);
  EXPECT_NE(late.end->message.find("belongs to a job that already ended"), std::string::npos) << late.end->message;
}

TEST_F(RendezvousTest, EveryNodeIsWatchedByTwoOthersAndNobodyWatchesEveryone) {
  options_.params = Params{5, 5, 0, false};
  Start(5);
  std::map<std::string, int> watchers;
  for (const auto& [client, ids] : server_->watched) {
    EXPECT_EQ(ids.size(), Rendezvous::kWatchedPeers);
    for (const auto& id : ids) watchers[id]++;
  }
  ASSERT_EQ(watchers.size(), 5u);
  for (const auto& [id, n] : watchers) EXPECT_EQ(n, 2) << id;
}

// More entries than the log keeps land between two steps of an agent (many nodes, a slow agent):
// the entry it waits for and the index its report goes to are compacted. It skips to the newest
// entry and carries on; it used to end with "lost the rendezvous".
TEST_F(RendezvousTest, AnAgentThatFellBehindTheCompactedLogSkipsToTheNewestEntry) {
  options_.params = Params{2, 2, 3, false};
  server_->keep = 4;
  auto nodes = Start(2);
  Node& a = *nodes[0];
  Node& b = *nodes[1];
  ASSERT_EQ(a.rounds.size(), 1u);
  FakeRendezvousLog other(server_, timers_);  // another agent's ten entries (the same state)
  const uint64_t next = server_->entries.rbegin()->first + 1;
  auto state = Decode(server_->entries.rbegin()->second);
  ASSERT_TRUE(state.ok());
  for (uint64_t k = 0; k < 10; ++k) {
    state->writer = "other#" + std::to_string(k);
    other.Append(next + k, Encode(*state), [](StatusOr<AppendResult>) {});
  }
  Cause c;  // and a's report, which reaches the log after them
  c.host = "host-1";
  c.rank = 0;
  c.what = "exited with code 1";
  a.rdzv->ReportFailure(c);
  a.JoinNow();
  Settle();
  EXPECT_FALSE(a.end) << a.end->message;
  EXPECT_FALSE(b.end) << b.end->message;
  ASSERT_EQ(b.stops.size(), 1u);
  EXPECT_NE(b.stops[0].find("rank 0 exited with code 1"), std::string::npos) << b.stops[0];
  ASSERT_EQ(a.rounds.size(), 2u);
  ASSERT_EQ(b.rounds.size(), 2u);
  EXPECT_EQ(a.rounds[1].restart_count, 1);
  EXPECT_EQ(server_->entries[next], kCompactedEntry) << "the test's premise";
}

// A node's success reaches the log after another node's leave (which starts a round): the job is
// over, and the node neither stops nor runs its finished workers again.
TEST_F(RendezvousTest, ASuccessThatLosesTheRaceWithALeaveEndsTheJobWithoutRunningAgain) {
  options_.params = Params{1, 2, 0, false};
  auto nodes = Start(2);
  Node& a = *nodes[0];
  Node& b = *nodes[1];
  ASSERT_EQ(a.rounds.size(), 1u);
  b.rdzv->Leave();            // appended first
  a.rdzv->ReportSucceeded();  // loses the race for that entry
  Settle();
  ASSERT_TRUE(a.end);
  EXPECT_EQ(a.end->exit_code, 0) << a.end->message;
  EXPECT_NE(a.end->message.find("every worker on every remaining node succeeded (after node host-2"),
            std::string::npos)
      << a.end->message;
  EXPECT_EQ(a.rounds.size(), 1u) << "ran its workers again";
  EXPECT_TRUE(a.stops.empty()) << a.stops[0];
}

TEST_F(RendezvousTest, ManyNodesConverge) {
  options_.params = Params{16, 16, 0, false};
  std::vector<Node*> all;
  for (int i = 0; i < 16; ++i) all.push_back(&Add(std::to_string(i + 1)));
  for (auto* n : all) n->JoinNow();
  Settle();
  std::vector<bool> seen(16, false);
  for (auto* n : all) {
    ASSERT_EQ(n->rounds.size(), 1u) << n->id;
    seen[static_cast<size_t>(n->rounds[0].node_rank)] = true;
    EXPECT_EQ(n->rounds[0].world_size, 32);
  }
  for (bool s : seen) EXPECT_TRUE(s);
}

}  // namespace
}  // namespace ctrun::rdzv
