#include "rendezvous/rdzv_state.h"

#include <gtest/gtest.h>

namespace ctrun::rdzv {
namespace {

NodeDesc Node(const std::string& id, int nproc = 2, int declared = -1) {
  NodeDesc n;
  n.id = id;
  n.host = "host-" + id;
  n.addr = "10.0.0." + std::to_string(id.size());
  n.store_port = 1000 + static_cast<int>(id.size());
  n.nproc = nproc;
  n.declared_rank = declared;
  return n;
}

Params Elastic(int min, int max, int restarts = 3) { return Params{min, max, restarts, false}; }

State Must(const std::optional<State>& s) {
  EXPECT_TRUE(s.has_value());
  return s.value_or(State{});
}

State JoinAll(State s, const Params& p, const std::vector<NodeDesc>& nodes) {
  for (const auto& n : nodes) s = Must(Apply(s, Transition::Join(n), p));
  return s;
}

std::vector<std::string> MemberIds(const State& s) {
  std::vector<std::string> out;
  for (const auto& n : s.members) out.push_back(n.id);
  return out;
}

Cause Failure(int rank, int code) {
  Cause c;
  c.host = "host-b";
  c.rank = rank;
  c.what = "exited with code " + std::to_string(code);
  c.exit_code = code;
  return c;
}

TEST(RdzvState, RoundCompletesAtMaxNodesInArrivalOrder) {
  Params p = Elastic(2, 3);
  State s = JoinAll(State{}, p, {Node("b"), Node("a")});
  EXPECT_EQ(s.phase, Phase::kJoin);
  s = Must(Apply(s, Transition::Join(Node("c")), p));
  EXPECT_EQ(s.phase, Phase::kRun);
  EXPECT_EQ(MemberIds(s), (std::vector<std::string>{"b", "a", "c"}));
  EXPECT_EQ(s.NodeRank("a"), 1);
  // Joining twice changes nothing.
  EXPECT_FALSE(Apply(s, Transition::Join(Node("a")), p));
}

TEST(RdzvState, LastCallCompletesOnlyWithMinNodes) {
  Params p = Elastic(2, 4);
  State s = JoinAll(State{}, p, {Node("a")});
  EXPECT_FALSE(Apply(s, Transition::Complete(0), p));
  s = JoinAll(s, p, {Node("b")});
  EXPECT_FALSE(Apply(s, Transition::Complete(1), p)) << "another round's last call";
  s = Must(Apply(s, Transition::Complete(0), p));
  EXPECT_EQ(s.phase, Phase::kRun);
  EXPECT_EQ(s.members.size(), 2u);
}

TEST(RdzvState, StaticRanksAreTheDeclaredOnesAndConflictsAreNamed) {
  Params p{3, 3, 0, true};
  State s = JoinAll(State{}, p, {Node("x", 1, 2), Node("y", 1, 0)});
  EXPECT_FALSE(Apply(s, Transition::Join(Node("z", 1, 2)), p));
  EXPECT_NE(JoinBlocker(s, Node("z", 1, 2), p).find("node rank 2 is already taken by host-x"), std::string::npos);
  s = Must(Apply(s, Transition::Join(Node("w", 1, 1)), p));
  EXPECT_EQ(s.phase, Phase::kRun);
  EXPECT_EQ(MemberIds(s), (std::vector<std::string>{"y", "w", "x"}));
}

TEST(RdzvState, FailureWithRestartsLeftStartsACountedRoundThatCompletesWhenAllAreBack) {
  Params p = Elastic(2, 4, 2);
  State s = JoinAll(State{}, p, {Node("a"), Node("b"), Node("c")});
  s = Must(Apply(s, Transition::Complete(0), p));
  s = Must(Apply(s, Transition::Fail(0, "b", Failure(3, 1)), p));
  EXPECT_EQ(s.phase, Phase::kJoin);
  EXPECT_EQ(s.round, 1u);
  EXPECT_EQ(s.restarts, 1);
  ASSERT_TRUE(s.cause);
  EXPECT_EQ(s.cause->node_rank, 1);
  EXPECT_NE(s.reason.find("node 1 (host-b): rank 3 exited with code 1"), std::string::npos) << s.reason;
  // A second failure report of the finished round changes nothing (one restart per round).
  EXPECT_FALSE(Apply(s, Transition::Fail(0, "a", Failure(0, 1)), p));
  // Everyone expected is back: complete at once (no last call), previous order kept.
  s = JoinAll(s, p, {Node("c"), Node("a")});
  EXPECT_EQ(s.phase, Phase::kJoin);
  s = JoinAll(s, p, {Node("b")});
  EXPECT_EQ(s.phase, Phase::kRun);
  EXPECT_EQ(MemberIds(s), (std::vector<std::string>{"a", "b", "c"}));
}

TEST(RdzvState, FailureWithoutRestartsClosesWithItsExitCode) {
  Params p = Elastic(2, 2, 1);
  State s = JoinAll(State{}, p, {Node("a"), Node("b")});
  s = Must(Apply(s, Transition::Fail(0, "b", Failure(2, 7)), p));
  s = JoinAll(s, p, {Node("a"), Node("b")});
  s = Must(Apply(s, Transition::Fail(1, "a", Failure(0, 137)), p));
  EXPECT_EQ(s.phase, Phase::kClosed);
  EXPECT_EQ(s.exit_code, 137);
  EXPECT_NE(s.message.find("no restarts left"), std::string::npos);
  EXPECT_FALSE(Apply(s, Transition::Join(Node("a")), p));
}

TEST(RdzvState, FatalFailureClosesEvenWithRestartsLeft) {
  Params p = Elastic(1, 1, 5);
  State s = JoinAll(State{}, p, {Node("a")});
  Cause c = Failure(0, 127);
  c.fatal = true;
  s = Must(Apply(s, Transition::Fail(0, "a", c), p));
  EXPECT_EQ(s.phase, Phase::kClosed);
  EXPECT_EQ(s.exit_code, 127);
}

TEST(RdzvState, JobSucceedsWhenEveryMemberSucceeded) {
  Params p = Elastic(2, 2);
  State s = JoinAll(State{}, p, {Node("a"), Node("b")});
  s = Must(Apply(s, Transition::Succeed(0, "a"), p));
  EXPECT_EQ(s.phase, Phase::kRun);
  EXPECT_FALSE(Apply(s, Transition::Succeed(0, "a"), p));
  s = Must(Apply(s, Transition::Succeed(0, "b"), p));
  EXPECT_EQ(s.phase, Phase::kClosed);
  EXPECT_EQ(s.exit_code, 0);
}

// A node that leaves (or is lost) after every other member's workers succeeded ends the job: a
// new round would start the finished workers again at the smaller size.
TEST(RdzvState, ANodeGoneAfterTheOthersSucceededEndsTheJobInsteadOfARound) {
  Params p = Elastic(1, 3);
  for (const auto kind : {Transition::Kind::kLeave, Transition::Kind::kLost}) {
    State s = JoinAll(State{}, p, {Node("a"), Node("b"), Node("c")});
    s = Must(Apply(s, Transition::Succeed(0, "a"), p));
    const Transition gone = kind == Transition::Kind::kLeave ? Transition::Leave("c") : Transition::Lost("c");
    State restarted = Must(Apply(s, gone, p));  // b has not succeeded: the survivors restart
    EXPECT_EQ(restarted.phase, Phase::kJoin);
    EXPECT_EQ(restarted.round, 1u);
    s = Must(Apply(s, Transition::Succeed(0, "b"), p));
    s = Must(Apply(s, gone, p));
    EXPECT_EQ(s.phase, Phase::kClosed);
    EXPECT_EQ(s.exit_code, 0);
    EXPECT_EQ(s.round, 0u);
    EXPECT_NE(s.message.find("every worker on every remaining node succeeded (node host-c "), std::string::npos)
        << s.message;
  }
}

// A node whose workers succeeded and which then goes (its agent stopped at the exit barrier, or
// lost) leaves the running nodes' round alone; their success then ends the job.
TEST(RdzvState, AFinishedNodeThatGoesLeavesTheOthersRoundAlone) {
  Params p = Elastic(1, 3);
  for (const auto kind : {Transition::Kind::kLeave, Transition::Kind::kLost}) {
    State s = JoinAll(State{}, p, {Node("a"), Node("b")});
    s = Must(Apply(s, Transition::Complete(0), p));
    s = Must(Apply(s, Transition::Succeed(0, "a"), p));
    s = Must(Apply(s, kind == Transition::Kind::kLeave ? Transition::Leave("a") : Transition::Lost("a"), p));
    EXPECT_EQ(s.phase, Phase::kRun);
    EXPECT_EQ(s.round, 0u) << "no new round for b";
    EXPECT_EQ(MemberIds(s), (std::vector<std::string>{"b"}));
    s = Must(Apply(s, Transition::Succeed(0, "b"), p));
    EXPECT_EQ(s.phase, Phase::kClosed);
    EXPECT_EQ(s.exit_code, 0);
  }
}

// Once a member's workers all succeeded the job is finishing: a newcomer waits instead of
// starting a round that would run the finished workers again; it gets the job's outcome.
TEST(RdzvState, ANewcomerWaitsWhileAMemberHasSucceeded) {
  Params p = Elastic(1, 3);
  State s = JoinAll(State{}, p, {Node("a"), Node("b")});
  s = Must(Apply(s, Transition::Complete(0), p));
  s = Must(Apply(s, Transition::Succeed(0, "a"), p));
  s = Must(Apply(s, Transition::Join(Node("c")), p));
  EXPECT_EQ(s.phase, Phase::kRun);
  EXPECT_EQ(s.round, 0u);
  EXPECT_TRUE(s.IsWaiting("c"));
  s = Must(Apply(s, Transition::Succeed(0, "b"), p));
  EXPECT_EQ(s.phase, Phase::kClosed);
  EXPECT_EQ(s.exit_code, 0);
}

// A node's success and another node's leave race to the log. When the leave lands first, it
// starts a round (a membership change); the success that lands after it still counts, and once
// every remaining member of the old round succeeded the job is over: a new round would run
// finished workers again (it did: a CI run saw the finished node run its workers twice).
TEST(RdzvState, ASuccessThatLandsAfterAMembershipChangeStillFinishesTheJob) {
  Params p = Elastic(1, 3);
  for (const auto kind : {Transition::Kind::kLeave, Transition::Kind::kLost}) {
    auto gone = [&](const std::string& id) {
      return kind == Transition::Kind::kLeave ? Transition::Leave(id) : Transition::Lost(id);
    };
    State s = JoinAll(State{}, p, {Node("a"), Node("b"), Node("c")});
    s = Must(Apply(s, gone("c"), p));
    EXPECT_EQ(s.phase, Phase::kJoin);
    EXPECT_EQ(s.round, 1u);
    EXPECT_EQ(s.may_finish, (std::vector<std::string>{"a", "b"}));
    s = Must(Apply(s, Transition::Succeed(0, "a"), p));
    EXPECT_EQ(s.phase, Phase::kJoin) << "b has not finished";
    EXPECT_FALSE(Apply(s, Transition::Succeed(0, "a"), p)) << "applied once";
    EXPECT_FALSE(Apply(s, Transition::Succeed(1, "b"), p)) << "round 1 is not running";
    State finished = Must(Apply(s, Transition::Succeed(0, "b"), p));
    EXPECT_EQ(finished.phase, Phase::kClosed);
    EXPECT_EQ(finished.exit_code, 0);
    EXPECT_NE(finished.message.find("every worker on every remaining node succeeded"), std::string::npos)
        << finished.message;
    // Or b goes too: a, the only one left of round 0, had finished.
    finished = Must(Apply(s, gone("b"), p));
    EXPECT_EQ(finished.phase, Phase::kClosed);
    EXPECT_EQ(finished.exit_code, 0);
    EXPECT_TRUE(finished.may_finish.empty());
    // Or b comes back before it finished: the round runs both again, as after any membership change.
    s = JoinAll(s, p, {Node("b"), Node("a")});
    EXPECT_EQ(s.phase, Phase::kRun);
    EXPECT_TRUE(s.done.empty());
    EXPECT_TRUE(s.may_finish.empty());
    EXPECT_FALSE(Apply(s, Transition::Succeed(0, "b"), p)) << "round 0's success is stale now";
  }
}

// A failure restarts every node whatever else succeeded: its round takes no late success.
TEST(RdzvState, ASuccessThatLandsAfterAFailureChangesNothing) {
  Params p = Elastic(1, 2);
  State s = JoinAll(State{}, p, {Node("a"), Node("b")});
  s = Must(Apply(s, Transition::Fail(0, "b", Failure(1, 1)), p));
  EXPECT_EQ(s.phase, Phase::kJoin);
  EXPECT_TRUE(s.may_finish.empty());
  EXPECT_FALSE(Apply(s, Transition::Succeed(0, "a"), p));
}

TEST(RdzvState, NewcomerRestartsTheJobWithoutCountingWhenThereIsRoom) {
  Params p = Elastic(2, 3, 0);
  State s = JoinAll(State{}, p, {Node("a"), Node("b")});
  s = Must(Apply(s, Transition::Complete(0), p));
  s = Must(Apply(s, Transition::Join(Node("c")), p));
  EXPECT_EQ(s.phase, Phase::kJoin);
  EXPECT_EQ(s.round, 1u);
  EXPECT_EQ(s.restarts, 0);
  s = JoinAll(s, p, {Node("b"), Node("a")});
  EXPECT_EQ(s.phase, Phase::kRun);
  EXPECT_EQ(MemberIds(s), (std::vector<std::string>{"a", "b", "c"}));
  // Full now: a fourth node waits.
  s = Must(Apply(s, Transition::Join(Node("d")), p));
  EXPECT_EQ(s.phase, Phase::kRun);
  EXPECT_TRUE(s.IsWaiting("d"));
}

TEST(RdzvState, LostMemberRestartsWithTheSurvivors) {
  Params p = Elastic(2, 4, 0);
  State s = JoinAll(State{}, p, {Node("a"), Node("b"), Node("c")});
  s = Must(Apply(s, Transition::Complete(0), p));
  s = Must(Apply(s, Transition::Lost("b"), p));
  EXPECT_EQ(s.phase, Phase::kJoin);
  EXPECT_EQ(s.restarts, 0);
  // Named so that one of several agents on a host can be told apart: node rank and id.
  EXPECT_NE(s.reason.find("(node rank 1, b) was lost (no heartbeat)"), std::string::npos) << s.reason;
  EXPECT_EQ(s.expected, (std::vector<std::string>{"a", "c"}));
  EXPECT_FALSE(Apply(s, Transition::Lost("b"), p));
  s = JoinAll(s, p, {Node("c"), Node("a")});
  EXPECT_EQ(s.phase, Phase::kRun);
  EXPECT_EQ(MemberIds(s), (std::vector<std::string>{"a", "c"}));
}

TEST(RdzvState, LossWhileJoiningLetsTheOthersComplete) {
  Params p = Elastic(2, 4, 0);
  State s = JoinAll(State{}, p, {Node("a"), Node("b"), Node("c")});
  s = Must(Apply(s, Transition::Complete(0), p));
  s = Must(Apply(s, Transition::Fail(0, "a", Failure(0, 1)), p));
  EXPECT_EQ(s.phase, Phase::kClosed) << "max_restarts=0";
  p.max_restarts = 1;
  s = JoinAll(State{}, p, {Node("a"), Node("b"), Node("c")});
  s = Must(Apply(s, Transition::Complete(0), p));
  s = Must(Apply(s, Transition::Fail(0, "a", Failure(0, 1)), p));
  s = JoinAll(s, p, {Node("a"), Node("c")});
  EXPECT_EQ(s.phase, Phase::kJoin);
  s = Must(Apply(s, Transition::Leave("b"), p));
  EXPECT_EQ(s.phase, Phase::kRun);
  EXPECT_EQ(MemberIds(s), (std::vector<std::string>{"a", "c"}));
}

// "cannot execute ./tr\xe9in" (a Latin-1 file name that is missing on one node) is a fatal cause
// every node must read, not an exception out of the rendezvous.
TEST(RdzvState, ACauseThatIsNotUtf8IsEncodedWithReplacementCharacters) {
  Params p = Elastic(1, 2, 0);
  State s = JoinAll(State{}, p, {Node("a")});
  s = Must(Apply(s, Transition::Complete(0), p));
  Cause c = Failure(0, 127);
  c.what = "cannot execute ./tr\xe9in";
  c.fatal = true;
  s = Must(Apply(s, Transition::Fail(0, "a", c), p));
  std::string text;
  ASSERT_NO_THROW(text = Encode(s));
  auto back = Decode(text);
  ASSERT_TRUE(back.ok()) << back.message();
  ASSERT_TRUE(back->cause);
  EXPECT_EQ(back->cause->what, "cannot execute ./tr\xef\xbf\xbdin");
}

TEST(RdzvState, EncodeDecodeRoundTrip) {
  Params p = Elastic(2, 4, 3);
  State s = JoinAll(State{}, p, {Node("a", 4, -1), Node("b", 2, -1), Node("c")});
  s = Must(Apply(s, Transition::Complete(0), p));
  s = Must(Apply(s, Transition::Fail(0, "b", Failure(5, 3)), p));
  s = JoinAll(s, p, {Node("a", 4, -1)});
  s.may_finish = {"a", "c"};
  s.done = {"c"};
  s.writer = "a#7";
  s.params = p;
  s.params_from = "a";
  auto back = Decode(Encode(s));
  ASSERT_TRUE(back.ok()) << back.message();
  EXPECT_EQ(*back, s);
}

// A refusal is recorded in its own entry, changes nothing else, and the next transition drops it.
TEST(RdzvState, ARefusalIsRecordedInItsEntryAloneAndRoundTrips) {
  Params p = Elastic(2, 2, 0);
  State s = JoinAll(State{}, p, {Node("a")});
  const Params theirs = Elastic(3, 3, 1);
  State refused = Must(Apply(s, Transition::Refuse("x", theirs), p));
  ASSERT_TRUE(refused.refused);
  EXPECT_EQ(refused.refused->id, "x");
  EXPECT_EQ(refused.refused->params, theirs);
  State without = refused;
  without.refused.reset();
  EXPECT_EQ(without, s) << "a refusal changes nothing but the record";
  auto back = Decode(Encode(refused));
  ASSERT_TRUE(back.ok()) << back.message();
  EXPECT_EQ(*back, refused);
  State next = Must(Apply(refused, Transition::Join(Node("b")), p));
  EXPECT_FALSE(next.refused);
  EXPECT_EQ(ParamsMismatch(theirs, p, "there"), "--nnodes=3 there, 2 in the job; --max_restarts=1 there, 0 in the job");
  State closed = Must(Apply(Must(Apply(next, Transition::Succeed(0, "a"), p)), Transition::Succeed(0, "b"), p));
  ASSERT_EQ(closed.phase, Phase::kClosed);
  EXPECT_FALSE(Apply(closed, Transition::Refuse("x", theirs), p)) << "a closed job records no refusal";
}

TEST(RdzvState, DecodeRejectsGarbageWithAMessage) {
  EXPECT_FALSE(Decode("").ok());
  EXPECT_FALSE(Decode("[1,2]").ok());
  EXPECT_FALSE(Decode("{\"v\":4}").ok());
  // Another release's format (1: before the job's rules were in the state; 2: before may_finish;
  // 3: before members' roles) names the cause.
  for (const char* other : {"{\"v\":1}", "{\"v\":2}", "{\"v\":3}", "{\"v\":5}"}) {
    auto r = Decode(other);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.message().find("every node of a job must run the same ctrun release"), std::string::npos)
        << r.message();
  }
  State s;
  std::string text = Encode(s);
  text.replace(text.find("\"join\""), 6, "\"zzzz\"");
  EXPECT_FALSE(Decode(text).ok());
}

// Found by rdzv_state_fuzz: a number that does not fit the field ("nproc":44e+88) was converted
// with undefined behaviour. Every integer field is checked: floats, out-of-range and negative
// values where none fit are refused with the field's name.
TEST(RdzvState, DecodeRefusesNumbersThatDoNotFitTheirField) {
  Params p = Elastic(1, 2, 1);
  State s = JoinAll(State{}, p, {Node("a", 4, -1)});
  const std::string good = Encode(s);
  ASSERT_TRUE(Decode(good).ok());
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"nproc\":4", "\"nproc\":44e+88"},
           {"\"nproc\":4", "\"nproc\":1.5"},
           {"\"nproc\":4", "\"nproc\":4294967296"},
           {"\"round\":0", "\"round\":-1"},
           {"\"restarts\":0", "\"restarts\":1e300"}}) {
    std::string text = good;
    const auto at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from << " in " << good;
    text.replace(at, from.size(), to);
    auto r = Decode(text);
    ASSERT_FALSE(r.ok()) << to;
    const std::string field = from.substr(0, from.find(':'));
    EXPECT_NE(r.message().find(field.substr(1, field.size() - 2)), std::string::npos) << r.message();
  }
}

}  // namespace
}  // namespace ctrun::rdzv
