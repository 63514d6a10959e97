// Worker output through the real ctrun binary: ordering and completeness, crash tails, log-dir
// layout across restarts, tee/redirect, filters and prefix templates.
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <regex>

#include "helpers/ctrun_command.h"
#include "helpers/test_util.h"

namespace ctrun::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;


// The single <run_id>_XXXXXX directory ctrun made under base.
std::string RunDir(const std::string& base) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(base)) found.push_back(e.path().string());
  return found.size() == 1 ? found[0] : "";
}

TEST(LogsE2E, EightWorkersHundredThousandLinesEachArriveOnceInOrderPrefixed) {
  constexpr int kLines = 100000;
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=8"}, {"--print", std::to_string(kLines)}), {}, 120s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<int> next(8, 0);
  const std::regex re(R"(^\[r(\d)\] rank (\d) line (\d+)$)");
  size_t n = 0;
  for (const auto& line : SplitLines(r.out)) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, re)) << "malformed or merged line: '" << line << "'";
    int prefix_rank = std::stoi(m[1]), rank = std::stoi(m[2]), i = std::stoi(m[3]);
    ASSERT_EQ(prefix_rank, rank) << line;
    ASSERT_EQ(i, next[rank]) << "rank " << rank << " out of order or duplicated";
    ++next[rank];
    ++n;
  }
  EXPECT_EQ(n, static_cast<size_t>(8 * kLines));
  for (int k = 0; k < 8; ++k) EXPECT_EQ(next[k], kLines) << "rank " << k;
}

TEST(LogsE2E, PartialLineOfCrashingWorkerIsInConsoleLogAndSummary) {
  TempDir d;
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2", "--log_dir", d.path(), "--tee", "2"},
                            {"--only-rank", "1", "--stderr", "loading shard 7", "--partial", "CUDA error: out of memory",
                             "--signal", "9"}));
  EXPECT_EQ(r.exit_code, 128 + 9) << r.err;
  EXPECT_NE(r.err.find("CUDA error: out of memory"), std::string::npos) << r.err;
  // The summary quotes the tail of rank 1's stderr.
  size_t summary = r.err.find("Root Cause (first observed failure):");
  ASSERT_NE(summary, std::string::npos) << r.err;
  EXPECT_NE(r.err.find("CUDA error: out of memory", summary), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("loading shard 7", summary), std::string::npos) << r.err;
  std::string run = RunDir(d.path());
  EXPECT_EQ(ReadFileOr(run + "/attempt_0/1/stderr.log"), "loading shard 7\nCUDA error: out of memory");
}

TEST(LogsE2E, LogDirLayoutWithAttemptDirectoriesAfterRestart) {
  TempDir d;
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2", "--max_restarts=1", "--rdzv_id=myjob",
                             "--log_dir", d.path(), "--redirects", "3"},
                            {"--print", "3", "--stderr", "warn", "--only-rank", "0", "--only-attempt", "0", "--exit",
                             "2"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string run = RunDir(d.path());
  ASSERT_FALSE(run.empty());
  EXPECT_EQ(fs::path(run).filename().string().rfind("myjob_", 0), 0u) << run;
  for (int a : {0, 1})
    for (int lr : {0, 1}) {
      std::string rank_dir = run + "/attempt_" + std::to_string(a) + "/" + std::to_string(lr);
      EXPECT_TRUE(fs::is_directory(rank_dir)) << rank_dir;
      EXPECT_TRUE(fs::exists(rank_dir + "/stdout.log")) << rank_dir;
      EXPECT_TRUE(fs::exists(rank_dir + "/stderr.log")) << rank_dir;
    }
  EXPECT_EQ(ReadFileOr(run + "/attempt_1/1/stdout.log"), "rank 1 line 0\nrank 1 line 1\nrank 1 line 2\n");
  EXPECT_EQ(ReadFileOr(run + "/attempt_1/0/stderr.log"), "warn\n");
  // Redirected without tee: nothing of the workers on the console.
  EXPECT_EQ(r.out.find("rank 1 line"), std::string::npos) << r.out;
}

TEST(LogsE2E, ErrorFileEnvPointsIntoTheAttemptDirectory) {
  TempDir d;
  TempDir logs;
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2", "--log_dir", logs.path()},
                            {"--env-file", d / "env"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string env = ReadFileOr(d / "env.1");
  std::string run = RunDir(logs.path());
  EXPECT_NE(env.find("TORCHELASTIC_ERROR_FILE=" + run + "/attempt_0/1/error.json"), std::string::npos) << env;
}

TEST(LogsE2E, TeeWithTorchrunPrefixTemplate) {
  // torchrun's test_capture_logs_using_default_logs_specs: --redirects 3 --tee 3 with the
  // template "[rank${rank}]: ".
  TempDir d;
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=4", "--redirects", "3", "--tee", "3", "--log_dir",
                             d.path()},
                            {"--print", "1"}),
                      {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=[rank${rank}]: "});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (int i = 0; i < 4; ++i) {
    std::string want = "[rank" + std::to_string(i) + "]: rank " + std::to_string(i) + " line 0";
    EXPECT_NE(r.out.find(want), std::string::npos) << r.out;
    EXPECT_EQ(ReadFileOr(RunDir(d.path()) + "/attempt_0/" + std::to_string(i) + "/stdout.log"),
              "rank " + std::to_string(i) + " line 0\n");
  }
}

TEST(LogsE2E, LocalAndGlobalRankFilters) {
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=4", "--local-ranks-filter", "1,3"}, {"--print", "2"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.find("rank 0 line"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("rank 2 line"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 1 line 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 3 line 1"), std::string::npos) << r.out;
  auto g = RunCommand(Ctrun({"--standalone", "--nproc_per_node=4", "--ranks-filter", "2"}, {"--print", "2"}));
  ASSERT_EQ(g.exit_code, 0) << g.err;
  EXPECT_EQ(SplitLines(g.out), (std::vector<std::string>{"[r2] rank 2 line 0", "[r2] rank 2 line 1"}));
}

TEST(LogsE2E, PrefixNoneAndCustomTemplate) {
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2", "--log-prefix", "none", "--ranks-filter", "1"},
                            {"--print", "1"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "rank 1 line 0\n");
  auto t = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2", "--log-prefix", "<${rank}/${local_rank}> ",
                             "--ranks-filter", "1"},
                            {"--print", "1"}));
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_EQ(t.out, "<1/1> rank 1 line 0\n");
}

// torchrun renders TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE with safe_substitute: a placeholder it
// does not know stays as written and the run goes on. ctrun too, with one warning line.
TEST(LogsE2E, TorchrunsPrefixVariableWithAnUnknownPlaceholderStillRuns) {
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2", "--ranks-filter", "1"}, {"--print", "1"}),
                      {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=[$foo ${rank}] 100$ "});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[$foo 1] 100$ rank 1 line 0\n");
  size_t warnings = 0;
  for (const std::string& line : SplitLines(r.err)) warnings += line.find("unknown placeholder '$foo'") != std::string::npos;
  EXPECT_EQ(warnings, 1u) << r.err;
}

TEST(LogsE2E, SingleWorkerInheritsTheConsole) {
  // One worker, no log options: the worker writes to ctrun's own stdout directly.
  TempDir d;
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=1"}, {"--print", "1", "--fd-file", d / "fds"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "rank 0 line 0\n");
}

TEST(LogsE2E, BadLogFlagsAreUsageErrors) {
  for (const std::vector<std::string>& flags :
       {std::vector<std::string>{"--tee", "7"}, std::vector<std::string>{"--redirects", "0:3,x"},
        std::vector<std::string>{"--local-ranks-filter", "a,b"}, std::vector<std::string>{"--ranks-filter", "0,-1"},
        std::vector<std::string>{"--log-prefix", "${nope}"}}) {
    auto r = RunCommand(Ctrun(flags, {}));
    EXPECT_EQ(r.exit_code, 2) << flags[0] << " " << flags[1] << ": " << r.err;
    EXPECT_EQ(SplitLines(r.err).size(), 1u) << r.err;
  }
}

TEST(LogsE2E, DuplicateFiltersCopyMatchingLinesOfEveryRankToOneFilePerStream) {
  TempDir d;
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2", "--log_dir", d.path(), "--redirects", "1",
                             "--duplicate-stdout-filters", "line 1,line 3", "--duplicate-stderr-filters", "oops,,x"},
                            {"--print", "5", "--stderr", "oops,x happened", "--partial", "oops,x at the end"}));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const std::string run = RunDir(d.path());
  ASSERT_FALSE(run.empty());
  std::vector<std::string> out = SplitLines(ReadFileOr(run + "/attempt_0/filtered_stdout.log"));
  std::sort(out.begin(), out.end());
  EXPECT_EQ(out, (std::vector<std::string>{"[r0] rank 0 line 1", "[r0] rank 0 line 3", "[r1] rank 1 line 1",
                                           "[r1] rank 1 line 3"}));
  // ",," is a literal comma; a partial last line (no newline before the exit) counts.
  std::vector<std::string> err = SplitLines(ReadFileOr(run + "/attempt_0/filtered_stderr.log"));
  std::sort(err.begin(), err.end());
  EXPECT_EQ(err, (std::vector<std::string>{"[r0] oops,x at the end", "[r0] oops,x happened", "[r1] oops,x at the end",
                                           "[r1] oops,x happened"}));
  // The redirected stdout still lands whole in the per-rank files, and not on the console.
  EXPECT_EQ(SplitLines(ReadFileOr(run + "/attempt_0/0/stdout.log")).size(), 5u);
  EXPECT_EQ(r.out.find("rank 0 line"), std::string::npos) << r.out;
}

// Without --log_dir the filtered files go to a fresh $TMPDIR/torchelastic_* base, which a
// successful run without log files removes: with filters it must be kept and named, as with
// --redirects, or the files the user asked for are gone when ctrun exits.
TEST(LogsE2E, DuplicateFiltersWithoutLogDirKeepAndNameTheFreshDirectory) {
  TempDir tmp;
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2", "--duplicate-stdout-filters", "line 1"},
                            {"--print", "3"}),
                      {"TMPDIR=" + tmp.path()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string base = RunDir(tmp.path());
  ASSERT_FALSE(base.empty()) << "the fresh log directory was removed: " << r.err;
  const std::string run = RunDir(base);
  ASSERT_FALSE(run.empty()) << base;
  EXPECT_NE(r.err.find("worker log files: " + run), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("worker log files are in " + run), std::string::npos) << r.err;
  std::vector<std::string> out = SplitLines(ReadFileOr(run + "/attempt_0/filtered_stdout.log"));
  std::sort(out.begin(), out.end());
  EXPECT_EQ(out, (std::vector<std::string>{"[r0] rank 0 line 1", "[r1] rank 1 line 1"}));
}

}  // namespace
}  // namespace ctrun::testing
