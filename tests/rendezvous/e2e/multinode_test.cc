// Multi-node jobs on one machine: several real ctrun agents as processes on loopback, meeting
// through the static or c10d rendezvous, running the fake worker. Every wait polls against a
// deadline; every agent and worker is checked gone at the end.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "base/unique_fd.h"
#include "sys/free_port.h"
#include "helpers/ctrun_command.h"
#include "helpers/free_port.h"
#include "helpers/test_util.h"

namespace ctrun::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;


// Fast rendezvous timings for tests: 1 s heartbeat deadline, 1 s last call.
const std::string kFastConf = "--rdzv_conf=join_timeout=60,last_call_timeout=1,keep_alive_max_attempt=5";

class Agents {
 public:
  explicit Agents(TempDir& dir) : dir_(dir) {}
  // Starts agent `name` with ctrun flags and fake-worker args.
  void Start(const std::string& name, const std::vector<std::string>& flags, const std::vector<std::string>& worker,
             const std::vector<std::string>& env = {}) {
    procs_[name] = std::make_unique<BackgroundProcess>(Ctrun(flags, worker), env, dir_ / (name + ".out"),
                                                       dir_ / (name + ".err"));
  }
  int Wait(const std::string& name, milliseconds timeout = seconds(60)) { return procs_.at(name)->Wait(timeout); }
  BackgroundProcess& operator[](const std::string& name) { return *procs_.at(name); }
  std::string Err(const std::string& name) const { return ReadFileOr(dir_ / (name + ".err")); }

 private:
  TempDir& dir_;
  std::map<std::string, std::unique_ptr<BackgroundProcess>> procs_;
};


void ExpectAllGone(const std::string& pid_file) {
  for (pid_t p : ReadPids(pid_file))
    EXPECT_TRUE(WaitFor([&] { return !ProcessAlive(p); }, seconds(10))) << "worker pid " << p << " outlived the job";
}

// conf: more --rdzv_conf keys ("k=v,...").
std::vector<std::string> C10d(int port, const std::string& nnodes, int nproc, std::vector<std::string> extra = {},
                              const std::string& conf = "") {
  std::vector<std::string> f{"--nnodes=" + nnodes, "--nproc_per_node=" + std::to_string(nproc), "--rdzv_backend=c10d",
                             "--rdzv_endpoint=127.0.0.1:" + std::to_string(port), "--rdzv_id=job",
                             kFastConf + ",keep_alive_interval=0.2" + (conf.empty() ? "" : "," + conf),
                             "--shutdown-timeout=5"};
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

// Flags of node `node` of a static job on loopback: node 0 hosts the rendezvous store at `port`.
std::vector<std::string> Static(int port, int nnodes, int nproc, int node, std::vector<std::string> extra = {}) {
  std::vector<std::string> f{"--nnodes=" + std::to_string(nnodes), "--nproc_per_node=" + std::to_string(nproc),
                             "--node_rank=" + std::to_string(node), "--master_addr=127.0.0.1",
                             "--master_port=" + std::to_string(port), kFastConf + ",keep_alive_interval=0.2"};
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

TEST(MultiNode, StaticTwoNodesOfTwoWorkers) {
  TempDir dir;
  Agents agents(dir);
  const int port = FreePort();
  for (int node : {1, 0}) {
    agents.Start("n" + std::to_string(node), Static(port, 2, 2, node),
                 {"--env-file", dir / "env", "--pid-file", dir / "pids"});
  }
  EXPECT_EQ(agents.Wait("n0"), 0) << agents.Err("n0");
  EXPECT_EQ(agents.Wait("n1"), 0) << agents.Err("n1");
  std::set<std::string> master_ports;
  for (int rank = 0; rank < 4; ++rank) {
    auto env = ReadEnvFile(dir / ("env." + std::to_string(rank)));
    EXPECT_EQ(env["WORLD_SIZE"], "4");
    EXPECT_EQ(env["GROUP_RANK"], std::to_string(rank / 2));
    EXPECT_EQ(env["GROUP_WORLD_SIZE"], "2");
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(rank % 2));
    EXPECT_EQ(env["ROLE_RANK"], std::to_string(rank));
    EXPECT_EQ(env["ROLE_WORLD_SIZE"], "4");
    EXPECT_EQ(env["TORCHELASTIC_USE_AGENT_STORE"], "True");
    master_ports.insert(env["MASTER_ADDR"] + ":" + env["MASTER_PORT"]);
  }
  EXPECT_EQ(master_ports.size(), 1u) << "every worker bootstraps through node 0's agent store";
  ExpectAllGone(dir / "pids");
}

TEST(MultiNode, StaticFourNodesOfTwoWorkersFollowTheDeclaredNodeRanks) {
  TempDir dir;
  Agents agents(dir);
  const int port = FreePort();
  for (int node : {3, 1, 0, 2}) {  // arrival order does not matter: node ranks are declared
    agents.Start("n" + std::to_string(node), Static(port, 4, 2, node),
                 {"--env-file", dir / "env", "--pid-file", dir / "pids"});
  }
  for (int node = 0; node < 4; ++node)
    EXPECT_EQ(agents.Wait("n" + std::to_string(node)), 0) << agents.Err("n" + std::to_string(node));
  for (int rank = 0; rank < 8; ++rank) {
    auto env = ReadEnvFile(dir / ("env." + std::to_string(rank)));
    EXPECT_EQ(env["WORLD_SIZE"], "8");
    EXPECT_EQ(env["GROUP_RANK"], std::to_string(rank / 2)) << rank;
    EXPECT_EQ(env["GROUP_WORLD_SIZE"], "4");
  }
  ExpectAllGone(dir / "pids");
}

TEST(MultiNode, C10dFourNodesOfTwoWorkersGetEveryRankOnce) {
  TempDir dir;
  Agents agents(dir);
  const int port = FreePort();
  for (int i = 0; i < 4; ++i)
    agents.Start("n" + std::to_string(i), C10d(port, "4", 2), {"--env-file", dir / "env", "--pid-file", dir / "pids"});
  std::set<std::string> group_ranks;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(agents.Wait("n" + std::to_string(i)), 0) << agents.Err("n" + std::to_string(i));
  for (int rank = 0; rank < 8; ++rank) {
    auto env = ReadEnvFile(dir / ("env." + std::to_string(rank)));
    EXPECT_EQ(env["WORLD_SIZE"], "8") << rank;
    EXPECT_EQ(env["GROUP_WORLD_SIZE"], "4");
    EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "job");
    group_ranks.insert(env["GROUP_RANK"]);
  }
  EXPECT_EQ(group_ranks, (std::set<std::string>{"0", "1", "2", "3"}));
  ExpectAllGone(dir / "pids");
}

TEST(MultiNode, AWorkerFailureOnOneNodeRestartsEveryNode) {
  TempDir dir;
  Agents agents(dir);
  const int port = FreePort();
  // Global rank 3 fails in attempt 0; every other worker of attempt 0 hangs until ctrun stops it.
  const std::vector<std::string> worker{"--env-file", dir / "env", "--pid-file", dir / "pids", "--only-rank", "3",
                                        "--only-attempt", "0", "--exit", "1", "--else-hang-attempt", "0"};
  agents.Start("n0", C10d(port, "2", 2, {"--max_restarts=1"}), worker);
  agents.Start("n1", C10d(port, "2", 2, {"--max_restarts=1"}), worker);
  EXPECT_EQ(agents.Wait("n0"), 0) << agents.Err("n0");
  EXPECT_EQ(agents.Wait("n1"), 0) << agents.Err("n1");
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_EQ(ReadEnvFile(dir / ("env." + std::to_string(rank)))["TORCHELASTIC_RESTART_COUNT"], "1") << rank;
  // The node whose workers were healthy says why it stopped them, naming the failed node and rank.
  const std::string both = agents.Err("n0") + agents.Err("n1");
  EXPECT_NE(both.find("rank 3 exited with code 1"), std::string::npos) << both;
  EXPECT_NE(both.find("stopping the workers"), std::string::npos) << both;
  // The job ended well on its restart: no node's last words say it failed.
  EXPECT_EQ(both.find("the job failed on another node"), std::string::npos) << both;
  ExpectAllGone(dir / "pids");
}

TEST(MultiNode, NoRestartsLeftEveryAgentExitsWithTheSameCode) {
  TempDir dir;
  Agents agents(dir);
  const int port = FreePort();
  const std::vector<std::string> worker{"--pid-file", dir / "pids", "--only-rank", "2", "--exit", "7", "--else-hang"};
  agents.Start("n0", C10d(port, "2", 2), worker);
  agents.Start("n1", C10d(port, "2", 2), worker);
  EXPECT_EQ(agents.Wait("n0", seconds(30)), 7) << agents.Err("n0");
  EXPECT_EQ(agents.Wait("n1", seconds(30)), 7) << agents.Err("n1");
  const std::string both = agents.Err("n0") + agents.Err("n1");
  EXPECT_NE(both.find("stopped because node"), std::string::npos) << both;
  EXPECT_EQ(both.find("<NO_ROOT_CAUSE>"), std::string::npos) << both;
  EXPECT_NE(both.find("on another node: node 1 ("), std::string::npos) << both;
  ExpectAllGone(dir / "pids");
}

// After a node of 3 x 2 workers was lost: the ranks' last --env-file records show the round of 2
// nodes, with no restart counted (a lost node is a membership change).
void ExpectTheLastRoundRanUncountedAt4(TempDir& dir) {
  for (int rank = 0; rank < 4; ++rank) {
    auto env = ReadEnvFile(dir / ("env." + std::to_string(rank)));
    EXPECT_EQ(env["WORLD_SIZE"], "4");
    EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "0") << "a lost node was counted as a restart";
  }
}

TEST(MultiNode, KilledAgentLeavesASmallerJobRunning) {
  TempDir dir;
  Agents agents(dir);
  const int port = FreePort();
  // 3 nodes x 2 workers hang; once a node is gone (world 4) the workers finish.
  const std::vector<std::string> worker{"--env-file", dir / "env", "--pid-file", dir / "pids", "--hang-if-world", "6"};
  // A generous last call, so a slow start on a loaded machine still puts all three in round 0;
  // n0 hosts the store (on one machine all three match the endpoint, and the killed one must not
  // be the host).
  for (int i = 0; i < 3; ++i)
    agents.Start("n" + std::to_string(i),
                 C10d(port, "2:4", 2, {}, std::string("last_call_timeout=3,is_host=") + (i == 0 ? "1" : "0")), worker);
  ASSERT_TRUE(WaitFor([&] { return ReadPids(dir / "pids").size() >= 6; }, seconds(30))) << agents.Err("n0");
  agents["n2"].Signal(SIGKILL);
  EXPECT_EQ(agents.Wait("n2"), 128 + SIGKILL);
  EXPECT_EQ(agents.Wait("n0", seconds(30)), 0) << agents.Err("n0");
  EXPECT_EQ(agents.Wait("n1", seconds(30)), 0) << agents.Err("n1");
  ExpectTheLastRoundRanUncountedAt4(dir);
  EXPECT_NE(agents.Err("n0").find("no heartbeat"), std::string::npos) << agents.Err("n0");
  ExpectAllGone(dir / "pids");
}

// A node dies (agent and workers SIGKILLed) and the others' workers fail at once of the closed
// connections (as gloo's do, long before the dead node's heartbeat deadline). That is the node's
// loss, not a failure: with --max_restarts=0 the two nodes left of 2:3 go on, uncounted, and
// their logs name the node that was lost.
TEST(MultiNode, ANodeDeathThatBreaksTheOthersCollectivesCostsNoRestart) {
  TempDir dir;
  Agents agents(dir);
  const int port = FreePort();
  const std::string broken = dir / "connections-closed";
  const std::vector<std::string> worker{"--env-file", dir / "env", "--pid-file", dir / "pids", "--wait-file", broken,
                                        "--only-world", "6", "--error-file", "Connection closed by peer", "--exit", "1"};
  for (int i = 0; i < 3; ++i)
    agents.Start("n" + std::to_string(i),
                 C10d(port, "2:3", 2, {"--max_restarts=0"}, std::string("last_call_timeout=3,is_host=") + (i == 0 ? "1" : "0")),
                 worker);
  ASSERT_TRUE(WaitFor([&] { return ReadPids(dir / "pids").size() >= 6; }, seconds(30))) << agents.Err("n0");
  agents["n2"].Signal(SIGKILL);
  EXPECT_EQ(agents.Wait("n2"), 128 + SIGKILL);
  std::ofstream(broken).put('x');  // the survivors' collectives fail now
  EXPECT_EQ(agents.Wait("n0", seconds(30)), 0) << agents.Err("n0");
  EXPECT_EQ(agents.Wait("n1", seconds(30)), 0) << agents.Err("n1");
  ExpectTheLastRoundRanUncountedAt4(dir);
  for (const char* n : {"n0", "n1"}) {
    EXPECT_NE(agents.Err(n).find("may be on a node that died"), std::string::npos) << agents.Err(n);
    EXPECT_NE(agents.Err(n).find("no heartbeat"), std::string::npos) << agents.Err(n);
  }
  ExpectAllGone(dir / "pids");
}

// The same with one worker per node and no error file (a script without @record): the worker's
// traceback on stderr tells that it lost a peer. Its stderr used to go straight to ctrun's, unread,
// and the survivors ended with exit 1.
TEST(MultiNode, ALoneWorkerThatLostAPeerIsToldByItsStderrAndCostsNoRestart) {
  TempDir dir;
  Agents agents(dir);
  const int port = FreePort();
  const std::string broken = dir / "connections-closed";
  const std::vector<std::string> worker{"--env-file", dir / "env", "--pid-file", dir / "pids", "--wait-file", broken,
                                        "--only-world", "3", "--fail-stderr",
                                        "RuntimeError: [pair.cc:598] Connection closed by peer [10.0.0.3]:41234",
                                        "--exit", "1"};
  for (int i = 0; i < 3; ++i)
    agents.Start("n" + std::to_string(i),
                 C10d(port, "2:3", 1, {"--max_restarts=0"}, std::string("last_call_timeout=3,is_host=") + (i == 0 ? "1" : "0")),
                 worker);
  ASSERT_TRUE(WaitFor([&] { return ReadPids(dir / "pids").size() >= 3; }, seconds(30))) << agents.Err("n0");
  agents["n2"].Signal(SIGKILL);
  EXPECT_EQ(agents.Wait("n2"), 128 + SIGKILL);
  std::ofstream(broken).put('x');  // the survivors' collectives fail now
  EXPECT_EQ(agents.Wait("n0", seconds(30)), 0) << agents.Err("n0");
  EXPECT_EQ(agents.Wait("n1", seconds(30)), 0) << agents.Err("n1");
  for (const char* n : {"n0", "n1"}) {
    EXPECT_NE(agents.Err(n).find("may be on a node that died"), std::string::npos) << agents.Err(n);
    // The worker's own line still reaches the console, unprefixed, as from an inherited stderr.
    EXPECT_NE(agents.Err(n).find("\nRuntimeError: [pair.cc:598] Connection closed by peer"), std::string::npos)
        << agents.Err(n);
  }
  for (int rank = 0; rank < 2; ++rank) {
    auto env = ReadEnvFile(dir / ("env." + std::to_string(rank)));
    EXPECT_EQ(env["WORLD_SIZE"], "2");
    EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "0");
  }
  ExpectAllGone(dir / "pids");
}

// The job closes with success (a node's last round finished) while another node is still
// stopping its workers for a new round, past the last call: that node's workers were stopped by
// ctrun, not failed. It used to print a FAILED summary and then "all workers finished successfully".
TEST(MultiNode, ANodeStillStoppingWhenTheJobSucceedsPrintsNoFailure) {
  TempDir dir;
  Agents agents(dir);
  const int port = FreePort();
  const std::string go = dir / "go";
  auto flags = [&](bool host) {
    return C10d(port, "1:3", 1, {"--max_restarts=0"}, std::string("last_call_timeout=1,is_host=") + (host ? "1" : "0"));
  };
  agents.Start("a", flags(true), {"--pid-file", dir / "pids", "--wait-file", go});
  agents.Start("b", flags(false), {"--pid-file", dir / "pids", "--hang"});
  agents.Start("slow", flags(false), {"--pid-file", dir / "pids", "--ignore-term", "--hang"});
  ASSERT_TRUE(WaitFor([&] { return ReadPids(dir / "pids").size() >= 3; }, seconds(30))) << agents.Err("a");
  std::ofstream(go).put('x');
  ASSERT_TRUE(WaitFor([&] { return agents.Err("a").find("all workers on this node succeeded") != std::string::npos; },
                      seconds(30)))
      << agents.Err("a");
  agents["b"].Signal(SIGTERM);  // a new round, which "slow" joins only after its 5 s stop
  EXPECT_EQ(agents.Wait("b", seconds(30)), 128 + SIGTERM) << agents.Err("b");
  EXPECT_EQ(agents.Wait("a", seconds(30)), 0) << agents.Err("a");
  EXPECT_EQ(agents.Wait("slow", seconds(30)), 0) << agents.Err("slow");
  EXPECT_EQ(agents.Err("slow").find("FAILED"), std::string::npos) << agents.Err("slow");
  EXPECT_EQ(agents.Err("slow").find("all workers finished successfully"), std::string::npos) << agents.Err("slow");
  EXPECT_NE(agents.Err("slow").find("the job succeeded on the other nodes while this node was stopping its 1 worker(s)"),
            std::string::npos)
      << agents.Err("slow");
  ExpectAllGone(dir / "pids");
}

TEST(MultiNode, ANewNodeJoiningARunningJobRestartsEveryoneAsALargerJob) {
  TempDir dir;
  Agents agents(dir);
  const int port = FreePort();
  const std::vector<std::string> worker{"--env-file", dir / "env", "--pid-file", dir / "pids", "--hang-if-world", "3"};
  for (int i = 0; i < 3; ++i) agents.Start("n" + std::to_string(i), C10d(port, "2:4", 1, {}, "last_call_timeout=3"), worker);
  ASSERT_TRUE(WaitFor([&] { return ReadPids(dir / "pids").size() >= 3; }, seconds(30))) << agents.Err("n0");
  agents.Start("n3", C10d(port, "2:4", 1, {}, "last_call_timeout=3"), worker);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(agents.Wait("n" + std::to_string(i), seconds(30)), 0) << agents.Err("n" + std::to_string(i));
  for (int rank = 0; rank < 4; ++rank) {
    auto env = ReadEnvFile(dir / ("env." + std::to_string(rank)));
    EXPECT_EQ(env["WORLD_SIZE"], "4");
    EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "0") << "a membership change is not a counted restart";
  }
  ExpectAllGone(dir / "pids");
}

TEST(MultiNode, NodesWithDifferentWorkerCountsGetContiguousRanks) {
  TempDir dir;
  Agents agents(dir);
  const int port = FreePort();
  agents.Start("big", C10d(port, "2", 3, {}, "is_host=1"), {"--env-file", dir / "env", "--pid-file", dir / "pids"});
  agents.Start("small", C10d(port, "2", 1, {}, "is_host=0"), {"--env-file", dir / "env", "--pid-file", dir / "pids"});
  EXPECT_EQ(agents.Wait("big"), 0) << agents.Err("big");
  EXPECT_EQ(agents.Wait("small"), 0) << agents.Err("small");
  std::map<std::string, int> per_group;
  for (int rank = 0; rank < 4; ++rank) {
    auto env = ReadEnvFile(dir / ("env." + std::to_string(rank)));
    EXPECT_EQ(env["WORLD_SIZE"], "4");
    per_group[env["GROUP_RANK"] + "/" + env["LOCAL_WORLD_SIZE"]]++;
  }
  // One node runs 3 contiguous ranks, the other 1, whichever got node rank 0.
  EXPECT_EQ(per_group.size(), 2u);
  for (const auto& [group, n] : per_group) EXPECT_EQ(std::to_string(n), group.substr(group.find('/') + 1)) << group;
  ExpectAllGone(dir / "pids");
}

TEST(MultiNode, AnAgentStoppedBySignalLeavesAndTheOtherGoesOnAlone) {
  TempDir dir;
  Agents agents(dir);
  const int port = FreePort();
  const std::vector<std::string> worker{"--env-file", dir / "env", "--pid-file", dir / "pids", "--hang-if-world", "2"};
  agents.Start("n0", C10d(port, "1:2", 1, {}, "last_call_timeout=3,is_host=1"), worker);
  agents.Start("n1", C10d(port, "1:2", 1, {}, "last_call_timeout=3,is_host=0"), worker);
  ASSERT_TRUE(WaitFor([&] { return ReadPids(dir / "pids").size() >= 2; }, seconds(30))) << agents.Err("n0");
  agents["n1"].Signal(SIGTERM);
  EXPECT_EQ(agents.Wait("n1", seconds(30)), 128 + SIGTERM) << agents.Err("n1");
  EXPECT_EQ(agents.Wait("n0", seconds(30)), 0) << "n0 went on as a one-node job\n" << agents.Err("n0");
  auto env = ReadEnvFile(dir / "env.0");
  EXPECT_EQ(env["WORLD_SIZE"], "1");
  EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "0");
  EXPECT_NE(agents.Err("n0").find("left"), std::string::npos) << agents.Err("n0");
  ExpectAllGone(dir / "pids");
}

// The agent that hosts the rendezvous store stopped for longer than the heartbeat deadline
// (SIGSTOP, a paused VM): nobody could beat meanwhile, so nobody is lost for it, and the job is not
// run again (the other agents dropped healthy nodes after the resume, and a finished job started
// over; torchrun's agents simply go on).
TEST(MultiNode, AStoppedRendezvousHostCostsNoNodeAndRunsNothingTwice) {
  TempDir dir;
  Agents agents(dir);
  const int port = FreePort();
  const std::vector<std::string> worker{"--pid-file", dir / "pids", "--sleep-ms", "5000"};
  agents.Start("n0", C10d(port, "2:3", 1, {}, "last_call_timeout=2,is_host=1"), worker);
  agents.Start("n1", C10d(port, "2:3", 1, {}, "last_call_timeout=2,is_host=0"), worker);
  agents.Start("n2", C10d(port, "2:3", 1, {}, "last_call_timeout=2,is_host=0"), worker);
  ASSERT_TRUE(WaitFor([&] { return ReadPids(dir / "pids").size() >= 3; }, seconds(30))) << agents.Err("n0");
  agents["n0"].Signal(SIGSTOP);  // the deadline is 1 s (5 x 0.2 s)
  std::this_thread::sleep_for(seconds(3));
  agents["n0"].Signal(SIGCONT);
  for (const char* n : {"n0", "n1", "n2"}) EXPECT_EQ(agents.Wait(n, seconds(60)), 0) << n << "\n" << agents.Err(n);
  EXPECT_EQ(ReadPids(dir / "pids").size(), 3u) << "the job ran again\n" << agents.Err("n1");
  for (const char* n : {"n0", "n1", "n2"})
    EXPECT_EQ(agents.Err(n).find("missed its heartbeat deadline"), std::string::npos) << n << "\n" << agents.Err(n);
  ExpectAllGone(dir / "pids");
}

// A node whose rendezvous store is not up yet says so at once (once), not only at the timeout.
TEST(MultiNode, AnUnreachableRendezvousStoreIsSaidOnceAtTheStart) {
  TempDir dir;
  Agents agents(dir);
  const int port = FreePort();  // nobody listens there
  const auto start = std::chrono::steady_clock::now();
  agents.Start("n1", {"--nnodes=2", "--node_rank=1", "--master_addr=127.0.0.1", "--master_port=" + std::to_string(port),
                      "--rdzv_conf=timeout=2"},
               {});
  EXPECT_EQ(agents.Wait("n1", seconds(20)), 3) << agents.Err("n1");
  // It ends at its timeout: a store it never reached has no round to leave, nothing to wait for
  // (it waited 2 s more to write its leave, and could say "retrying" after the timeout).
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(3500));
  const std::string err = agents.Err("n1");
  EXPECT_EQ(CountOf(err, "rendezvous: cannot reach 127.0.0.1:" + std::to_string(port) + " yet (Connection refused); "
                         "retrying for up to 2 s"),
            1)
      << err;
  EXPECT_NE(err.find("rendezvous timed out after 2 s"), std::string::npos) << err;
}

// A loopback TCP connection whose local end is `port`: it holds the port without listening on it,
// as an outgoing connection's ephemeral local port does. Empty when it could not be made.
struct PortHeldByAConnection {
  UniqueFd accepted, client, listener;  // closed in this order: the TIME_WAIT is the listener side's
  explicit operator bool() const { return accepted.valid(); }
};

PortHeldByAConnection HoldPortWithAConnection(int port) {
  PortHeldByAConnection h;
  int listen_port = 0, bound = 0;
  h.listener = BindLoopback(0, &listen_port);
  h.client = BindLoopback(port, &bound);
  if (!h.listener || !h.client || ::listen(h.listener.get(), 1) != 0) return h;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  to.sin_port = htons(static_cast<uint16_t>(listen_port));
  if (::connect(h.client.get(), reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) return h;
  h.accepted.reset(::accept4(h.listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  return h;
}

// Agents on the endpoint's machine that find its port held by something that does not listen
// (another program's connection) cannot host, and nothing answers. Each says so, naming the
// holder, and hosts as soon as the port is free: the job starts instead of timing out.
TEST(MultiNode, AnEndpointPortHeldByAConnectionIsHostedOnceItIsFree) {
  TempDir dir;
  Agents agents(dir);
  const int port = FreePort();
  PortHeldByAConnection hold = HoldPortWithAConnection(port);
  ASSERT_TRUE(hold) << "cannot hold port " << port << ": " << std::strerror(errno);
  for (const char* n : {"n0", "n1"})
    agents.Start(n, C10d(port, "2", 1), {"--env-file", dir / "env", "--pid-file", dir / "pids"});
  const std::string cannot = "cannot host the rendezvous store on port " + std::to_string(port) +
                             ": the port is held by pid " + std::to_string(::getpid());
  ASSERT_TRUE(WaitFor([&] { return CountOf(agents.Err("n0"), cannot) > 0 && CountOf(agents.Err("n1"), cannot) > 0; },
                      seconds(30)))
      << agents.Err("n0") << agents.Err("n1");
  hold = {};  // the connection ends: the port is free
  EXPECT_EQ(agents.Wait("n0"), 0) << agents.Err("n0");
  EXPECT_EQ(agents.Wait("n1"), 0) << agents.Err("n1");
  const std::string both = agents.Err("n0") + agents.Err("n1");
  EXPECT_EQ(CountOf(both, cannot), 2) << "once per agent\n" << both;
  EXPECT_EQ(CountOf(both, "rendezvous: hosting the store on port " + std::to_string(port) + " now that the port is free"),
            1)
      << both;
  EXPECT_NE(both.find("nothing answers there either, so ctrun hosts it as soon as it is free"), std::string::npos)
      << both;
  EXPECT_EQ(ReadEnvFile(dir / "env.1")["WORLD_SIZE"], "2");
  ExpectAllGone(dir / "pids");
}

// The same for etcd: said once when the first request cannot reach it, then the timeout.
TEST(MultiNode, AnUnreachableEtcdIsSaidOnceAtTheStart) {
  TempDir dir;
  Agents agents(dir);
  const int port = FreePort();  // nobody listens there
  agents.Start("n1", {"--nnodes=2", "--rdzv_backend=etcd", "--rdzv_endpoint=127.0.0.1:" + std::to_string(port),
                      "--rdzv_conf=read_timeout=2"},
               {});
  EXPECT_EQ(agents.Wait("n1", seconds(20)), 3) << agents.Err("n1");
  const std::string err = agents.Err("n1");
  EXPECT_EQ(CountOf(err, "rendezvous: cannot reach etcd at http://127.0.0.1:" + std::to_string(port) + " yet ("), 1)
      << err;
  EXPECT_NE(err.find("retrying for up to 2"), std::string::npos) << err;
}

// A static node that gives another --nnodes than the running job is refused at once with the
// difference named, and the job runs on at its size (the node with the smaller count used to
// decide the job's size when it arrived first).
TEST(MultiNode, AStaticNodeWithAnotherNnodesIsRefusedAndTheJobRunsOn) {
  TempDir dir;
  Agents agents(dir);
  const int port = FreePort();
  auto flags = [&](const std::string& nnodes, int node) {
    return std::vector<std::string>{"--nnodes=" + nnodes, "--node_rank=" + std::to_string(node),
                                    "--master_addr=127.0.0.1", "--master_port=" + std::to_string(port),
                                    kFastConf + ",keep_alive_interval=0.2", "--shutdown-timeout=5"};
  };
  const std::vector<std::string> worker{"--pid-file", dir / "pids", "--hang"};
  for (int node : {0, 1}) agents.Start("n" + std::to_string(node), flags("2", node), worker);
  ASSERT_TRUE(WaitFor([&] { return ReadPids(dir / "pids").size() >= 2; }, seconds(30))) << agents.Err("n0");
  agents.Start("n2", flags("3", 2), worker);
  EXPECT_EQ(agents.Wait("n2", seconds(30)), 3) << agents.Err("n2");
  const std::string err = agents.Err("n2");
  EXPECT_NE(err.find("this node's flags differ from those of the job it is joining (store at 127.0.0.1:" +
                     std::to_string(port) + "): --nnodes=3 here, 2 in the job, set by "),
            std::string::npos)
      << err;
  EXPECT_EQ(ReadPids(dir / "pids").size(), 2u) << "the refused node started no worker";
  // The job's nodes say so: their operators would otherwise see a node that never came.
  for (const char* node : {"n0", "n1"})
    EXPECT_TRUE(WaitFor([&] { return agents.Err(node).find("was refused: its flags differ from this job's (--nnodes=3 there, 2 in the job)") != std::string::npos; }, seconds(10)))
        << agents.Err(node);
  EXPECT_TRUE(ProcessAlive(agents["n0"].pid())) << agents.Err("n0");
  EXPECT_TRUE(ProcessAlive(agents["n1"].pid())) << agents.Err("n1");
  agents["n1"].Signal(SIGTERM);
  agents["n0"].Signal(SIGTERM);
  EXPECT_EQ(agents.Wait("n1", seconds(30)), 128 + SIGTERM) << agents.Err("n1");
  EXPECT_EQ(agents.Wait("n0", seconds(30)), 128 + SIGTERM) << agents.Err("n0");
  ExpectAllGone(dir / "pids");
}

TEST(MultiNode, JoinTimeoutNamesWhoJoinedAndExits3) {
  TempDir dir;
  Agents agents(dir);
  const int port = FreePort();
  const std::string tmp = dir / "tmp";
  std::filesystem::create_directories(tmp);
  agents.Start("n0",
               {"--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
                "--rdzv_endpoint=127.0.0.1:" + std::to_string(port), "--rdzv_conf=join_timeout=1"},
               {}, {"TMPDIR=" + tmp});
  EXPECT_EQ(agents.Wait("n0", seconds(20)), 3);
  const std::string err = agents.Err("n0");
  EXPECT_NE(err.find("rendezvous timed out after 1 s"), std::string::npos) << err;
  EXPECT_NE(err.find("1 node(s) joined round 0"), std::string::npos) << err;
  EXPECT_NE(err.find("need at least 2"), std::string::npos) << err;
  // No worker ever ran: the fresh log directory holds nothing and is not left behind.
  EXPECT_TRUE(std::filesystem::is_empty(tmp)) << "left in TMPDIR after a rendezvous that never completed";
}

TEST(MultiNode, AnAgentWithoutTheTokenIsRefused) {
  TempDir dir;
  Agents agents(dir);
  const int port = FreePort();
  agents.Start("host", C10d(port, "2", 1), {"--pid-file", dir / "pids"}, {"CTRUN_RDZV_TOKEN=secret-1"});
  agents.Start("stranger", C10d(port, "2", 1, {}, "is_host=0,read_timeout=5"), {},
               {"CTRUN_RDZV_TOKEN=wrong"});
  EXPECT_EQ(agents.Wait("stranger", seconds(30)), 3) << agents.Err("stranger");
  agents["host"].Signal(SIGTERM);
  EXPECT_EQ(agents.Wait("host", seconds(20)), 128 + SIGTERM);
  EXPECT_TRUE(ReadPids(dir / "pids").empty()) << "no worker started";
}

// A node whose workers all succeeded is done: when the last node still running is stopped by a
// signal, it ends with 0 instead of starting its finished workers again at the smaller size.
TEST(MultiNode, ANodeThatFinishedIsNotRestartedWhenTheLastRunningNodeLeaves) {
  TempDir dir;
  Agents agents(dir);
  const int port = FreePort();
  agents.Start("done", C10d(port, "1:2", 2, {}, "is_host=1"), {"--pid-file", dir / "pids.done"});
  agents.Start("busy", C10d(port, "1:2", 2, {}, "is_host=0"), {"--pid-file", dir / "pids.busy", "--hang"});
  ASSERT_TRUE(WaitFor([&] { return agents.Err("done").find("all workers on this node succeeded") != std::string::npos; },
                      seconds(30)))
      << agents.Err("done") << agents.Err("busy");
  ASSERT_TRUE(WaitFor([&] { return ReadPids(dir / "pids.busy").size() == 2; }, seconds(30))) << agents.Err("busy");
  agents["busy"].Signal(SIGTERM);
  EXPECT_EQ(agents.Wait("busy", seconds(30)), 128 + SIGTERM) << agents.Err("busy");
  EXPECT_EQ(agents.Wait("done", seconds(30)), 0) << agents.Err("done");
  EXPECT_EQ(ReadPids(dir / "pids.done").size(), 2u) << "the finished node started its workers again\n"
                                                    << agents.Err("done");
  EXPECT_NE(agents.Err("done").find("every worker on every remaining node succeeded"), std::string::npos)
      << agents.Err("done");
  ExpectAllGone(dir / "pids.busy");
}

// A node that arrives once a member's workers have succeeded waits instead of starting a round
// that would run them again, and takes the job's outcome without running a worker.
TEST(MultiNode, ANewcomerToAFinishingJobWaitsAndTakesItsOutcome) {
  TempDir dir;
  Agents agents(dir);
  const int port = FreePort();
  agents.Start("a", C10d(port, "1:3", 1, {}, "is_host=1"), {"--pid-file", dir / "pids.a"});
  agents.Start("b", C10d(port, "1:3", 1, {}, "is_host=0"), {"--pid-file", dir / "pids.b", "--wait-file", dir / "go"});
  ASSERT_TRUE(WaitFor([&] { return agents.Err("a").find("all workers on this node succeeded") != std::string::npos; },
                      seconds(30)))
      << agents.Err("a") << agents.Err("b");
  agents.Start("late", C10d(port, "1:3", 1, {}, "is_host=0"), {"--pid-file", dir / "pids.late"});
  ASSERT_TRUE(WaitFor([&] { return agents.Err("late").find("waiting to join: round 0 runs with 2 node(s) and is "
                                                           "finishing") != std::string::npos; },
                      seconds(30)))
      << agents.Err("late");
  std::ofstream(dir / "go").put('1');
  EXPECT_EQ(agents.Wait("b", seconds(30)), 0) << agents.Err("b");
  EXPECT_EQ(agents.Wait("a", seconds(30)), 0) << agents.Err("a");
  EXPECT_EQ(agents.Wait("late", seconds(30)), 0) << agents.Err("late");
  EXPECT_EQ(ReadPids(dir / "pids.a").size(), 1u) << "the finished node ran again\n" << agents.Err("a");
  EXPECT_TRUE(ReadPids(dir / "pids.late").empty()) << agents.Err("late");
  EXPECT_NE(agents.Err("late").find("the job succeeded while this node waited to join it; no worker ran here"),
            std::string::npos)
      << agents.Err("late");
}

TEST(MultiNode, TheOthersEndCleanlyWhenTheRendezvousHostDies) {
  TempDir dir;
  Agents agents(dir);
  const int port = FreePort();
  const std::vector<std::string> worker{"--pid-file", dir / "pids", "--hang"};
  agents.Start("host", C10d(port, "2", 1, {}, "is_host=1,read_timeout=2"), worker);
  agents.Start("n1", C10d(port, "2", 1, {}, "is_host=0,read_timeout=2"), worker);
  ASSERT_TRUE(WaitFor([&] { return ReadPids(dir / "pids").size() >= 2; }, seconds(30))) << agents.Err("n1");
  agents["host"].Signal(SIGKILL);
  EXPECT_EQ(agents.Wait("n1", seconds(30)), 3) << agents.Err("n1");
  EXPECT_NE(agents.Err("n1").find("lost the rendezvous (store at 127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << agents.Err("n1");
  EXPECT_NE(agents.Err("n1").find("the rendezvous failed"), std::string::npos) << "in the summary\n"
                                                                              << agents.Err("n1");
  ExpectAllGone(dir / "pids");
}

// --late-exit-notice in the exit barrier: node 0's worker exits 0 at once, node 1's never ends;
// node 0 names node 1 at 0.5 s and 1 s, until node 1's deadline ends the job.
TEST(MultiNode, ANodeInTheExitBarrierNamesTheNodesStillRunning) {
  TempDir dir;
  Agents agents(dir);
  const int port = FreePort();
  for (int node : {1, 0})
    agents.Start("n" + std::to_string(node),
                 Static(port, 2, 1, node, {"--late-exit-notice=0.5", node == 1 ? "--max-run-time=5" : "--max-run-time=60"}),
                 {"--only-rank", "1", "--hang", "--pid-file", dir / "pids"});
  EXPECT_EQ(agents.Wait("n0", seconds(30)), 124) << agents.Err("n0");
  EXPECT_EQ(agents.Wait("n1", seconds(30)), 124) << agents.Err("n1");
  const std::string err0 = agents.Err("n0");
  for (const char* after : {"0.5 s", "1 s"})
    EXPECT_NE(err0.find(std::string("every worker on this node exited 0 ") + after +
                        " ago; still running: the workers of node 1 ("),
              std::string::npos)
        << err0;
  EXPECT_EQ(agents.Err("n1").find("exited 0"), std::string::npos) << "node 1 had nothing finish";
  ExpectAllGone(dir / "pids");
}

// --max-run-time on two agents: node 0's deadline (1.5 s) fires first and closes the job with 124
// for both; node 1's own (60 s) never has to. Both summaries say max_run_time.
TEST(MultiNode, TheFirstMaxRunTimeEndsEveryNodeWith124) {
  TempDir dir;
  Agents agents(dir);
  const int port = FreePort();
  for (int node : {1, 0}) {
    const std::string n = std::to_string(node);
    agents.Start("n" + n,
                 Static(port, 2, 2, node,
                        {node == 0 ? "--max-run-time=1.5" : "--max-run-time=60", "--summary-file",
                         dir / ("s" + n + ".json"), "--events-file", dir / ("e" + n + ".jsonl")}),
                 {"--hang", "--pid-file", dir / "pids"});
  }
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(agents.Wait("n0", seconds(30)), 124) << agents.Err("n0");
  EXPECT_EQ(agents.Wait("n1", seconds(30)), 124) << agents.Err("n1");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(took, 15.0) << "node 1 waited for its own deadline";
  EXPECT_NE(agents.Err("n0").find("reached --max-run-time (1.5 s); ranks still running: 0, 1"), std::string::npos)
      << agents.Err("n0");
  for (const std::string n : {"0", "1"}) {
    const auto s = nlohmann::json::parse(ReadFileOr(dir / ("s" + n + ".json")));
    EXPECT_EQ(s["outcome"], "max_run_time") << n;
    EXPECT_EQ(s["exit_code"], 124);
    EXPECT_EQ(s["ranks"].size(), 2u);
    EXPECT_EQ(s["node_rank"], std::stoi(n));
    bool round = false;
    for (const auto& line : SplitLines(ReadFileOr(dir / ("e" + n + ".jsonl"))))
      round |= nlohmann::json::parse(line)["event"] == "rendezvous_round";
    EXPECT_TRUE(round) << "node " << n << " logged its rendezvous round";
  }
  EXPECT_EQ(nlohmann::json::parse(ReadFileOr(dir / "s0.json"))["running_at_deadline"], nlohmann::json({0, 1}));
  EXPECT_NE(nlohmann::json::parse(ReadFileOr(dir / "s1.json"))["root_cause"].get<std::string>().find(
                "reached --max-run-time (1.5 s)"),
            std::string::npos);
  ExpectAllGone(dir / "pids");
}

}  // namespace
}  // namespace ctrun::testing
