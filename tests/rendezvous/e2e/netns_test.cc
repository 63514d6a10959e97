// Multi-node jobs where every node is its own network namespace with its own address
// (netns_util.h): the agents find each other, and their workers find node rank 0's store, only
// through the addresses they advertise, never through a loopback they happen to share. And a node's
// link can be cut: no FIN, no RST, the packets just stop.
//
// Needs root and iproute2 (ip netns, veth, bridge); every test skips when the network cannot be
// built. Every wait polls against a deadline; every agent and worker is checked gone at the end.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <set>

#include "helpers/ctrun_command.h"
#include "helpers/test_util.h"
#include "netns_util.h"

namespace ctrun::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

// Inside a fresh namespace every port is free.
constexpr int kPort = 29400;

// Fast rendezvous timings (as the loopback tests): a 1 s heartbeat deadline.
const std::string kFastConf =
    "--rdzv_conf=join_timeout=60,keep_alive_interval=0.2,keep_alive_max_attempt=5,last_call_timeout=1";
// For the link cut: all three agents in round 0 despite a slow start, and store requests that time
// out after 2 s, so the agent that is cut off notices.
const std::string kCutConf =
    "--rdzv_conf=join_timeout=60,keep_alive_interval=0.2,keep_alive_max_attempt=5,last_call_timeout=3,"
    "read_timeout=2";


bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// The environments the fake worker wrote with --env-file `prefix`: rank -> env.
std::map<int, std::map<std::string, std::string>> EnvsOf(const std::string& prefix, int max_world) {
  std::map<int, std::map<std::string, std::string>> out;
  for (int r = 0; r < max_world; ++r)
    if (Exists(prefix + "." + std::to_string(r))) out[r] = ReadEnvFile(prefix + "." + std::to_string(r));
  return out;
}

void ExpectAllGone(const std::string& pid_file) {
  for (pid_t p : ReadPids(pid_file))
    EXPECT_TRUE(WaitFor([&] { return !ProcessAlive(p); }, seconds(10))) << "worker pid " << p << " outlived the job";
}

std::vector<std::string> C10d(const NetnsCluster& net, const std::string& nnodes, int nproc,
                              const std::string& conf = kFastConf) {
  return {"--nnodes=" + nnodes,
          "--nproc_per_node=" + std::to_string(nproc),
          "--rdzv_backend=c10d",
          "--rdzv_endpoint=" + net.Addr(0) + ":" + std::to_string(kPort),
          "--rdzv_id=netjob",
          conf,
          "--shutdown-timeout=5"};
}

// Polls every agent in `names` until all have exited or `timeout` passes; returns each one's exit
// code (-1: still running) and when it was seen gone.
struct Exit {
  int code = -1;
  Clock::time_point at{};
};
std::map<std::string, Exit> WaitAll(NetnsCluster& net, const std::vector<std::string>& names, milliseconds timeout) {
  std::map<std::string, Exit> out;
  for (const auto& n : names) out[n] = Exit{};
  WaitFor(
      [&] {
        bool all = true;
        for (const auto& n : names) {
          if (out[n].code >= 0) continue;
          const int code = net.Proc(n).Wait(milliseconds(0));
          if (code >= 0) {
            out[n] = Exit{code, Clock::now()};
          } else {
            all = false;
          }
        }
        return all;
      },
      timeout);
  return out;
}

#define NETNS_OR_SKIP(net)                                              \
  if (!(net).ok()) GTEST_SKIP() << "no network namespaces here: " << (net).error()

TEST(NetnsMultiNode, C10dTwoNodesOfTwoWorkersUseTheNodesOwnAddresses) {
  NetnsCluster net(11, 2);
  NETNS_OR_SKIP(net);
  TempDir dir;
  for (int i = 0; i < 2; ++i) {
    const std::string n = "n" + std::to_string(i);
    net.Start(n, i, Ctrun(C10d(net, "2", 2), {"--env-file", dir / ("env." + n), "--pid-file", dir / ("pids." + n)}), {},
              dir / (n + ".out"), dir / (n + ".err"));
  }
  auto exits = WaitAll(net, {"n0", "n1"}, seconds(60));
  for (const auto& n : {"n0", "n1"}) EXPECT_EQ(exits[n].code, 0) << n << ":\n" << ReadFileOr(dir / (std::string(n) + ".err"));

  std::set<int> ranks;
  std::set<std::string> master_addrs, master_ports;
  std::map<std::string, int> group_rank_of_node;  // namespace node -> GROUP_RANK of its workers
  for (int i = 0; i < 2; ++i) {
    auto envs = EnvsOf(dir / ("env.n" + std::to_string(i)), 4);
    EXPECT_EQ(envs.size(), 2u) << "node " << i << " ran 2 workers";
    std::set<std::string> node_group_ranks;
    for (auto& [rank, env] : envs) {
      ranks.insert(rank);
      EXPECT_EQ(env["WORLD_SIZE"], "4") << rank;
      EXPECT_EQ(env["GROUP_WORLD_SIZE"], "2") << rank;
      EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "0") << rank;
      master_addrs.insert(env["MASTER_ADDR"]);
      master_ports.insert(env["MASTER_PORT"]);
      node_group_ranks.insert(env["GROUP_RANK"]);
    }
    ASSERT_EQ(node_group_ranks.size(), 1u) << "one GROUP_RANK per node";
    group_rank_of_node["n" + std::to_string(i)] = std::atoi(node_group_ranks.begin()->c_str());
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3}));
  EXPECT_NE(group_rank_of_node["n0"], group_rank_of_node["n1"]) << "distinct GROUP_RANKs";
  ASSERT_EQ(master_addrs.size(), 1u) << "every worker bootstraps through the same store";
  ASSERT_EQ(master_ports.size(), 1u);
  const std::string master = *master_addrs.begin();
  EXPECT_EQ(master.rfind("10.213.11.", 0), 0u) << "MASTER_ADDR " << master << " is not a node's own address";
  const int master_node = net.NodeOf(master);
  ASSERT_GE(master_node, 0) << master;
  EXPECT_EQ(group_rank_of_node["n" + std::to_string(master_node)], 0)
      << "MASTER_ADDR " << master << " must be the node with GROUP_RANK 0";
  for (int i = 0; i < 2; ++i) ExpectAllGone(dir / ("pids.n" + std::to_string(i)));
}

TEST(NetnsMultiNode, StaticTwoNodesAcrossNamespaces) {
  NetnsCluster net(12, 2);
  NETNS_OR_SKIP(net);
  TempDir dir;
  for (int i : {1, 0}) {
    const std::string n = "n" + std::to_string(i);
    net.Start(n, i,
              Ctrun({"--nnodes=2", "--nproc_per_node=2", "--node_rank=" + std::to_string(i),
                     "--master_addr=" + net.Addr(0), "--master_port=" + std::to_string(kPort), kFastConf,
                     "--shutdown-timeout=5"},
                    {"--env-file", dir / ("env." + n), "--pid-file", dir / ("pids." + n)}),
              {}, dir / (n + ".out"), dir / (n + ".err"));
  }
  auto exits = WaitAll(net, {"n0", "n1"}, seconds(60));
  for (const auto& n : {"n0", "n1"}) EXPECT_EQ(exits[n].code, 0) << n << ":\n" << ReadFileOr(dir / (std::string(n) + ".err"));
  std::set<int> ranks;
  for (int i = 0; i < 2; ++i) {
    auto envs = EnvsOf(dir / ("env.n" + std::to_string(i)), 4);
    EXPECT_EQ(envs.size(), 2u) << "node " << i;
    for (auto& [rank, env] : envs) {
      ranks.insert(rank);
      EXPECT_EQ(rank / 2, i) << "static node rank " << i << " holds global ranks " << 2 * i << ".." << 2 * i + 1;
      EXPECT_EQ(env["WORLD_SIZE"], "4");
      EXPECT_EQ(env["GROUP_RANK"], std::to_string(i));
      EXPECT_EQ(env["LOCAL_RANK"], std::to_string(rank % 2));
      EXPECT_EQ(env["MASTER_ADDR"], net.Addr(0)) << "node rank 0's address";
    }
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3}));
  for (int i = 0; i < 2; ++i) ExpectAllGone(dir / ("pids.n" + std::to_string(i)));
}

// 3 nodes, the rendezvous store on node 0; node 2's link goes down while every worker runs. The two
// others drop it (missed heartbeats) and finish as a 2-node job; node 2's agent, cut off from the
// store, ends by itself with the rendezvous exit code and stops its worker.
class NetnsLinkCut : public ::testing::TestWithParam<bool /*at the bridge*/> {};

TEST_P(NetnsLinkCut, SurvivorsFinishAsASmallerJobAndTheCutOffAgentEnds) {
  const bool at_bridge = GetParam();
  NetnsCluster net(at_bridge ? 13 : 15, 3);
  NETNS_OR_SKIP(net);
  TempDir dir;
  auto env_prefix = [&](int i) { return dir / ("env.n" + std::to_string(i)); };
  auto pid_file = [&](int i) { return dir / ("pids.n" + std::to_string(i)); };
  for (int i = 0; i < 3; ++i) {
    const std::string n = "n" + std::to_string(i);
    net.Start(n, i,
              Ctrun(C10d(net, "2:4", 1, kCutConf),
                    {"--env-file", env_prefix(i), "--pid-file", pid_file(i), "--hang-if-world", "3"}),
              {}, dir / (n + ".out"), dir / (n + ".err"));
  }
  auto worker_count = [&] {
    size_t n = 0;
    for (int i = 0; i < 3; ++i) n += ReadPids(pid_file(i)).size();
    return n;
  };
  ASSERT_TRUE(WaitFor([&] { return worker_count() >= 3; }, seconds(40)))
      << "round 0 never ran 3 workers:\n" << ReadFileOr(dir / "n0.err") << ReadFileOr(dir / "n1.err")
      << ReadFileOr(dir / "n2.err");
  for (int i = 0; i < 3; ++i) ASSERT_EQ(ReadPids(pid_file(i)).size(), 1u) << "node " << i;
  // A worker writes its env file before its pid: round 0's are all written. Remove them, so what
  // is there at the end is the smaller job's.
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 3; ++i) ::unlink((env_prefix(i) + "." + std::to_string(r)).c_str());
  const pid_t cut_worker = ReadPids(pid_file(2)).front();

  const std::string cut_err = net.CutLink(2, at_bridge);
  ASSERT_EQ(cut_err, "");
  const auto cut_at = Clock::now();
  auto exits = WaitAll(net, {"n0", "n1", "n2"}, seconds(60));
  auto secs = [&](const Exit& e) {
    return e.code < 0 ? -1.0 : std::chrono::duration<double>(e.at - cut_at).count();
  };

  EXPECT_EQ(exits["n0"].code, 0) << ReadFileOr(dir / "n0.err");
  EXPECT_EQ(exits["n1"].code, 0) << ReadFileOr(dir / "n1.err");
  const std::string err2 = ReadFileOr(dir / "n2.err");
  EXPECT_EQ(exits["n2"].code, 3) << "the cut-off agent:\n" << err2;
  // What it says after its worker started (so not "rendezvous round 0 complete") names the
  // rendezvous store it lost.
  const size_t started = err2.find("starting 1 worker");
  const std::string after = started == std::string::npos ? err2 : err2.substr(err2.find('\n', started) + 1);
  const std::string endpoint = net.Addr(0) + ":" + std::to_string(kPort);
  EXPECT_NE(after.find(endpoint), std::string::npos) << "no word about the rendezvous at " << endpoint << ":\n" << err2;
  const double survivors = std::max(secs(exits["n0"]), secs(exits["n1"]));
  std::cout << "[ netns    ] link cut " << (at_bridge ? "at the bridge" : "on the node")
            << ": survivors exited " << survivors << " s after the cut (n0 " << secs(exits["n0"]) << " s, n1 "
            << secs(exits["n1"]) << " s); the cut-off agent exited after " << secs(exits["n2"]) << " s" << std::endl;
  // n1 ends once the 2-node job closed: the 1 s heartbeat deadline and a 2-node round (generous
  // bound for a loaded machine). n0 hosts the store, and before it exits it lingers (up to 10 s)
  // while clients are still connected: the cut-off node's connections never close.
  EXPECT_LT(secs(exits["n1"]), 10.0);
  EXPECT_LT(survivors, 20.0);
  if (exits["n2"].code >= 0) {
    EXPECT_LT(secs(exits["n2"]), 30.0);
  }
  EXPECT_NE((ReadFileOr(dir / "n0.err") + ReadFileOr(dir / "n1.err")).find("no heartbeat"), std::string::npos)
      << ReadFileOr(dir / "n0.err");

  std::set<int> ranks;
  for (int i = 0; i < 2; ++i) {
    auto envs = EnvsOf(env_prefix(i), 3);
    EXPECT_EQ(envs.size(), 1u) << "survivor node " << i << " ran one worker in the smaller job";
    for (auto& [rank, env] : envs) {
      ranks.insert(rank);
      EXPECT_EQ(env["WORLD_SIZE"], "2") << "node " << i;
      EXPECT_EQ(env["GROUP_WORLD_SIZE"], "2") << "node " << i;
      EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "0") << "a lost node is not a counted restart";
      EXPECT_EQ(env["MASTER_ADDR"].rfind("10.213.", 0), 0u) << env["MASTER_ADDR"];
      EXPECT_NE(env["MASTER_ADDR"], net.Addr(2)) << "the smaller job's store is on a survivor";
    }
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1}));
  EXPECT_TRUE(EnvsOf(env_prefix(2), 3).empty()) << "the cut-off node started no worker after the cut";
  EXPECT_EQ(ReadPids(pid_file(2)).size(), 1u);
  EXPECT_TRUE(WaitFor([&] { return !ProcessAlive(cut_worker); }, seconds(10)))
      << "the cut-off node's worker " << cut_worker << " is still running";
  for (int i = 0; i < 3; ++i) ExpectAllGone(pid_file(i));
}

INSTANTIATE_TEST_SUITE_P(Where, NetnsLinkCut, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "AtTheBridge" : "OnTheNode"; });

bool HaveTorch() { return ctrun::testing::PythonCanImport("torch.distributed"); }

// Real PyTorch: one gloo world across two namespaces, bootstrapped through node rank 0's agent
// store at its namespace address. Gloo would pick the address the host name resolves to (a
// loopback address here), so it is told the interface, as on a multi-homed cluster node.
TEST(NetnsMultiNode, GlooAllReduceAcrossNamespaces) {
  if (!HaveTorch()) GTEST_SKIP() << "/usr/bin/python3 cannot import torch.distributed";
  NetnsCluster net(14, 2);
  NETNS_OR_SKIP(net);
  TempDir dir;
  const std::vector<std::string> env{"PYTHON_EXEC=/usr/bin/python3", "GLOO_SOCKET_IFNAME=eth0"};
  for (int i = 0; i < 2; ++i) {
    const std::string n = "n" + std::to_string(i);
    std::vector<std::string> argv{CTRUN_BINARY};
    for (const auto& f : C10d(net, "2", 1)) argv.push_back(f);
    argv.push_back(CTRUN_SOURCE_DIR "/tests/compat/ddp_gloo.py");
    net.Start(n, i, argv, env, dir / (n + ".out"), dir / (n + ".err"));
  }
  auto exits = WaitAll(net, {"n0", "n1"}, seconds(240));
  EXPECT_EQ(exits["n0"].code, 0) << ReadFileOr(dir / "n0.err");
  EXPECT_EQ(exits["n1"].code, 0) << ReadFileOr(dir / "n1.err");
  const std::string out = ReadFileOr(dir / "n0.out") + ReadFileOr(dir / "n1.out");
  EXPECT_NE(out.find("all_reduce ok world_size=2"), std::string::npos)
      << out << ReadFileOr(dir / "n0.err") << ReadFileOr(dir / "n1.err");
}

}  // namespace
}  // namespace ctrun::testing
