// Real PyTorch under ctrun: Debian torch 1.13 Python programs (gloo, env://, @record) and a
// LibTorch C++ program, launched the way users launch them with torchrun.
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <regex>

#include "helpers/free_port.h"
#include "helpers/test_util.h"

namespace ctrun::testing {
namespace {

using namespace std::chrono_literals;

bool HaveTorch() { return PythonCanImport("torch.distributed"); }

std::string Script(const std::string& name) { return std::string(COMPAT_DIR) + "/" + name; }

const std::vector<std::string> kPyEnv = {"PYTHON_EXEC=/usr/bin/python3", "TEST_SENTINEL_PARENT=parent"};

TEST(Compat, PythonScriptSeesTorchrunEnvironment) {
  if (!HaveTorch()) GTEST_SKIP() << "/usr/bin/python3 cannot import torch (install python3-torch)";
  TempDir d;
  auto r = RunCommand({CTRUN_BINARY, "--standalone", "--nproc_per_node=3", Script("env_script.py"), d.path()}, kPyEnv,
                      120s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (int i = 0; i < 3; ++i) {
    std::string f = ReadFileOr(d / std::to_string(i));
    EXPECT_NE(f.find("RANK=" + std::to_string(i) + "\n"), std::string::npos) << f;
    EXPECT_NE(f.find("TEST_SENTINEL_PARENT=parent"), std::string::npos) << f;
  }
}

TEST(Compat, PetEnvironmentFallbacksWork) {
  if (!HaveTorch()) GTEST_SKIP() << "no torch";
  TempDir d;
  std::vector<std::string> env = kPyEnv;
  env.push_back("PET_NPROC_PER_NODE=2");
  env.push_back("PET_STANDALONE=1");
  auto r = RunCommand({CTRUN_BINARY, Script("env_script.py"), d.path()}, env, 120s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(ReadFileOr(d / "1").empty());
  EXPECT_TRUE(ReadFileOr(d / "2").empty());
}

TEST(Compat, GlooAllReduceWithFourWorkers) {
  if (!HaveTorch()) GTEST_SKIP() << "no torch";
  auto r = RunCommand({CTRUN_BINARY, "--standalone", "--nproc_per_node=4", Script("ddp_gloo.py")}, kPyEnv, 180s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("all_reduce ok world_size=4"), std::string::npos) << r.out << r.err;
  EXPECT_NE(r.out.find("agent_store=True"), std::string::npos) << r.out;
}

// Two ctrun agents (c10d rendezvous on loopback) x 2 workers: one gloo world of 4 across the
// nodes, bootstrapped through node 0's agent store; the last rank fails in attempt 0 and every
// node restarts.
TEST(Compat, GlooAllReduceAcrossTwoNodesWithARestart) {
  if (!HaveTorch()) GTEST_SKIP() << "no torch";
  TempDir d;
  // A port nobody holds now (a pid-derived one could be an ephemeral port another test's sockets
  // took, and the agents would then dial a stranger's listener).
  const std::string port = std::to_string(FreePort());
  std::vector<std::string> env = kPyEnv;
  env.push_back("CTRUN_TEST_FAIL_UNTIL_ATTEMPT=1");
  std::vector<std::unique_ptr<BackgroundProcess>> nodes;
  for (int i = 0; i < 2; ++i)
    nodes.push_back(std::make_unique<BackgroundProcess>(
        std::vector<std::string>{CTRUN_BINARY, "--nnodes=2", "--nproc_per_node=2", "--rdzv_backend=c10d",
                                 "--rdzv_endpoint=127.0.0.1:" + port, "--rdzv_id=gloo2", "--max_restarts=1",
                                 Script("ddp_gloo.py")},
        env, d / ("out" + std::to_string(i)), d / ("err" + std::to_string(i))));
  EXPECT_EQ(nodes[0]->Wait(240s), 0) << ReadFileOr(d / "err0");
  EXPECT_EQ(nodes[1]->Wait(240s), 0) << ReadFileOr(d / "err1");
  const std::string out = ReadFileOr(d / "out0") + ReadFileOr(d / "out1");
  EXPECT_NE(out.find("all_reduce ok world_size=4 restart=0 agent_store=True"), std::string::npos) << out;
  EXPECT_NE(out.find("all_reduce ok world_size=4 restart=1 agent_store=True"), std::string::npos) << out;
}

TEST(Compat, GlooAllReduceWithWorkerHostedStore) {
  if (!HaveTorch()) GTEST_SKIP() << "no torch";
  for (const std::vector<std::string>& how : {std::vector<std::string>{"--no-agent-store"},
                                              std::vector<std::string>{}}) {
    std::vector<std::string> argv{CTRUN_BINARY, "--standalone", "--nproc_per_node=2"};
    argv.insert(argv.end(), how.begin(), how.end());
    argv.push_back(Script("ddp_gloo.py"));
    std::vector<std::string> env = kPyEnv;
    if (how.empty()) env.push_back("TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1");
    auto r = RunCommand(argv, env, 180s);
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("all_reduce ok world_size=2"), std::string::npos) << r.out << r.err;
  }
}

TEST(Compat, GlooAllReduceAcrossRestarts) {
  if (!HaveTorch()) GTEST_SKIP() << "no torch";
  std::vector<std::string> env = kPyEnv;
  env.push_back("CTRUN_TEST_FAIL_UNTIL_ATTEMPT=3");
  // 4 workers with the agent store, three failed attempts (the last rank exits 9 after the
  // all_reduce), then success: the store must serve every attempt with no stale keys.
  auto r = RunCommand({CTRUN_BINARY, "--standalone", "--nproc_per_node=4", "--max_restarts=3", Script("ddp_gloo.py")},
                      env, 220s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int a = 0; a <= 3; ++a)
    EXPECT_NE(r.out.find("world_size=4 restart=" + std::to_string(a) + " agent_store=True"), std::string::npos)
        << r.out << r.err;
}

TEST(Compat, RecordDecoratedTracebackAppearsInSummary) {
  if (!HaveTorch()) GTEST_SKIP() << "no torch";
  auto r = RunCommand({CTRUN_BINARY, "--standalone", "--nproc_per_node=2", Script("record_fail.py")}, kPyEnv, 120s);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("record_fail.py FAILED"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("ValueError: corrupt sample 1234 on rank 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("in load_batch"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("error_file:"), std::string::npos) << r.err;
}

TEST(Compat, ModuleEntrypointRunsUnderPython) {
  if (!HaveTorch()) GTEST_SKIP() << "no torch";
  auto r = RunCommand({CTRUN_BINARY, "--standalone", "--nproc_per_node=2", "-m", "json.tool", "--help"}, kPyEnv, 60s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("usage"), std::string::npos) << r.out;
}

// Rank 1 of a real DDP job blocks forever in an all_reduce: ctrun finds it at the heartbeat
// deadline, saves its native and Python stacks under the log dir, restarts, and the job finishes.
TEST(Compat, RankBlockedInAllReduceIsFoundStackedAndRestarted) {
  if (!HaveTorch()) GTEST_SKIP() << "no torch";
  if (access("/usr/bin/gdb", X_OK) != 0) GTEST_SKIP() << "no gdb (Python stacks)";
  TempDir d;
  auto r = RunCommand({CTRUN_BINARY, "--standalone", "--nproc_per_node=2", "--max_restarts=1", "--heartbeat-timeout=10",
                       "--heartbeat-first-timeout=120", "--stack-timeout=60", "--log-dir", d.path(),
                       "--log-prefix=rank", Script("ddp_hang.py")},
                      kPyEnv, 230s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("ddp_hang done restart=1"), std::string::npos) << r.out << r.err;
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(rank 1 \(local_rank 1, pid \d+\) hung: no heartbeat for 1\d s \(last beat at step 4\))")))
      << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex(R"(stacks of \d+ process(es)? saved in (\S+) \(native: \S+; Python: \d+ process)")))
      << r.err;
  const std::string dir = m[2];
  std::string native;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("native.", 0) == 0 && name.ends_with(".txt")) native += ReadFileOr(e.path().string());
  }
  EXPECT_NE(native.find("c10d::"), std::string::npos) << native;  // blocked in the collective
  // The Python stacks, on rank 1's stderr (relayed with its prefix).
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(\[r1\] +File ".*ddp_hang\.py", line \d+ in <module>)"))) << r.err;
}

// Rank 1 stops in its own code while rank 0 waits for it in an all_reduce: both fall silent at
// once, so which deadline passes first is chance. Both have their stacks saved (rank 0's native
// stacks show the collective), and rank 1 is the root cause either way: when rank 0's deadline
// came first, its native stacks show its main thread waiting in a collective and the blame moves.
TEST(Compat, ACollectiveHangNamesAndStacksEverySilentRank) {
  if (!HaveTorch()) GTEST_SKIP() << "no torch";
  if (access("/usr/bin/gdb", X_OK) != 0) GTEST_SKIP() << "no gdb (Python stacks)";
  TempDir d;
  auto r = RunCommand({CTRUN_BINARY, "--standalone", "--nproc_per_node=2", "--heartbeat-timeout=8",
                       "--heartbeat-first-timeout=120", "--stack-timeout=60", "--log-dir", d.path(),
                       Script("ddp_collective_hang.py")},
                      kPyEnv, 230s);
  ASSERT_EQ(r.exit_code, 124) << r.out << r.err;
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(cause     : hung: (no heartbeat for \S+ s \(last beat at step 4\); rank 0 had fallen silent too|fell silent with rank 0, whose main thread waits in a collective))")))
      << r.err;
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(Root Cause \(first observed failure\):\n\[0\]:\n.*\n.*\n  rank      : 1 \(local_rank: 1\))")))
      << r.err;
  for (const std::string rank : {"0", "1"}) {
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.err, m, std::regex("rank " + rank + R"(: stacks of \d+ process(es)? saved in (\S+) )")))
        << r.err;
    std::string native;
    for (const auto& e : std::filesystem::directory_iterator(m[2].str())) {
      const std::string name = e.path().filename().string();
      if (name.rfind("native.", 0) == 0 && name.ends_with(".txt")) native += ReadFileOr(e.path().string());
    }
    EXPECT_NE(native.find("#1"), std::string::npos) << "rank " << rank << ": " << native;
    if (rank == "0") {
      EXPECT_NE(native.find("c10d::"), std::string::npos) << native;  // waits in the collective
    }
  }
}

TEST(Compat, LibTorchGlooAllReduce) {
#ifdef GLOO_ALLREDUCE
  auto r = RunCommand({CTRUN_BINARY, "--standalone", "--nproc_per_node=4", GLOO_ALLREDUCE}, {}, 180s);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
#else
  GTEST_SKIP() << "LibTorch example gloo_allreduce not built (LibTorch not found)";
#endif
}

}  // namespace
}  // namespace ctrun::testing
