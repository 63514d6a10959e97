// ctrun --warm with LibTorch C++ workers (CTRUN_MAIN): LibTorch's default generator differs across
// ranks and attempts as in fresh processes, and examples/train ends bit-identical warm and cold
// after a crash between snapshots.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <sstream>

#include "helpers/test_util.h"
#include "warm/warm_test_util.h"

namespace ctrun::warm {
namespace {

using namespace std::chrono_literals;
using ctrun::testing::CountOf;
using ctrun::testing::ReadFileOr;
using ctrun::testing::RunCommand;
using ctrun::testing::RunResult;
using ctrun::testing::TempDir;

std::vector<std::string> Ctrun(int nproc, int max_restarts, const std::vector<std::string>& flags,
                               const std::vector<std::string>& cmd) {
  return ctrun::testing::StandaloneCtrun(nproc, max_restarts, flags, cmd);
}

bool StartedWarm(const RunResult& r) { return ctrun::testing::StartedNativeWarm(r.err); }

TEST(WarmTorch, DefaultGeneratorDiffersAcrossRanksAndAttempts) {
  for (const bool warm : {false, true}) {
    TempDir dir;
    std::vector<std::string> flags;
    if (warm) flags = {"--warm"};
    RunResult r = RunCommand(Ctrun(2, 1, flags, {WARM_TORCH_PROBE, dir.path(), "2", "0"}), {}, 120s);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(StartedWarm(r), warm) << r.err;
    EXPECT_EQ(r.err.find("start cold"), std::string::npos) << r.err;
    std::set<std::string> seeds, draws;
    for (int attempt = 0; attempt < 2; ++attempt)
      for (int rank = 0; rank < 2; ++rank) {
        std::istringstream in(ReadFileOr(dir / ("attempt" + std::to_string(attempt) + "-rank" + std::to_string(rank) + ".txt")));
        std::string seed, draw;
        ASSERT_TRUE(in >> seed >> draw) << attempt << " " << rank;
        seeds.insert(seed);
        draws.insert(draw);
      }
    EXPECT_EQ(seeds.size(), 4u) << (warm ? "warm" : "cold");
    EXPECT_EQ(draws.size(), 4u) << (warm ? "warm" : "cold");
  }
}

TEST(WarmTorch, TrainColdAndWarmEndBitIdenticalAfterACrashBetweenSnapshots) {
  TempDir dir;
  // 3 ranks: 512 samples / 3 / 16 = 11 steps per epoch; the crash at step 14 is neither a snapshot
  // (every 5) nor an epoch boundary; attempt 1 resumes from step 10.
  const std::vector<std::string> train{TRAIN_BINARY, "--epochs", "2", "--quiet"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> v = train;
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
  };
  RunResult ref = RunCommand(Ctrun(3, 0, {}, with({"--out", dir / "ref.txt"})), {}, 150s);
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  const std::string expected = ReadFileOr(dir / "ref.txt");
  ASSERT_FALSE(expected.empty());
  ASSERT_EQ(expected.find("0000c0ff"), std::string::npos) << "the reference run diverged (NaN)";
  for (const bool warm : {false, true}) {
    const std::string tag = warm ? "warm" : "cold";
    std::vector<std::string> flags;
    if (warm) flags = {"--warm"};
    RunResult r = RunCommand(Ctrun(3, 1, flags,
                                   with({"--snapshot-dir", dir / ("snap-" + tag), "--out", dir / (tag + ".txt"),
                                         "--snapshot-every", "5", "--fail-at-step", "14", "--fail-rank", "1"})),
                             {}, 150s);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(StartedWarm(r), warm) << r.err;
    EXPECT_EQ(r.err.find("start cold"), std::string::npos) << r.err;
    EXPECT_EQ(CountOf(r.out, "resumed from snapshot at step 10"), 1) << r.out;
    EXPECT_EQ(ReadFileOr(dir / (tag + ".txt")), expected) << tag << ": parameters differ after the crash";
    // Its gloo peers may die of SIGPIPE before its error file is written: they lost a peer.
    EXPECT_NE(r.err.find("root cause: worker rank 1 ("), std::string::npos) << tag << "\n" << r.err;
    EXPECT_EQ(CountOf(r.err, "[train] rank 1 injecting failure at step 14 (attempt 0)"), 1) << r.err;
  }
}

}  // namespace
}  // namespace ctrun::warm
