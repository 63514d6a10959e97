// End-to-end: the examples under the real ctrun binary. The same `train` job ends with
// bit-identical parameters with no failure, with failures injected at several steps on different
// ranks, and with a rank SIGKILLed from outside at a random time; the same for train.py.
// Skipped (with a message) while CTRUN_BINARY cannot run a trivial job yet.
#include <dirent.h>
#include <signal.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "helpers/test_util.h"

namespace ctrun::worker {
namespace {

using namespace std::chrono_literals;
using ctrun::testing::BackgroundProcess;
using ctrun::testing::CountOf;
using ctrun::testing::ParentOf;
using ctrun::testing::ReadFileOr;
using ctrun::testing::RunCommand;
using ctrun::testing::RunResult;
using ctrun::testing::TempDir;
using ctrun::testing::WaitFor;

void SkipUnlessCtrunRunsJobs() {
  static const std::string why = [] {
    if (!std::filesystem::exists(CTRUN_BINARY)) return std::string("ctrun binary not built");
    RunResult r = RunCommand({CTRUN_BINARY, "--standalone", "--nproc_per_node=1", "/bin/true"}, {}, 30s);
    if (r.exit_code != 0) return "ctrun cannot run a trivial job yet (exit " + std::to_string(r.exit_code) + "): " + r.err;
    return std::string();
  }();
  if (!why.empty()) GTEST_SKIP() << why;
}

std::vector<std::string> Ctrun(int nproc, int max_restarts, std::vector<std::string> cmd) {
  std::vector<std::string> argv{CTRUN_BINARY, "--standalone", "--nproc_per_node=" + std::to_string(nproc),
                                "--max_restarts=" + std::to_string(max_restarts)};
  argv.insert(argv.end(), cmd.begin(), cmd.end());
  return argv;
}

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Live descendants of `ancestor` running the executable `exe`.
std::vector<pid_t> DescendantsRunning(pid_t ancestor, const std::string& exe) {
  std::vector<pid_t> out;
  std::error_code ec;
  const auto want = std::filesystem::canonical(exe, ec);
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string base = e.path().filename().string();
    if (base.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(base));
    if (std::filesystem::read_symlink(e.path() / "exe", ec) != want || ec) continue;
    for (pid_t p = ParentOf(pid); p > 1; p = ParentOf(p)) {
      if (p == ancestor) {
        out.push_back(pid);
        break;
      }
    }
  }
  return out;
}

bool HasSnapshot(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".ctsnap" || e.path().extension() == ".ptsnap") return true;
  }
  return false;
}

class TrainDeterminism : public ::testing::Test {
 protected:
  void SetUp() override { SkipUnlessCtrunRunsJobs(); }
  TempDir dir_;
};

const std::vector<std::string> kTrainArgs{"--epochs", "3", "--batch-size", "16", "--quiet"};

TEST_F(TrainDeterminism, CppTrainIsBitIdenticalWithInjectedFailuresAndAnExternalKill) {
  const std::vector<std::string> train = Concat({TRAIN_BINARY}, kTrainArgs);
  // 1. Reference: no failure, no snapshots.
  RunResult ref = RunCommand(Ctrun(2, 0, Concat(train, {"--out", dir_ / "ref.txt"})), {}, 120s);
  ASSERT_EQ(ref.exit_code, 0) << ref.out << ref.err;
  const std::string expected = ReadFileOr(dir_ / "ref.txt");
  ASSERT_FALSE(expected.empty());

  // 2. Three injected crashes on alternating ranks, one per attempt; each restart resumes.
  RunResult inj = RunCommand(Ctrun(2, 3, Concat(train, {"--snapshot-dir", dir_ / "snap1", "--snapshot-every", "5",
                                                 "--fail-at-step", "7,22,40", "--fail-rank", "1,0,1",
                                                 "--out", dir_ / "inj.txt"})),
                      {}, 150s);
  ASSERT_EQ(inj.exit_code, 0) << inj.out << inj.err;
  EXPECT_EQ(CountOf(inj.out, "resumed from snapshot"), 3) << inj.out;
  EXPECT_NE(inj.out.find("resumed from snapshot at step 5 "), std::string::npos) << inj.out;
  EXPECT_NE(inj.out.find("resumed from snapshot at step 40 "), std::string::npos) << inj.out;
  EXPECT_EQ(ReadFileOr(dir_ / "inj.txt"), expected) << "parameters differ after injected failures";

  // 3. A worker SIGKILLed from outside at a random time after the first snapshot.
  BackgroundProcess job(Ctrun(2, 3, Concat(train, {"--snapshot-dir", dir_ / "snap2", "--snapshot-every", "4",
                                                   "--step-ms", "25", "--out", dir_ / "kill.txt"})),
                        {}, dir_ / "kill.out", dir_ / "kill.err");
  ASSERT_TRUE(WaitFor([&] { return HasSnapshot(dir_ / "snap2/rank1"); }, 60s)) << ReadFileOr(dir_ / "kill.err");
  std::mt19937 rng(std::random_device{}());
  std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 300)(rng)));
  std::vector<pid_t> workers = DescendantsRunning(job.pid(), TRAIN_BINARY);
  ASSERT_EQ(workers.size(), 2u) << ReadFileOr(dir_ / "kill.err");
  const pid_t victim = workers[std::uniform_int_distribution<size_t>(0, 1)(rng)];
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  ASSERT_EQ(job.Wait(120s), 0) << ReadFileOr(dir_ / "kill.out") << ReadFileOr(dir_ / "kill.err");
  const std::string out = ReadFileOr(dir_ / "kill.out");
  // The kill lands at most ~0.3 s after the first snapshot, 0.9 s before the last of 48 25-ms
  // steps: that much delay of this thread is what the test tolerates.
  EXPECT_NE(out.find("resumed from snapshot"), std::string::npos) << out;
  EXPECT_EQ(ReadFileOr(dir_ / "kill.txt"), expected) << "parameters differ after SIGKILL of pid " << victim;
}

TEST_F(TrainDeterminism, PythonTrainIsBitIdenticalWithInjectedFailures) {
  if (!ctrun::testing::PythonCanImport("torch.distributed")) GTEST_SKIP() << "Debian python3-torch not importable";
  const std::vector<std::string> train = Concat({"/usr/bin/python3", TRAIN_PY}, kTrainArgs);
  RunResult ref = RunCommand(Ctrun(2, 0, Concat(train, {"--out", dir_ / "ref.txt"})), {}, 150s);
  ASSERT_EQ(ref.exit_code, 0) << ref.out << ref.err;
  const std::string expected = ReadFileOr(dir_ / "ref.txt");
  ASSERT_FALSE(expected.empty());
  RunResult inj = RunCommand(Ctrun(2, 2, Concat(train, {"--snapshot-dir", dir_ / "snap", "--snapshot-every", "5",
                                                 "--fail-at-step", "9,33", "--fail-rank", "0,1",
                                                 "--out", dir_ / "inj.txt"})),
                      {}, 180s);
  ASSERT_EQ(inj.exit_code, 0) << inj.out << inj.err;
  EXPECT_EQ(CountOf(inj.out, "resumed from snapshot"), 2) << inj.out;
  EXPECT_EQ(ReadFileOr(dir_ / "inj.txt"), expected) << "train.py parameters differ after injected failures";
}

TEST(ExamplesUnderCtrun, GlooAllreduceSumsToWorldSize) {
  SkipUnlessCtrunRunsJobs();
  RunResult r = RunCommand(Ctrun(3, 0, {GLOO_ALLREDUCE}), {}, 90s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(CountOf(r.out, "sum == world size"), 3) << r.out;
}

TEST(ExamplesUnderCtrun, FailedTrainLeavesTorchelasticErrorFileForTheSummary) {
  SkipUnlessCtrunRunsJobs();
  TempDir dir;
  RunResult r = RunCommand(Ctrun(2, 0, {TRAIN_BINARY, "--epochs", "1", "--quiet", "--fail-at-step", "2", "--fail-rank", "1"}),
                    {}, 90s);
  EXPECT_NE(r.exit_code, 0);
  // The launcher reads the worker's error file: its message shows up in the failure report.
  EXPECT_NE((r.out + r.err).find("injected failure at step 2 on rank 1"), std::string::npos) << r.out << r.err;
}

// train beats its global step (resumed from the snapshot), so ctrun's crash-loop guard sees each
// attempt get further than the last one failed, and lets a job that makes progress go on. With
// the bare beat counter (1, 2, ... per process) four failures ended it as a crash loop.
TEST(ExamplesUnderCtrun, TrainBeatsItsGlobalStepSoRepeatedFailuresWithProgressAreNotACrashLoop) {
  SkipUnlessCtrunRunsJobs();
  TempDir dir;
  std::vector<std::string> cmd{"--heartbeat-timeout", "120", TRAIN_BINARY, "--epochs", "4", "--quiet",
                               "--snapshot-dir", dir / "snap", "--snapshot-every", "5",
                               "--fail-at-step", "12,22,32,42", "--fail-rank", "0"};
  RunResult r = RunCommand(Ctrun(2, 10, cmd), {}, 240s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ((r.out + r.err).find("crash loop"), std::string::npos) << r.err;
  EXPECT_EQ(CountOf(r.out, "resumed from snapshot"), 4) << r.out;
}

}  // namespace
}  // namespace ctrun::worker
