// Multi-node jobs through a real etcd (v3 API) started by the test on free loopback ports: ctrun
// agents as processes, the fake worker, one or three etcd members. Every wait polls against a
// deadline; etcd members die with the test (PDEATHSIG) and are reaped by the fixture.
#include <gtest/gtest.h>

#include <fcntl.h>

#include <fstream>
#include <map>
#include <set>
#include <memory>

#include "helpers/ctrun_command.h"
#include "helpers/test_util.h"
#include "rendezvous/process/etcd_fixture.h"

namespace ctrun::testing {
namespace {

using std::chrono::seconds;

// The endpoints as ctrun takes them: host:port,host:port (http is the default protocol).
std::string Endpoints(const EtcdCluster& etcd) {
  std::string out;
  for (const auto& e : etcd.endpoints()) out += (out.empty() ? "" : ",") + e.substr(e.find("://") + 3);
  return out;
}

std::vector<std::string> EtcdFlags(const EtcdCluster& etcd, const std::string& nnodes, int nproc,
                                   const std::string& run_id, const std::string& conf = "") {
  return {"--nnodes=" + nnodes, "--nproc_per_node=" + std::to_string(nproc), "--rdzv_backend=etcd",
          "--rdzv_endpoint=" + Endpoints(etcd), "--rdzv_id=" + run_id,
          "--rdzv_conf=join_timeout=60,last_call_timeout=3,keep_alive_interval=0.5,keep_alive_max_attempt=6,"
          "read_timeout=10,etcd_prefix=/ctrun-test" +
              (conf.empty() ? "" : "," + conf),
          "--shutdown-timeout=5"};
}


class EtcdJob : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdAvailable()) GTEST_SKIP() << "/usr/bin/etcd is missing (install etcd-server)";
  }
  void StartEtcd(int members) {
    EtcdClusterOptions o;
    o.members = members;
    etcd_ = std::make_unique<EtcdCluster>(o);
    Status st = etcd_->Start();
    ASSERT_TRUE(st.ok()) << st.message();
  }
  void StartAgent(const std::string& name, const std::vector<std::string>& flags, const std::vector<std::string>& worker) {
    agents_[name] = std::make_unique<BackgroundProcess>(Ctrun(flags, worker), std::vector<std::string>{},
                                                        dir_ / (name + ".out"), dir_ / (name + ".err"));
  }
  int Wait(const std::string& name, seconds timeout = seconds(60)) { return agents_.at(name)->Wait(timeout); }
  std::string Err(const std::string& name) const { return ReadFileOr(dir_ / (name + ".err")); }
  void ExpectWorkersGone() {
    for (pid_t p : ReadPids(dir_ / "pids"))
      EXPECT_TRUE(WaitFor([&] { return !ProcessAlive(p); }, seconds(10))) << "worker " << p << " outlived the job";
  }

  TempDir dir_;
  std::unique_ptr<EtcdCluster> etcd_;
  std::map<std::string, std::unique_ptr<BackgroundProcess>> agents_;
};

TEST_F(EtcdJob, FourNodesOfTwoWorkers) {
  StartEtcd(1);
  for (int i = 0; i < 4; ++i)
    StartAgent("n" + std::to_string(i), EtcdFlags(*etcd_, "4", 2, "four"),
               {"--env-file", dir_ / "env", "--pid-file", dir_ / "pids"});
  for (int i = 0; i < 4; ++i) EXPECT_EQ(Wait("n" + std::to_string(i)), 0) << Err("n" + std::to_string(i));
  std::set<std::string> groups;
  for (int rank = 0; rank < 8; ++rank) {
    auto env = ReadEnvFile(dir_ / ("env." + std::to_string(rank)));
    EXPECT_EQ(env["WORLD_SIZE"], "8");
    EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "four");
    groups.insert(env["GROUP_RANK"]);
  }
  EXPECT_EQ(groups.size(), 4u);
  ExpectWorkersGone();
}

TEST_F(EtcdJob, NoRestartsLeftBothNodesExitWithTheRootCausesCode) {
  StartEtcd(1);
  const std::vector<std::string> worker{"--env-file", dir_ / "env", "--pid-file", dir_ / "pids", "--only-rank", "1",
                                        "--only-attempt", "0", "--exit", "1", "--else-hang-attempt", "0"};
  StartAgent("n0", EtcdFlags(*etcd_, "2", 1, "fail"), worker);
  StartAgent("n1", EtcdFlags(*etcd_, "2", 1, "fail"), worker);
  EXPECT_EQ(Wait("n0"), 1) << "max_restarts=0: the job fails on both nodes alike\n" << Err("n0");
  EXPECT_EQ(Wait("n1"), 1) << Err("n1");
  ExpectWorkersGone();
}

TEST_F(EtcdJob, AFailureWithARestartLeftRestartsBothNodes) {
  StartEtcd(1);
  const std::vector<std::string> worker{"--env-file", dir_ / "env", "--pid-file", dir_ / "pids", "--only-rank", "1",
                                        "--only-attempt", "0", "--exit", "1", "--else-hang-attempt", "0"};
  auto flags = EtcdFlags(*etcd_, "2", 1, "restart");
  flags.push_back("--max_restarts=1");
  StartAgent("n0", flags, worker);
  StartAgent("n1", flags, worker);
  EXPECT_EQ(Wait("n0"), 0) << Err("n0");
  EXPECT_EQ(Wait("n1"), 0) << Err("n1");
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_EQ(ReadEnvFile(dir_ / ("env." + std::to_string(rank)))["TORCHELASTIC_RESTART_COUNT"], "1");
  ExpectWorkersGone();
}

TEST_F(EtcdJob, KilledAgentsLeaseExpiresAndTheOthersGoOn) {
  StartEtcd(1);
  const std::vector<std::string> worker{"--env-file", dir_ / "env", "--pid-file", dir_ / "pids", "--hang-if-world", "3"};
  for (int i = 0; i < 3; ++i) StartAgent("n" + std::to_string(i), EtcdFlags(*etcd_, "2:3", 1, "lease"), worker);
  ASSERT_TRUE(WaitFor([&] { return ReadPids(dir_ / "pids").size() >= 3; }, seconds(30))) << Err("n0");
  agents_.at("n2")->Signal(SIGKILL);
  EXPECT_EQ(Wait("n2"), 128 + SIGKILL);
  EXPECT_EQ(Wait("n0", seconds(30)), 0) << Err("n0");
  EXPECT_EQ(Wait("n1", seconds(30)), 0) << Err("n1");
  EXPECT_EQ(ReadEnvFile(dir_ / "env.0")["WORLD_SIZE"], "2");
  EXPECT_EQ(ReadEnvFile(dir_ / "env.0")["TORCHELASTIC_RESTART_COUNT"], "0");
  ExpectWorkersGone();
}

// An agent stopped past its lease (SIGSTOP; Ctrl-Z does the same) is dropped by the others, who
// finish the job without it. Continued, it takes a new lease and finds the job over: it ends as a
// node that waited (exit 0), as with the store backend; its lease's expiry used to end it with
// "lost the rendezvous" (exit 3).
TEST_F(EtcdJob, AnAgentStoppedPastItsLeaseComesBackAndTakesTheJobsOutcome) {
  StartEtcd(1);
  const std::vector<std::string> worker{"--pid-file", dir_ / "pids", "--hang-if-world", "3"};
  for (int i = 0; i < 3; ++i) StartAgent("n" + std::to_string(i), EtcdFlags(*etcd_, "2:3", 1, "stopped"), worker);
  ASSERT_TRUE(WaitFor([&] { return ReadPids(dir_ / "pids").size() >= 3; }, seconds(30))) << Err("n0");
  agents_.at("n2")->Signal(SIGSTOP);
  EXPECT_EQ(Wait("n0", seconds(40)), 0) << Err("n0");
  EXPECT_EQ(Wait("n1", seconds(40)), 0) << Err("n1");
  agents_.at("n2")->Signal(SIGCONT);
  EXPECT_EQ(Wait("n2", seconds(30)), 0) << Err("n2");
  EXPECT_EQ(Err("n2").find("lost the rendezvous"), std::string::npos) << Err("n2");
  ExpectWorkersGone();
}

// The same while the job still runs: the continued agent joins the next round, and all three
// finish it (rounds: 3 nodes, 2 while it was stopped, 3 again).
TEST_F(EtcdJob, AnAgentStoppedPastItsLeaseRejoinsARunningJob) {
  StartEtcd(1);
  const std::string go = dir_ / "go";
  const std::vector<std::string> worker{"--pid-file", dir_ / "pids", "--hang-if-world", "2", "--wait-file", go};
  for (int i = 0; i < 3; ++i) StartAgent("n" + std::to_string(i), EtcdFlags(*etcd_, "2:3", 1, "rejoin"), worker);
  ASSERT_TRUE(WaitFor([&] { return ReadPids(dir_ / "pids").size() >= 3; }, seconds(30))) << Err("n0");
  agents_.at("n2")->Signal(SIGSTOP);
  ASSERT_TRUE(WaitFor([&] { return ReadPids(dir_ / "pids").size() >= 5; }, seconds(30)))
      << "the others did not go on without the stopped node\n" << Err("n0");
  agents_.at("n2")->Signal(SIGCONT);
  ASSERT_TRUE(WaitFor([&] { return ReadPids(dir_ / "pids").size() >= 8; }, seconds(40)))
      << "no round of 3 after the node came back\n" << Err("n0") << Err("n2");
  std::ofstream(go).put('x');
  for (const char* n : {"n0", "n1", "n2"}) EXPECT_EQ(Wait(n, seconds(30)), 0) << n << "\n" << Err(n);
  ExpectWorkersGone();
}

// The job must not notice an etcd leader change beyond a short delay: no restart, no failure.
TEST_F(EtcdJob, KillingTheEtcdLeaderMidJobChangesNothing) {
  StartEtcd(3);
  const std::vector<std::string> worker{"--pid-file", dir_ / "pids", "--wait-file", dir_ / "go"};
  StartAgent("n0", EtcdFlags(*etcd_, "2", 1, "leader"), worker);
  StartAgent("n1", EtcdFlags(*etcd_, "2", 1, "leader"), worker);
  ASSERT_TRUE(WaitFor([&] { return ReadPids(dir_ / "pids").size() >= 2; }, seconds(30))) << Err("n0");
  const int leader = etcd_->Leader();
  ASSERT_GE(leader, 0);
  etcd_->Kill(leader);
  ASSERT_TRUE(WaitFor([&] { return etcd_->Leader() >= 0; }, seconds(20))) << "no new etcd leader";
  // Longer than the heartbeat deadline (3 s): liveness went on through the new leader.
  ASSERT_FALSE(WaitFor([&] { return ReadPids(dir_ / "pids").size() > 2; }, seconds(4))) << "workers restarted";
  ASSERT_EQ(::close(::open((dir_ / "go").c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644)), 0);
  EXPECT_EQ(Wait("n0"), 0) << Err("n0");
  EXPECT_EQ(Wait("n1"), 0) << Err("n1");
  EXPECT_EQ(ReadPids(dir_ / "pids").size(), 2u) << "the workers were never restarted";
}

TEST_F(EtcdJob, EtcdRestartedMidRunChangesNothing) {
  StartEtcd(1);
  const std::vector<std::string> worker{"--pid-file", dir_ / "pids", "--wait-file", dir_ / "go"};
  StartAgent("n0", EtcdFlags(*etcd_, "2", 1, "restart-etcd"), worker);
  StartAgent("n1", EtcdFlags(*etcd_, "2", 1, "restart-etcd"), worker);
  ASSERT_TRUE(WaitFor([&] { return ReadPids(dir_ / "pids").size() >= 2; }, seconds(30))) << Err("n0");
  Status st = etcd_->Restart(0);
  ASSERT_TRUE(st.ok()) << st.message();
  ASSERT_FALSE(WaitFor([&] { return ReadPids(dir_ / "pids").size() > 2; }, seconds(4))) << "workers restarted";
  ASSERT_EQ(::close(::open((dir_ / "go").c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644)), 0);
  EXPECT_EQ(Wait("n0"), 0) << Err("n0");
  EXPECT_EQ(Wait("n1"), 0) << Err("n1");
  EXPECT_EQ(ReadPids(dir_ / "pids").size(), 2u);
}

// A dead endpoint before a live one: the fail-over works at once, so nothing is said of an
// unreachable etcd.
TEST_F(EtcdJob, AFailOverThatWorksAtOnceIsNoOutage) {
  StartEtcd(1);
  auto flags = EtcdFlags(*etcd_, "1", 1, "failover");
  for (auto& f : flags)
    if (f.rfind("--rdzv_endpoint=", 0) == 0) f = "--rdzv_endpoint=127.0.0.1:1," + f.substr(16);
  StartAgent("n0", flags, {});
  EXPECT_EQ(Wait("n0", seconds(30)), 0) << Err("n0");
  EXPECT_EQ(Err("n0").find("cannot reach etcd"), std::string::npos) << Err("n0");
}

TEST_F(EtcdJob, UnreachableEtcdIsARendezvousError) {
  StartAgent("n0",
             {"--nnodes=2", "--rdzv_backend=etcd", "--rdzv_endpoint=127.0.0.1:1", "--rdzv_id=x",
              "--rdzv_conf=read_timeout=2"},
             {});
  EXPECT_EQ(Wait("n0", seconds(30)), 3);
  EXPECT_NE(Err("n0").find("etcd"), std::string::npos) << Err("n0");
}

}  // namespace
}  // namespace ctrun::testing
