// Multi-node agents: real Agents and Rendezvous over an in-memory log, fake spawners and one fake
// clock. No fork, no socket, no sleep: the whole cross-node protocol is exercised in-process.
#include <gtest/gtest.h>

#include <algorithm>

#include "agent/agent.h"
#include "agent/job_outcome.h"
#include "report/run_summary.h"
#include "fakes/fake_rendezvous_log.h"
#include "fakes/fake_spawner.h"
#include "fakes/fake_timer_queue.h"

namespace ctrun {
namespace {

using testing::FakeLogServer;
using testing::FakeRendezvousLog;
using testing::FakeSpawner;
using testing::FakeTimerQueue;

class NodeHooks : public AgentHooks {
 public:
  Status PrepareAttempt(int attempt, AttemptInfo* info) override {
    attempts.push_back(attempt);
    info->master_addr = round.master_addr;
    info->master_port = round.master_port;
    info->use_agent_store = true;
    return Status::Ok();
  }
  Status PrepareJoin(rdzv::NodeDesc* self) override {
    self->host = host;
    self->addr = "10.0.0." + std::to_string(index);
    self->store_port = 7000 + 10 * index + joins++;
    return Status::Ok();
  }
  void OnRound(const rdzv::RoundInfo& r) override { round = r; }
  // The wait for the GPUs' release: recorded; answered Ok at once unless hold_gpu_waits, when the
  // test answers it through gpu_waits[i].ready.
  void BeforeRestart(const std::vector<pid_t>& worker_pids, std::function<void(Status)> ready) override {
    gpu_waits.push_back({worker_pids, ready});
    if (!hold_gpu_waits) ready(Status::Ok());
  }
  void Log(int level, const std::string& msg) override { logs.push_back(std::to_string(level) + " " + msg); }
  bool Logged(const std::string& part) const {
    for (const auto& l : logs)
      if (l.find(part) != std::string::npos) return true;
    return false;
  }

  int index = 0;
  std::string host;
  int joins = 0;
  rdzv::RoundInfo round;
  std::vector<int> attempts;
  std::vector<std::string> logs;
  struct GpuWait {
    std::vector<pid_t> worker_pids;
    std::function<void(Status)> ready;
  };
  bool hold_gpu_waits = false;
  std::vector<GpuWait> gpu_waits;
};

struct Node {
  LaunchConfig config;
  FakeSpawner spawner;
  NodeHooks hooks;
  std::unique_ptr<rdzv::Rendezvous> rdzv;
  std::unique_ptr<Agent> agent;
  size_t first_spec = 0;  // spawner.specs index of the current attempt's first worker

  std::string Env(size_t worker, const std::string& key) const {
    const Environment env = Environment::FromEntries(spawner.specs.at(first_spec + worker).env);
    const std::string* v = env.Get(key);  // points into env: read it while env lives
    return v ? *v : "<unset>";
  }
  pid_t Pid(size_t worker) const { return 1000 + static_cast<pid_t>(first_spec + worker); }
  void Exit(size_t worker, ExitStatus st) {
    spawner.alive_groups.erase(Pid(worker));
    agent->OnChildExit(Pid(worker), st);
  }
  // Every worker still running dies of the signal it was sent.
  void DieOfSignals() {
    for (size_t i = first_spec; i < spawner.specs.size(); ++i) {
      pid_t pid = 1000 + static_cast<pid_t>(i);
      if (!spawner.alive_groups.count(pid)) continue;
      spawner.alive_groups.erase(pid);
      agent->OnChildExit(pid, ExitStatus::Signaled(SIGTERM));
    }
  }
  void NextAttempt() { first_spec = spawner.specs.size(); }
};

class MultiNodeAgentTest : public ::testing::Test {
 protected:
  Node& Add(int nproc, int min_nodes, int max_nodes, int max_restarts = 0, const std::string& role = "default") {
    auto n = std::make_unique<Node>();
    n->config.role = role;
    n->config.nproc_per_node = nproc;
    n->config.entrypoint = "./train";
    n->config.min_nodes = min_nodes;
    n->config.max_nodes = max_nodes;
    n->config.max_restarts = max_restarts;
    n->config.run_id = "job1";
    n->config.rdzv.backend = "c10d";
    n->config.rdzv.multi_node = true;
    n->hooks.index = static_cast<int>(nodes_.size());
    n->hooks.host = "host-" + std::string(1, static_cast<char>('a' + nodes_.size()));
    rdzv::RendezvousOptions o;
    o.params = rdzv::Params{min_nodes, max_nodes, max_restarts, false};
    o.last_call = Seconds(1);
    n->rdzv = std::make_unique<rdzv::Rendezvous>(std::make_unique<FakeRendezvousLog>(server_, timers_), timers_, o,
                                                 n->hooks.host + "/1");
    n->agent = std::make_unique<Agent>(n->config, Environment::FromEntries({"PATH=/bin"}), "/bin/train",
                                       n->spawner, timers_, n->hooks);
    n->agent->AttachRendezvous(n->rdzv.get());
    nodes_.push_back(std::move(n));
    return *nodes_.back();
  }
  void Settle() { timers_.Advance(Duration::zero()); }
  // Nodes a and b of a 2:3 job with one worker each and 3 restarts, a's waits for the GPUs held
  // for the test to answer; both started, round 0 running.
  std::pair<Node*, Node*> TwoNodesWithAsGpuWaitsHeld() {
    Node& a = Add(1, 2, 2, 3);
    Node& b = Add(1, 2, 2, 3);
    a.hooks.hold_gpu_waits = true;
    a.agent->Start();
    b.agent->Start();
    Settle();
    return {&a, &b};
  }
  // a's worker fails, b's dies of the stop signal, and both join the next round (which completes;
  // a's workers then wait for its GPUs).
  void FailAOnce(Node& a, Node& b) {
    a.Exit(0, ExitStatus::Exited(1));
    Settle();
    b.DieOfSignals();
    a.NextAttempt();
    b.NextAttempt();
    Settle();
  }

  std::shared_ptr<FakeLogServer> server_ = std::make_shared<FakeLogServer>();
  FakeTimerQueue timers_;
  std::vector<std::unique_ptr<Node>> nodes_;
};

TEST_F(MultiNodeAgentTest, RanksAreContiguousPerNodeAndTheEnvNamesTheWholeJob) {
  Node& a = Add(4, 2, 2);
  Node& b = Add(2, 2, 2);
  a.agent->Start();
  Settle();
  EXPECT_EQ(a.agent->state(), AgentState::kRendezvous);
  EXPECT_TRUE(a.spawner.specs.empty()) << "no worker before the round is complete";
  b.agent->Start();
  Settle();
  ASSERT_EQ(a.spawner.specs.size(), 4u);
  ASSERT_EQ(b.spawner.specs.size(), 2u);
  EXPECT_EQ(b.Env(0, "RANK"), "4");
  EXPECT_EQ(b.Env(1, "RANK"), "5");
  EXPECT_EQ(b.Env(1, "LOCAL_RANK"), "1");
  EXPECT_EQ(b.Env(0, "WORLD_SIZE"), "6");
  EXPECT_EQ(b.Env(0, "LOCAL_WORLD_SIZE"), "2");
  EXPECT_EQ(b.Env(0, "GROUP_RANK"), "1");
  EXPECT_EQ(b.Env(0, "GROUP_WORLD_SIZE"), "2");
  EXPECT_EQ(b.Env(0, "ROLE_RANK"), "4");
  EXPECT_EQ(b.Env(0, "ROLE_WORLD_SIZE"), "6");
  EXPECT_EQ(b.Env(0, "TORCHELASTIC_RUN_ID"), "job1");
  EXPECT_EQ(b.Env(0, "MASTER_ADDR"), "10.0.0.0");
  EXPECT_EQ(b.Env(0, "MASTER_PORT"), "7000") << "node 0's workers' store of this round";
  EXPECT_EQ(a.Env(3, "MASTER_PORT"), "7000");
}

// Nodes with different --role values: each role's ranks start at 0 and its world is its nodes'
// workers, as torchrun computes them per role.
TEST_F(MultiNodeAgentTest, RoleRanksCountWithinEachRole) {
  Node& a = Add(2, 3, 3, 0, "trainer");
  Node& b = Add(1, 3, 3, 0, "eval");
  Node& c = Add(3, 3, 3, 0, "trainer");
  a.agent->Start();
  b.agent->Start();
  c.agent->Start();
  Settle();
  ASSERT_EQ(c.spawner.specs.size(), 3u);
  EXPECT_EQ(a.Env(1, "ROLE_RANK"), "1");
  EXPECT_EQ(a.Env(1, "ROLE_WORLD_SIZE"), "5");
  EXPECT_EQ(b.Env(0, "ROLE_RANK"), "0");
  EXPECT_EQ(b.Env(0, "ROLE_WORLD_SIZE"), "1");
  EXPECT_EQ(b.Env(0, "ROLE_NAME"), "eval");
  EXPECT_EQ(c.Env(2, "RANK"), "5");
  EXPECT_EQ(c.Env(2, "ROLE_RANK"), "4");
  EXPECT_EQ(c.Env(0, "ROLE_WORLD_SIZE"), "5");
  EXPECT_EQ(c.Env(0, "WORLD_SIZE"), "6");
}

TEST_F(MultiNodeAgentTest, AWorkerFailureOnOneNodeRestartsEveryNodeWithOneCount) {
  Node& a = Add(2, 2, 2, 3);
  Node& b = Add(2, 2, 2, 3);
  a.agent->Start();
  b.agent->Start();
  Settle();
  ASSERT_EQ(a.spawner.specs.size(), 2u);
  b.Exit(1, ExitStatus::Exited(1));
  Settle();
  EXPECT_EQ(a.agent->state(), AgentState::kStopping) << "node a heard of node b's failure";
  EXPECT_EQ(a.spawner.CountSignals(SIGTERM), 2);
  EXPECT_TRUE(a.hooks.Logged("node 1 (host-b): rank 3 exited with code 1")) << a.hooks.logs.back();
  a.DieOfSignals();
  b.DieOfSignals();
  a.NextAttempt();
  b.NextAttempt();
  Settle();
  ASSERT_EQ(a.spawner.specs.size(), 4u);
  ASSERT_EQ(b.spawner.specs.size(), 4u);
  EXPECT_EQ(a.Env(0, "TORCHELASTIC_RESTART_COUNT"), "1");
  EXPECT_EQ(b.Env(1, "TORCHELASTIC_RESTART_COUNT"), "1");
  EXPECT_EQ(b.Env(1, "RANK"), "3");
  EXPECT_EQ(a.Env(0, "MASTER_PORT"), "7001") << "a new store for the new round";
  EXPECT_EQ(a.hooks.attempts, (std::vector<int>{0, 1}));
}

TEST_F(MultiNodeAgentTest, NoRestartsLeftEveryAgentExitsWithTheRootCausesCode) {
  Node& a = Add(2, 2, 2, 0);
  Node& b = Add(2, 2, 2, 0);
  a.agent->Start();
  b.agent->Start();
  Settle();
  b.Exit(0, ExitStatus::Signaled(SIGSEGV));
  Settle();
  a.DieOfSignals();
  b.DieOfSignals();
  Settle();
  ASSERT_TRUE(a.agent->done());
  ASSERT_TRUE(b.agent->done());
  EXPECT_EQ(a.agent->exit_code(), 128 + SIGSEGV);
  EXPECT_EQ(b.agent->exit_code(), 128 + SIGSEGV);
  ASSERT_TRUE(a.agent->job_end());
  EXPECT_FALSE(a.agent->job_end()->cause_is_local);
  EXPECT_TRUE(b.agent->job_end()->cause_is_local);
  // Node a's workers were stopped by ctrun, not failures of their own.
  for (const auto& f : a.agent->failures()) EXPECT_TRUE(f.stopped_by_ctrun);
}

// Node a's worker succeeded but left a process in its group: a sweeps it (up to the shutdown
// timeout). Node b's worker fails meanwhile and the round stops. Once the sweep is over, a does
// not report a success the stopped round cannot take (it would wait for ever): it joins the next
// round, or ends with the job's outcome when no restart is left.
TEST_F(MultiNodeAgentTest, ARoundThatStopsWhileASucceededNodeSweepsIsJoinedAgainAfterTheSweep) {
  Node& a = Add(1, 2, 2, 3);
  Node& b = Add(1, 2, 2, 3);
  a.agent->Start();
  b.agent->Start();
  Settle();
  a.agent->OnChildExit(a.Pid(0), ExitStatus::Exited(0));  // its group keeps a member
  Settle();
  ASSERT_EQ(a.agent->state(), AgentState::kStopping);
  b.Exit(0, ExitStatus::Exited(1));
  Settle();
  a.NextAttempt();
  b.NextAttempt();
  timers_.Advance(Seconds(a.config.shutdown_timeout + 1));  // the sweep SIGKILLs the group
  Settle();
  ASSERT_EQ(a.spawner.specs.size(), 2u) << "node a joined the next round";
  ASSERT_EQ(b.spawner.specs.size(), 2u);
  EXPECT_EQ(a.Env(0, "TORCHELASTIC_RESTART_COUNT"), "1");
}

TEST_F(MultiNodeAgentTest, ARoundThatEndsTheJobWhileASucceededNodeSweepsEndsThatNodeToo) {
  Node& a = Add(1, 2, 2, 0);
  Node& b = Add(1, 2, 2, 0);
  a.agent->Start();
  b.agent->Start();
  Settle();
  a.agent->OnChildExit(a.Pid(0), ExitStatus::Exited(0));
  Settle();
  b.Exit(0, ExitStatus::Exited(7));
  Settle();
  timers_.Advance(Seconds(a.config.shutdown_timeout + 1));
  Settle();
  ASSERT_TRUE(b.agent->done());
  ASSERT_TRUE(a.agent->done()) << "node a waits for nothing";
  EXPECT_EQ(a.agent->exit_code(), 7);
}

// The job's cause is the failure the rendezvous agreed on (rank 2's abort, seen first). Another
// rank here whose error file is older (rank 3 raised first, exited later) would come first in
// ChooseRootCause: the outcome and the summary still name rank 2, whose code is the exit code.
TEST_F(MultiNodeAgentTest, TheOutcomeAndTheSummaryNameTheAgreedRank) {
  Node& a = Add(2, 2, 2, 0);
  Node& b = Add(2, 2, 2, 0);
  a.agent->Start();
  b.agent->Start();
  Settle();
  b.Exit(0, ExitStatus::Signaled(SIGABRT));
  b.Exit(1, ExitStatus::Exited(1));
  Settle();
  a.DieOfSignals();
  Settle();
  ASSERT_TRUE(b.agent->done());
  ASSERT_EQ(b.agent->exit_code(), 128 + SIGABRT);
  const auto t = std::chrono::system_clock::now();
  std::vector<WorkerFailure> failures(2);
  failures[0].global_rank = 2;
  failures[0].status = ExitStatus::Signaled(SIGABRT);
  failures[0].time = t;
  failures[1].global_rank = 3;
  failures[1].local_rank = 1;
  failures[1].status = ExitStatus::Exited(1);
  failures[1].time = t + std::chrono::seconds(1);
  failures[1].error_data = ErrorFileContents{};
  failures[1].error_data->message = "ValueError: raised first";
  failures[1].error_data->timestamp_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>((t - std::chrono::seconds(1)).time_since_epoch()).count();
  ASSERT_EQ(ChooseRootCause(failures), 1u) << "by time alone, rank 3";
  const RunOutcome o = DecideJobOutcome(*b.agent, failures);
  EXPECT_EQ(o.root_cause_rank, 2);
  EXPECT_EQ(o.exit_code, 128 + SIGABRT);
  EXPECT_NE(o.root_cause.find("rank 2 (local_rank 0"), std::string::npos) << o.root_cause;
  SummaryOptions opts;
  opts.agreed_root_rank = 2;
  const std::string summary = FormatFailureSummary("train", failures, "host-b", opts);
  const size_t root = summary.find("Root Cause");
  ASSERT_NE(root, std::string::npos) << summary;
  EXPECT_NE(summary.find("rank      : 2", root), std::string::npos) << summary;
  EXPECT_EQ(RootCauseOf(failures, std::nullopt), 1u);
  EXPECT_EQ(RootCauseOf(failures, 2), 0u);
}

TEST_F(MultiNodeAgentTest, SuccessIsAgreedOnlyWhenEveryNodeSucceeded) {
  Node& a = Add(1, 2, 2);
  Node& b = Add(1, 2, 2);
  a.agent->Start();
  b.agent->Start();
  Settle();
  a.Exit(0, ExitStatus::Exited(0));
  Settle();
  EXPECT_FALSE(a.agent->done()) << "exit barrier";
  b.Exit(0, ExitStatus::Exited(0));
  Settle();
  ASSERT_TRUE(a.agent->done());
  ASSERT_TRUE(b.agent->done());
  EXPECT_EQ(a.agent->exit_code(), 0);
  EXPECT_EQ(b.agent->exit_code(), 0);
  EXPECT_TRUE(a.hooks.gpu_waits.empty()) << "no wait for the GPUs after a success";
}

// --late-exit-notice in the exit barrier: the nodes whose workers outlive this node's are named.
TEST_F(MultiNodeAgentTest, TheExitBarrierNamesTheNodesStillRunningAfterTheLateExitNotice) {
  Node& a = Add(1, 3, 3, 1);
  Node& b = Add(1, 3, 3, 1);
  Node& c = Add(1, 3, 3, 1);
  for (Node* n : {&a, &b, &c}) n->config.late_exit_notice = 60;  // the default, said
  for (Node* n : {&a, &b, &c}) n->agent->Start();
  Settle();
  a.Exit(0, ExitStatus::Exited(0));
  Settle();
  timers_.Advance(Seconds(10));
  b.Exit(0, ExitStatus::Exited(0));
  Settle();
  timers_.Advance(Seconds(50));
  EXPECT_TRUE(a.hooks.Logged("1 every worker on this node exited 0 60 s ago; still running: the workers of node 2 (host-c)"));
  EXPECT_FALSE(b.hooks.Logged("still running"));
  timers_.Advance(Seconds(10));
  EXPECT_TRUE(b.hooks.Logged("1 every worker on this node exited 0 60 s ago; still running: the workers of node 2 (host-c)"));
  EXPECT_FALSE(c.hooks.Logged("still running")) << "c's own worker is the one running: nothing of c's finished";
  timers_.Advance(Seconds(60));
  EXPECT_TRUE(a.hooks.Logged("exited 0 120 s ago; still running: the workers of node 2 (host-c)"));
  // c's worker fails: a restart for every node; the notices belonged to the round that ended.
  c.Exit(0, ExitStatus::Exited(1));
  for (Node* n : {&a, &b, &c}) n->NextAttempt();  // no worker of attempt 0 is left anywhere
  Settle();
  ASSERT_EQ(a.agent->state(), AgentState::kRunning);
  ASSERT_EQ(c.agent->state(), AgentState::kRunning);
  const size_t said = a.hooks.logs.size();
  timers_.Advance(Seconds(600));
  for (size_t i = said; i < a.hooks.logs.size(); ++i) EXPECT_EQ(a.hooks.logs[i].find("still running"), std::string::npos) << a.hooks.logs[i];
  for (Node* n : {&a, &b, &c}) n->Exit(0, ExitStatus::Exited(0));
  Settle();
  EXPECT_TRUE(a.agent->done());
  EXPECT_EQ(a.agent->exit_code(), 0);
}

TEST_F(MultiNodeAgentTest, SignalledAgentLeavesAndTheOthersGoOnWithoutCounting) {
  Node& a = Add(1, 1, 3, 0);
  Node& b = Add(1, 1, 3, 0);
  a.agent->Start();
  b.agent->Start();
  Settle();
  timers_.Advance(Seconds(1));  // last call
  ASSERT_EQ(b.spawner.specs.size(), 1u);
  a.agent->OnSignal(SIGTERM);
  Settle();
  a.DieOfSignals();
  Settle();
  ASSERT_TRUE(a.agent->done());
  EXPECT_EQ(a.agent->exit_code(), 128 + SIGTERM);
  EXPECT_EQ(b.agent->state(), AgentState::kStopping);
  b.DieOfSignals();
  b.NextAttempt();
  Settle();
  ASSERT_EQ(b.spawner.specs.size(), 2u) << "b restarted alone (min 1)";
  EXPECT_EQ(b.Env(0, "WORLD_SIZE"), "1");
  EXPECT_EQ(b.Env(0, "RANK"), "0");
  EXPECT_EQ(b.Env(0, "TORCHELASTIC_RESTART_COUNT"), "0");
  EXPECT_FALSE(b.agent->done());
}

TEST_F(MultiNodeAgentTest, UnexecutableEntrypointEndsEveryNodeWithoutARestartLoop) {
  Node& a = Add(2, 2, 2, 5);
  Node& b = Add(2, 2, 2, 5);
  b.spawner.FailNextSpawn(ENOENT);
  a.agent->Start();
  b.agent->Start();
  Settle();
  a.DieOfSignals();
  b.agent->OnChildExit(b.Pid(0), ExitStatus::Signaled(SIGKILL));  // the one that started, SIGKILLed
  Settle();
  ASSERT_TRUE(a.agent->done());
  ASSERT_TRUE(b.agent->done());
  EXPECT_EQ(a.agent->exit_code(), 127);
  EXPECT_EQ(b.agent->exit_code(), 127);
  EXPECT_EQ(a.spawner.specs.size(), 2u) << "no restart";
}

// --max-run-time: each agent enforces its own; the first to fire closes the job for everyone with
// 124 (a fatal cause), so every agent ends with 124 and calls it the deadline.
TEST_F(MultiNodeAgentTest, TheFirstDeadlineEndsTheJobWith124OnEveryNode) {
  Node& a = Add(2, 2, 2, 3);
  Node& b = Add(2, 2, 2, 3);
  const std::vector<std::pair<Node*, double>> limits{{&a, 10}, {&b, 20}};
  for (const auto& [node, limit] : limits) {
    node->config.max_run_time = limit;
    node->agent = std::make_unique<Agent>(node->config, Environment::FromEntries({"PATH=/bin"}), "/bin/train",
                                          node->spawner, timers_, node->hooks);
    node->agent->AttachRendezvous(node->rdzv.get());
  }
  a.agent->Start();
  b.agent->Start();
  Settle();
  ASSERT_EQ(b.spawner.specs.size(), 2u);
  timers_.Advance(Seconds(10));
  EXPECT_EQ(a.agent->state(), AgentState::kStopping);
  EXPECT_EQ(b.agent->state(), AgentState::kStopping) << "node b heard of node a's deadline";
  a.DieOfSignals();
  b.DieOfSignals();
  Settle();
  ASSERT_TRUE(a.agent->done());
  ASSERT_TRUE(b.agent->done());
  EXPECT_EQ(a.agent->exit_code(), 124);
  EXPECT_EQ(b.agent->exit_code(), 124);
  EXPECT_EQ(a.spawner.specs.size(), 2u) << "no restart after a deadline";
  EXPECT_EQ(a.agent->running_at_deadline(), (std::vector<int>{0, 1}));
  EXPECT_TRUE(b.agent->running_at_deadline().empty()) << "b's own deadline never fired";
  EXPECT_EQ(DecideJobOutcome(*a.agent, {}).kind, OutcomeKind::kMaxRunTime);
  const RunOutcome ob = DecideJobOutcome(*b.agent, {});
  EXPECT_EQ(ob.kind, OutcomeKind::kMaxRunTime);
  EXPECT_EQ(ob.exit_code, 124);
  EXPECT_EQ(ob.root_cause, "node 0 (host-a): reached --max-run-time (10 s)");
}

// attempt_<n> names the round, so one round's directories have the same name on every node,
// also on a node that joined the job after its first round.
TEST_F(MultiNodeAgentTest, EveryNodeNumbersARoundsAttemptTheSame) {
  Node& a = Add(1, 1, 3);
  a.agent->Start();
  Settle();
  timers_.Advance(Seconds(1));  // last call: a runs alone
  ASSERT_EQ(a.spawner.specs.size(), 1u);
  Node& b = Add(1, 1, 3);
  b.agent->Start();
  Settle();
  a.DieOfSignals();  // the newcomer stopped a's round
  a.NextAttempt();
  Settle();
  ASSERT_EQ(a.spawner.specs.size(), 2u);
  ASSERT_EQ(b.spawner.specs.size(), 1u);
  EXPECT_EQ(a.hooks.attempts, (std::vector<int>{0, 1}));
  EXPECT_EQ(b.hooks.attempts, (std::vector<int>{1})) << "b numbers the round it joined as its own first";
  EXPECT_EQ(b.Env(0, "TORCHELASTIC_RESTART_COUNT"), "0");
}

// Multi-node restarts wait for the GPUs' release too, beside the rendezvous: node a's workers are
// gone, it joins the next round at once (the round completes, b's workers start), and a's workers
// start only once its wait says the previous attempt's processes have left the GPUs.
TEST_F(MultiNodeAgentTest, ANodeStartsTheNextRoundsWorkersOnlyOnceItsPreviousOnesLeftTheGpus) {
  Node& a = Add(2, 2, 2, 3);
  Node& b = Add(2, 2, 2, 3);
  a.hooks.hold_gpu_waits = true;
  a.agent->Start();
  b.agent->Start();
  Settle();
  ASSERT_EQ(a.spawner.specs.size(), 2u);
  EXPECT_TRUE(a.hooks.gpu_waits.empty()) << "no wait before the first round";
  const std::vector<pid_t> previous{a.Pid(0), a.Pid(1)};
  a.Exit(0, ExitStatus::Exited(1));
  Settle();
  a.DieOfSignals();
  b.DieOfSignals();
  a.NextAttempt();
  b.NextAttempt();
  Settle();
  ASSERT_EQ(b.spawner.specs.size(), 4u) << "the round did not complete: a's join waited";
  ASSERT_EQ(a.hooks.gpu_waits.size(), 1u) << "no wait for the GPUs";
  EXPECT_EQ(a.hooks.gpu_waits[0].worker_pids, previous);
  EXPECT_EQ(a.spawner.specs.size(), 2u) << "a started workers before its previous ones left the GPUs";
  EXPECT_EQ(a.agent->state(), AgentState::kRendezvous);
  const std::string waiting =
      "0 waiting for the previous attempt's processes to leave the GPUs before starting round 1's workers";
  EXPECT_EQ(std::count(a.hooks.logs.begin(), a.hooks.logs.end(), waiting), 1) << a.hooks.logs.back();
  a.hooks.gpu_waits[0].ready(Status::Ok());
  ASSERT_EQ(a.spawner.specs.size(), 4u);
  EXPECT_EQ(a.agent->state(), AgentState::kRunning);
  EXPECT_EQ(a.Env(0, "TORCHELASTIC_RESTART_COUNT"), "1");
  EXPECT_EQ(a.Env(1, "RANK"), "1");
  EXPECT_EQ(a.Env(0, "MASTER_PORT"), "7001") << "the new round's store";
  EXPECT_EQ(a.hooks.attempts, (std::vector<int>{0, 1}));
  EXPECT_EQ(b.hooks.gpu_waits.size(), 1u) << "b waited too (answered at once)";
}

TEST_F(MultiNodeAgentTest, AGpuWaitAnsweredBeforeTheRoundStartsTheWorkersWhenTheRoundCompletes) {
  auto [pa, pb] = TwoNodesWithAsGpuWaitsHeld();
  Node& a = *pa;
  Node& b = *pb;
  a.Exit(0, ExitStatus::Exited(1));
  a.NextAttempt();
  Settle();
  ASSERT_EQ(a.agent->state(), AgentState::kRendezvous) << "a joined the next round at once";
  ASSERT_EQ(a.hooks.gpu_waits.size(), 1u) << "no wait for the GPUs";
  a.hooks.gpu_waits[0].ready(Status::Ok());
  Settle();
  EXPECT_EQ(a.spawner.specs.size(), 1u) << "b's worker is still stopping: the round is not complete";
  b.DieOfSignals();
  b.NextAttempt();
  Settle();
  ASSERT_EQ(a.spawner.specs.size(), 2u) << "a did not start with the round";
  EXPECT_EQ(a.Env(0, "TORCHELASTIC_RESTART_COUNT"), "1");
  EXPECT_FALSE(a.hooks.Logged("waiting for the previous attempt's processes"));
}

// The wait gives up (the GPUs still held past its bound): node a cannot run workers safely. It
// leaves the job with exit 1 and the wait's message; b and c, above the minimum, re-form without it.
TEST_F(MultiNodeAgentTest, GpusStillHeldMakeTheNodeLeaveAndTheOthersFinishTheJobWithoutIt) {
  Node& a = Add(1, 2, 3, 1);
  Node& b = Add(1, 2, 3, 1);
  Node& c = Add(1, 2, 3, 1);
  a.hooks.hold_gpu_waits = true;
  for (auto& n : nodes_) n->agent->Start();
  Settle();
  ASSERT_EQ(c.spawner.specs.size(), 1u);
  c.Exit(0, ExitStatus::Exited(1));
  Settle();
  for (auto& n : nodes_) {
    n->DieOfSignals();
    n->NextAttempt();
  }
  Settle();
  ASSERT_EQ(b.spawner.specs.size(), 2u) << "round 1 did not complete";
  EXPECT_EQ(b.Env(0, "WORLD_SIZE"), "3") << "a is in round 1";
  ASSERT_EQ(a.hooks.gpu_waits.size(), 1u) << "no wait for the GPUs";
  const std::string held =
      "not restarting: the previous attempt still holds GPUs after 15 s: pid 1000 (GPU 0, state D: uninterruptible, "
      "cannot be killed)";
  a.hooks.gpu_waits[0].ready(Status::Error(held));
  ASSERT_TRUE(a.agent->done());
  EXPECT_EQ(a.agent->exit_code(), 1);
  EXPECT_TRUE(a.agent->setup_failed());
  EXPECT_EQ(a.agent->end_message(), held + "; this node leaves the job");
  EXPECT_TRUE(a.hooks.Logged("2 " + held + "; this node leaves the job")) << a.hooks.logs.back();
  EXPECT_EQ(a.spawner.specs.size(), 1u) << "a started workers on held GPUs";
  const RunOutcome oa = DecideJobOutcome(*a.agent, {});
  EXPECT_EQ(oa.kind, OutcomeKind::kSetupError);
  EXPECT_EQ(oa.exit_code, 1);
  Settle();
  ASSERT_EQ(b.agent->state(), AgentState::kStopping) << "a's leave did not stop round 1";
  for (Node* n : {&b, &c}) {
    n->DieOfSignals();
    n->NextAttempt();
  }
  Settle();
  timers_.Advance(Seconds(1));  // last call: 2 of at most 3
  ASSERT_EQ(b.spawner.specs.size(), 3u) << "b and c did not re-form";
  ASSERT_EQ(c.spawner.specs.size(), 3u);
  EXPECT_EQ(b.Env(0, "WORLD_SIZE"), "2");
  EXPECT_EQ(b.Env(0, "TORCHELASTIC_RESTART_COUNT"), "1") << "a node leaving costs no restart";
  b.Exit(0, ExitStatus::Exited(0));
  c.Exit(0, ExitStatus::Exited(0));
  Settle();
  ASSERT_TRUE(b.agent->done());
  ASSERT_TRUE(c.agent->done());
  EXPECT_EQ(b.agent->exit_code(), 0);
  EXPECT_EQ(c.agent->exit_code(), 0);
}

// Attempt 0's wait answered and its workers ran attempt 1; attempt 1's wait is pending when round
// 2 completes. A late answer of attempt 0's wait (Ok or not) is not the one round 2 waits for.
TEST_F(MultiNodeAgentTest, AnAnswerFromAnEarlierGpuWaitStartsNothing) {
  auto [pa, pb] = TwoNodesWithAsGpuWaitsHeld();
  Node& a = *pa;
  Node& b = *pb;
  FailAOnce(a, b);
  ASSERT_EQ(a.hooks.gpu_waits.size(), 1u) << "no wait for the GPUs";
  a.hooks.gpu_waits[0].ready(Status::Ok());
  ASSERT_EQ(a.spawner.specs.size(), 2u);
  const pid_t attempt1 = a.Pid(0);
  FailAOnce(a, b);
  ASSERT_EQ(b.spawner.specs.size(), 3u) << "round 2 did not complete";
  ASSERT_EQ(a.hooks.gpu_waits.size(), 2u);
  EXPECT_EQ(a.hooks.gpu_waits[1].worker_pids, std::vector<pid_t>{attempt1});
  a.hooks.gpu_waits[0].ready(Status::Ok());
  EXPECT_EQ(a.spawner.specs.size(), 2u) << "attempt 0's answer started round 2's workers";
  a.hooks.gpu_waits[0].ready(Status::Error("not restarting: late"));
  EXPECT_FALSE(a.agent->done()) << "attempt 0's answer ended the run";
  a.hooks.gpu_waits[1].ready(Status::Ok());
  ASSERT_EQ(a.spawner.specs.size(), 3u);
  EXPECT_EQ(a.Env(0, "TORCHELASTIC_RESTART_COUNT"), "2");
}

// The round a's workers wait for stops before the wait answers (b's worker fails in it): a joins
// again, still waiting (one wait per attempt, not restarted), and the answer starts the workers of
// the round complete by then, with that round's env.
TEST_F(MultiNodeAgentTest, ARoundThatStopsWhileItsWorkersWaitForTheGpusPassesTheWaitToTheNext) {
  auto [pa, pb] = TwoNodesWithAsGpuWaitsHeld();
  Node& a = *pa;
  Node& b = *pb;
  FailAOnce(a, b);
  ASSERT_EQ(b.spawner.specs.size(), 2u) << "round 1 did not complete";
  b.Exit(0, ExitStatus::Exited(1));
  b.NextAttempt();
  Settle();
  ASSERT_EQ(b.spawner.specs.size(), 3u) << "round 2 did not complete";
  EXPECT_EQ(a.spawner.specs.size(), 1u);
  EXPECT_TRUE(a.hooks.Logged("before starting round 2's workers")) << a.hooks.logs.back();
  ASSERT_EQ(a.hooks.gpu_waits.size(), 1u) << "the wait was restarted";
  a.hooks.gpu_waits[0].ready(Status::Ok());
  ASSERT_EQ(a.spawner.specs.size(), 2u);
  EXPECT_EQ(a.hooks.attempts, (std::vector<int>{0, 2})) << "round 1's workers never started";
  EXPECT_EQ(a.Env(0, "TORCHELASTIC_RESTART_COUNT"), "2");
  EXPECT_EQ(a.Env(0, "MASTER_PORT"), b.Env(0, "MASTER_PORT"));
}

// A signal while the workers wait for the GPUs ends this node; the answer that follows starts
// nothing.
TEST_F(MultiNodeAgentTest, ASignalWhileWaitingForTheGpusStartsNothingAfterwards) {
  auto [pa, pb] = TwoNodesWithAsGpuWaitsHeld();
  Node& a = *pa;
  Node& b = *pb;
  FailAOnce(a, b);
  ASSERT_EQ(b.spawner.specs.size(), 2u) << "round 1 did not complete";
  a.agent->OnSignal(SIGTERM);
  ASSERT_TRUE(a.agent->done());
  EXPECT_EQ(a.agent->exit_code(), 128 + SIGTERM);
  ASSERT_EQ(a.hooks.gpu_waits.size(), 1u) << "no wait for the GPUs";
  a.hooks.gpu_waits[0].ready(Status::Ok());
  Settle();
  EXPECT_EQ(a.spawner.specs.size(), 1u) << "workers started after the signal";
  EXPECT_TRUE(a.agent->done());
}

// A node dies (its agent and workers killed at once): the others' workers fail at once of the
// closed connections (SIGPIPE here, gloo's "Connection closed by peer" in a real job), long
// before the dead node's liveness deadline. Those failures wait for the rendezvous, which reports
// the node lost: a membership change that costs no restart and blames no healthy rank, so a
// job with max_restarts=0 goes on with the nodes that remain (2 of 2:3).
class NodeDeathTest : public MultiNodeAgentTest {
 protected:
  void StartThree() {
    for (int i = 0; i < 3; ++i) Add(1, 2, 3, 0);
    for (auto& n : nodes_) n->agent->Start();
    Settle();
    ASSERT_EQ(nodes_[0]->spawner.specs.size(), 1u);
    ASSERT_EQ(nodes_[2]->spawner.specs.size(), 1u);
  }
  // Node c dies; a's and b's workers lose their peer.
  void KillNodeC() {
    nodes_[2].reset();
    for (int i = 0; i < 2; ++i) nodes_[i]->Exit(0, ExitStatus::Signaled(SIGPIPE));
    Settle();
  }
};

TEST_F(NodeDeathTest, AFailureThatLostAPeerWaitsForTheRendezvousAndANodeLostCostsNoRestart) {
  StartThree();
  KillNodeC();
  Node& a = *nodes_[0];
  Node& b = *nodes_[1];
  EXPECT_EQ(a.agent->state(), AgentState::kRunning) << "counted at once";
  EXPECT_TRUE(a.hooks.Logged("may be on a node that died")) << a.hooks.logs.back();
  timers_.Advance(Seconds(10));  // within the default deadline (15 s + one 5 s interval)
  EXPECT_FALSE(a.agent->done());
  a.NextAttempt();
  b.NextAttempt();
  testing::LoseNode(*server_, timers_, "host-c/1");
  Settle();  // the next round expects a and b alone: complete once both are back
  ASSERT_EQ(a.spawner.specs.size(), 2u) << "a did not start the next round";
  ASSERT_EQ(b.spawner.specs.size(), 2u);
  EXPECT_FALSE(a.agent->done());
  EXPECT_EQ(a.Env(0, "WORLD_SIZE"), "2");
  EXPECT_EQ(b.Env(0, "TORCHELASTIC_RESTART_COUNT"), "0") << "the node's loss was counted as a failure";
  EXPECT_TRUE(a.hooks.Logged("host-c")) << "the lost node is not named";
}

TEST_F(NodeDeathTest, WithoutANodeLostTheFailureCountsAtTheDeadline) {
  StartThree();
  KillNodeC();
  Node& a = *nodes_[0];
  timers_.Advance(Seconds(19));
  EXPECT_FALSE(a.agent->done());
  timers_.Advance(Seconds(1));
  Settle();
  ASSERT_TRUE(a.agent->done());
  EXPECT_EQ(a.agent->exit_code(), 128 + SIGPIPE);
  EXPECT_TRUE(a.hooks.Logged("no node was reported lost within 20 s")) << a.hooks.logs.back();
}

TEST_F(NodeDeathTest, AnotherNodesOwnFailureEndsTheWaitAndIsTheCause) {
  StartThree();
  Node& a = *nodes_[0];
  Node& c = *nodes_[2];
  a.Exit(0, ExitStatus::Signaled(SIGPIPE));
  Settle();
  EXPECT_EQ(a.agent->state(), AgentState::kRunning);
  c.Exit(0, ExitStatus::Exited(3));  // the peer that went away, on its own
  Settle();
  nodes_[1]->DieOfSignals();
  Settle();
  ASSERT_TRUE(a.agent->done());
  EXPECT_EQ(a.agent->exit_code(), 3);
  ASSERT_TRUE(a.agent->job_end() && a.agent->job_end()->cause);
  EXPECT_EQ(a.agent->job_end()->cause->rank, 2);
}

}  // namespace
}  // namespace ctrun
