// Worker output through the real ctrun binary: ordering and completeness, crash tails, log-dir
// layout across restarts, tee/redirect, filters and prefix templates.
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <regex>
#include <thread>

#include "base/unique_fd.h"
#include "helpers/ctrun_command.h"
#include "helpers/free_port.h"
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

// The run directory inside the one fresh base ($TMPDIR/torchelastic_*) under `tmpdir`; "" (and a
// test failure saying what was there) when there is not exactly that.
std::string FreshRunDir(const std::string& tmpdir) {
  const std::string base = RunDir(tmpdir);
  if (fs::path(base).filename().string().rfind("torchelastic_", 0) != 0) {
    ADD_FAILURE() << "no single torchelastic_* base under " << tmpdir << " (found '" << base << "')";
    return "";
  }
  return RunDir(base);
}

TEST(LogsE2E, EightWorkersHundredThousandLinesEachArriveOnceInOrderPrefixed) {
  constexpr int kLines = 100000;
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=8", "--log-prefix=rank"}, {"--print", std::to_string(kLines)}),
                      {}, 120s);
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

// Into a pipe or a file (no terminal) the default is torchrun's bytes: no prefix, so a script
// that parses the output keeps working; the lines still arrive whole, never merged, in order.
TEST(LogsE2E, OffATerminalTheDefaultAddsNoPrefixAndKeepsLinesWhole) {
  constexpr int kLines = 3000;  // enough to interleave; the 8 x 100000 test above measures volume
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=4"}, {"--print", std::to_string(kLines), "--stderr", "E"}),
                      {}, 120s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<int> next(4, 0);
  const std::regex re(R"(^rank (\d) line (\d+)$)");
  for (const auto& line : SplitLines(r.out)) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, re)) << "prefixed, malformed or merged line: '" << line << "'";
    const int rank = std::stoi(m[1]), i = std::stoi(m[2]);
    ASSERT_EQ(i, next[rank]) << "rank " << rank << " out of order or duplicated";
    ++next[rank];
  }
  for (int k = 0; k < 4; ++k) EXPECT_EQ(next[k], kLines) << "rank " << k;
  EXPECT_EQ(CountOf(r.err, "\nE\n") + (r.err.rfind("E\n", 0) == 0 ? 1 : 0), 4) << r.err;
}

// A line far over the relay's 64 KiB piece size (a JSON blob, a printed array) reaches a pipe
// byte for byte, as under torchrun, when no other rank writes between its pieces.
TEST(LogsE2E, OffATerminalALongLineOfOneRankArrivesByteForByte) {
  constexpr long kBytes = 300000;
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2"},
                            {"--long-line", std::to_string(kBytes), "--quiet-rank", "1"}),
                      {}, 60s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string want = "rank 0 ";
  while (static_cast<long>(want.size()) < kBytes) want.push_back(static_cast<char>('0' + want.size() % 10));
  EXPECT_TRUE(r.out == want + "\n") << "got " << r.out.size() << " bytes, " << CountOf(r.out, "\\\n")
                                     << " cut marks; first 100: " << r.out.substr(0, 100);
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

// Without --log_dir, a rank that finished cleanly has its empty directory removed at once (a
// successful run removes the whole fresh base). When the run fails after all, the kept base holds
// every directory of the attempt again, as torchrun's layout has them. Rank 1 fails only once
// rank 0's directory is gone (it exits 4 if that never happens).
TEST(LogsE2E, AFailedRunKeepsEveryRankDirectoryEvenOfRanksThatFinishedFirst) {
  TempDir tmp;
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=3", "--rdzv_id=early"},
                            {"--wait-gone-rank", "0", "--only-rank", "1", "--exit", "3"}),
                      {"TMPDIR=" + tmp.path()});
  ASSERT_EQ(r.exit_code, 3) << r.err;
  const std::string run = FreshRunDir(tmp.path());
  ASSERT_FALSE(run.empty());
  std::vector<std::string> ranks;
  for (const auto& e : fs::directory_iterator(run + "/attempt_0")) ranks.push_back(e.path().filename().string());
  std::sort(ranks.begin(), ranks.end());
  EXPECT_EQ(ranks, (std::vector<std::string>{"0", "1", "2"}));
  EXPECT_NE(r.err.find("no worker wrote an error file; this run's log directory is kept: " + run), std::string::npos) << r.err;
}

// A run that recovers from a failure ends successfully, but the failed attempt left its error
// file in the fresh base: ctrun never removes a file, so the base is kept, named, and whole.
TEST(LogsE2E, ASuccessfulRunKeepsAFreshBaseThatHoldsAnEarlierAttemptsErrorFile) {
  TempDir tmp;
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2", "--max_restarts=1", "--rdzv_id=kept"},
                            {"--only-rank", "1", "--only-attempt", "0", "--error-file", "boom", "--exit", "2"}),
                      {"TMPDIR=" + tmp.path()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string run = FreshRunDir(tmp.path());
  ASSERT_FALSE(run.empty());
  EXPECT_NE(ReadFileOr(run + "/attempt_0/1/error.json").find("boom"), std::string::npos);
  for (const char* dir : {"/attempt_0/0", "/attempt_1/0", "/attempt_1/1"}) EXPECT_TRUE(fs::is_directory(run + dir)) << dir;
  EXPECT_NE(r.err.find("this run's log directory is kept: it holds files (attempt_0/1/error.json, ...): " + run),
            std::string::npos)
      << r.err;
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
  EXPECT_EQ(SplitLines(g.out), (std::vector<std::string>{"rank 2 line 0", "rank 2 line 1"}));
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

// ctrun's stdout and stderr are one FIFO this test reads only when it chooses: a slow reader (a
// pager, a slow ssh link, a paused terminal). All of the workers' output fits in ctrun's buffers,
// so they finish; then nothing is read for a while.
struct SlowReaderRun {
  TempDir d;
  UniqueFd read_end;
  std::unique_ptr<BackgroundProcess> job;
  std::vector<std::string> WithPidFile(std::vector<std::string> args) const {
    args.insert(args.end(), {"--pid-file", d / "pids"});
    return args;
  }
  explicit SlowReaderRun(const std::vector<std::string>& worker_args) {
    const std::string fifo = d / "console";
    EXPECT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
    read_end.reset(::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));  // before the writers open it
        job = std::make_unique<BackgroundProcess>(
        Ctrun({"--standalone", "--nproc_per_node=2", "--master_port", std::to_string(FreePort()), "--log-prefix=rank"},
              WithPidFile(worker_args)),
        std::vector<std::string>{}, fifo,
        fifo);
  }
  // A worker started (noting its pid first), so ctrun's watchdog was running (it is made before
  // any worker); now nothing of ctrun's is left, the watchdog included, which goes only when the
  // agent is done. ctrun is in its final drain.
  bool AgentDone() { return !ReadPids(d / "pids").empty() && LiveDescendants(job->pid()).empty(); }
  // Reads until ctrun and its children are gone. A `pause` after each read of `chunk` bytes makes a
  // slow reader (a stimulus, as StayAway is).
  std::string ReadToEof(size_t chunk = 65536, std::chrono::milliseconds pause = 0ms) {
    std::string out;
    std::vector<char> buf(chunk);
    for (;;) {
      pollfd p{read_end.get(), POLLIN, 0};
      if (::poll(&p, 1, 30'000) <= 0) break;
      const ssize_t n = ::read(read_end.get(), buf.data(), buf.size());
      if (n <= 0) break;
      out.append(buf.data(), static_cast<size_t>(n));
      std::this_thread::sleep_for(pause);
    }
    return out;
  }
  // The stimulus, not a synchronisation: a reader that stays away longer than ctrun's bounded
  // waits for worker pipes (2 s) and for its own last lines (1 s) used to lose all it had not read.
  static void StayAway() { std::this_thread::sleep_for(3500ms); }
};

// How many whole lines of `rank` there are when they run "rank R line 0", "line 1", ... in order
// with none missing; -1 when one is missing or out of place. The rank's last line may be cut
// short (a worker killed in the middle of a write): it is not counted.
long ContiguousLines(const std::vector<std::string>& lines, int rank) {
  const std::string prefix = "[r" + std::to_string(rank) + "] ";
  const std::string head = prefix + "rank " + std::to_string(rank) + " line ";
  long next = 0;
  bool cut = false;
  for (const std::string& l : lines) {
    if (l.rfind(prefix, 0) != 0) continue;
    const std::string want = head + std::to_string(next);
    if (cut || (l != want && want.rfind(l, 0) != 0)) return -1;
    if (l == want) ++next;
    else cut = true;
  }
  return next;
}

TEST(LogsE2E, ASlowConsoleReaderGetsEveryLine) {
  SlowReaderRun run({"--print", "5000"});
  ASSERT_TRUE(WaitFor([&] { return run.AgentDone(); }, 30s));
  SlowReaderRun::StayAway();
  const std::string out = run.ReadToEof();
  EXPECT_EQ(run.job->Wait(30s), 0) << out.substr(out.size() > 2000 ? out.size() - 2000 : 0);
  const std::vector<std::string> lines = SplitLines(out);
  EXPECT_EQ(ContiguousLines(lines, 0), 5000);
  EXPECT_EQ(ContiguousLines(lines, 1), 5000);
  EXPECT_EQ(out.find("could not be written to the console"), std::string::npos);
}

TEST(LogsE2E, ASlowConsoleReaderGetsTheFailureSummaryAfterTheWorkersLines) {
  SlowReaderRun run({"--print", "5000", "--exit", "3"});
  ASSERT_TRUE(WaitFor([&] { return run.AgentDone(); }, 30s));
  SlowReaderRun::StayAway();
  const std::string out = run.ReadToEof();
  EXPECT_EQ(run.job->Wait(30s), 3);
  const std::vector<std::string> lines = SplitLines(out);
  // The rank that exited first had printed all its lines; the other, stopped by ctrun, may not
  // have. None is lost or out of order.
  const long r0 = ContiguousLines(lines, 0), r1 = ContiguousLines(lines, 1);
  EXPECT_GE(r0, 0);
  EXPECT_GE(r1, 0);
  EXPECT_EQ(std::max(r0, r1), 5000);
  size_t last_worker_line = 0, summary = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].rfind("[r", 0) == 0) last_worker_line = i;
    if (summary == 0 && lines[i].find("FAILED") != std::string::npos) summary = i;
  }
  EXPECT_GT(summary, last_worker_line) << "the summary landed among the workers' lines";
  EXPECT_EQ(out.find("could not be written to the console"), std::string::npos);
}

TEST(LogsE2E, AStoppingSignalEndsTheWaitForASlowConsoleAndSaysWhatWasLost) {
  SlowReaderRun run({"--print", "5000"});
  ASSERT_TRUE(WaitFor([&] { return run.AgentDone(); }, 30s));
  run.job->Signal(SIGTERM);
  // Slow (50 KiB/s): the ~170 KiB ctrun holds would take it over 3 s. A reader that drained the
  // FIFO at full speed could take all of it before ctrun reached its wait, losing nothing: the
  // signal cuts a wait short, not writes that need none.
  const std::string out = run.ReadToEof(1024, 20ms);  // until ctrun exits and the FIFO's writers are gone
  EXPECT_EQ(run.job->Wait(20s), 0);                    // the job itself had succeeded
  EXPECT_NE(out.find("bytes of output could not be written to the console"), std::string::npos)
      << out.substr(out.size() > 2000 ? out.size() - 2000 : 0);
  const std::vector<std::string> lines = SplitLines(out);
  EXPECT_LT(ContiguousLines(lines, 0) + ContiguousLines(lines, 1), 10000) << "nothing was lost: no wait was cut";
}

// A SIGTERM that stops a running job whose console reader has stalled (a pipe nobody reads) ends
// ctrun within its bounds: the final flush waits 2 s for that reader, not for ever.
TEST(LogsE2E, ASigtermEndsTheRunWhileTheConsoleReaderIsStalled) {
  SlowReaderRun run({"--print", "400000", "--hang"});
  ASSERT_TRUE(WaitFor([&] { return ReadPids(run.d / "pids").size() >= 2; }, 30s));
  run.job->Signal(SIGTERM);
  EXPECT_EQ(run.job->Wait(20s), 128 + SIGTERM) << "ctrun waited for a reader that never came";
}

// `ctrun ... | head -1`: once the console's reader has gone, a worker that keeps printing gets the
// broken pipe itself (SIGPIPE), as it would writing there directly under torchrun: the job ends
// instead of printing into nothing for ever.
TEST(LogsE2E, AConsoleWhoseReaderWentAwayBreaksTheWorkersPipesToo) {
  TempDir d;
  const std::string fifo = d / "console";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  UniqueFd reader(::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  ASSERT_TRUE(reader);
  BackgroundProcess job(Ctrun({"--standalone", "--nproc_per_node=2", "--master_port", std::to_string(FreePort())},
                              {"--print", "100000000"}),
                        {}, fifo, d / "err");
  char buf[4096];
  ASSERT_TRUE(WaitFor([&] { return ::read(reader.get(), buf, sizeof buf) > 0; }, 30s));
  reader.reset();  // the reader goes away, as `head -1` does after its line
  const int code = job.Wait(30s);
  EXPECT_EQ(code, 128 + SIGPIPE) << ReadFileOr(d / "err");
  EXPECT_NE(ReadFileOr(d / "err").find("SIGPIPE"), std::string::npos) << ReadFileOr(d / "err");
}

// A worker's last lines are in its pipes when its exit is seen: they come before ctrun's line
// about that exit, not after it.
TEST(LogsE2E, AFailedWorkersLastLinesPrecedeTheLineAboutItsExit) {
  for (int i = 0; i < 5; ++i) {
    SlowReaderRun run({"--print", "3", "--stderr", "ERR LINE", "--only-rank", "0", "--exit", "4", "--else-hang"});
    const std::string out = run.ReadToEof();
    ASSERT_EQ(run.job->Wait(30s), 4) << out;
    const size_t exit_line = out.find("first exit: worker rank 0");
    ASSERT_NE(exit_line, std::string::npos) << out;
    EXPECT_LT(out.find("[r0] rank 0 line 2"), exit_line) << out;
    EXPECT_LT(out.find("[r0] ERR LINE"), exit_line) << out;
  }
}

}  // namespace
}  // namespace ctrun::testing
