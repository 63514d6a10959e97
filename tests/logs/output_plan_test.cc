#include "logs/output_plan.h"

#include <gtest/gtest.h>

namespace ctrun::logs {
namespace {

using Kind = StdioTarget::Kind;

AttemptPaths Paths(int n, bool files = true) {
  AttemptPaths p;
  p.dir = files ? "/L/run/attempt_0" : kDevNull;
  for (int r = 0; r < n; ++r) {
    std::string d = files ? p.dir + "/" + std::to_string(r) : kDevNull;
    p.ranks.push_back(files ? RankPaths{d, d + "/stdout.log", d + "/stderr.log", d + "/error.json"}
                            : RankPaths{d, d, d, ""});  // as LogDir::PrepareAttempt
  }
  return p;
}

// Parses the flags of c and plans with `in` (its paths set by the caller).
std::vector<WorkerOutputPlan> RunPlan(const LaunchConfig& c, const PlanInputs& in, const char* env_template) {
  auto flags = ParseOutputFlags(c, env_template);
  EXPECT_TRUE(flags.ok()) << flags.message();
  if (!flags.ok()) return {};
  auto r = PlanOutput(c, *flags, in);
  EXPECT_TRUE(r.ok()) << r.message();
  return r.ok() ? *r : std::vector<WorkerOutputPlan>{};
}

std::vector<WorkerOutputPlan> Plan(const LaunchConfig& c, int nproc, bool files = true,
                                   const char* env_template = nullptr, int node_rank = 0) {
  AttemptPaths paths = Paths(nproc, files);
  PlanInputs in;
  in.nproc = nproc;
  in.world_size = nproc * (node_rank + 1);
  in.node_rank = node_rank;
  in.paths = &paths;
  return RunPlan(c, in, env_template);
}

TEST(OutputPlan, SingleWorkerWithoutOptionsInherits) {
  LaunchConfig c;
  auto p = Plan(c, 1);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].out.target.kind, Kind::kInherit);
  EXPECT_EQ(p[0].err.target.kind, Kind::kInherit);
  EXPECT_EQ(p[0].error_file, "/L/run/attempt_0/0/error.json");
  c.log_prefix = "[${rank}] ";
  auto q = Plan(c, 1);
  EXPECT_EQ(q[0].out.target.kind, Kind::kPipe);
  EXPECT_EQ(q[0].prefix, "[0] ");
}

// One worker per node of a multi-node job: its stderr goes through the relay, as it is, where
// ctrun's stderr is not a terminal, so that a failure's last lines can tell a lost peer; stdout
// keeps the console. At a terminal, and with --log-prefix inherit, both stay inherited.
TEST(OutputPlan, ALoneWorkersStderrIsRelayedInAMultiNodeJobUnlessAtATerminal) {
  LaunchConfig c;
  AttemptPaths paths = Paths(1);
  PlanInputs in;
  in.paths = &paths;
  in.relay_lone_stderr = true;
  auto p = RunPlan(c, in, nullptr);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].out.target.kind, Kind::kInherit);
  EXPECT_EQ(p[0].err.target.kind, Kind::kPipe);
  EXPECT_TRUE(p[0].err.console);
  EXPECT_TRUE(p[0].err.unprefixed);
  in.stderr_terminal = true;
  EXPECT_EQ(RunPlan(c, in, nullptr)[0].err.target.kind, Kind::kInherit);
  in.stderr_terminal = false;
  c.log_prefix = "inherit";
  EXPECT_EQ(RunPlan(c, in, nullptr)[0].err.target.kind, Kind::kInherit);
  c.log_prefix = "";
  in.relay_lone_stderr = false;  // one node
  EXPECT_EQ(RunPlan(c, in, nullptr)[0].err.target.kind, Kind::kInherit);
}

TEST(OutputPlan, MultiWorkerDefaultIsPrefixedPipes) {
  LaunchConfig c;
  auto p = Plan(c, 4);
  ASSERT_EQ(p.size(), 4u);
  for (const auto& w : p) {
    EXPECT_EQ(w.out.target.kind, Kind::kPipe);
    EXPECT_TRUE(w.out.console);
    EXPECT_TRUE(w.out.tee_file.empty());
    EXPECT_TRUE(w.err.console);
  }
  EXPECT_EQ(p[2].prefix, "[r2] ");
  c.log_prefix = "none";
  EXPECT_EQ(Plan(c, 4)[1].prefix, "");
  EXPECT_EQ(Plan(c, 4)[1].out.target.kind, Kind::kPipe);
  c.log_prefix = "inherit";
  EXPECT_EQ(Plan(c, 4)[1].out.target.kind, Kind::kInherit);
}

// The default prefix marks lines only on a console stream that is a terminal; into a pipe or a
// file they stay whole but carry torchrun's bytes, so a script parsing them is not broken. An
// explicit prefix (--log-prefix, torchrun's template variable) is shown everywhere.
TEST(OutputPlan, TheDefaultPrefixIsShownOnlyWhereTheConsoleIsATerminal) {
  auto plan = [](const LaunchConfig& c, bool out_tty, bool err_tty, const char* env_template = nullptr) {
    AttemptPaths paths = Paths(2, /*files=*/false);  // MakeSinks opens no tee file
    PlanInputs in;
    in.nproc = in.world_size = 2;
    in.paths = &paths;
    in.stdout_terminal = out_tty;
    in.stderr_terminal = err_tty;
    return RunPlan(c, in, env_template);
  };
  auto prefixes = [](const WorkerOutputPlan& w) {
    auto out = MakeSinks(w, Stream::kStdout), err = MakeSinks(w, Stream::kStderr);
    EXPECT_TRUE(out.ok() && err.ok());
    return std::make_pair(out->prefix, err->prefix);
  };
  LaunchConfig c;
  auto piped = plan(c, false, false);
  EXPECT_EQ(piped[1].out.target.kind, Kind::kPipe);  // still relayed: lines of two ranks never mix
  EXPECT_TRUE(piped[1].out.console);
  EXPECT_EQ(prefixes(piped[1]), std::make_pair(std::string(), std::string()));
  EXPECT_EQ(prefixes(plan(c, true, false)[1]), std::make_pair(std::string("[r1] "), std::string()));
  EXPECT_EQ(prefixes(plan(c, false, true)[1]), std::make_pair(std::string(), std::string("[r1] ")));
  EXPECT_EQ(prefixes(plan(c, false, false, "<${rank}> ")[1]), std::make_pair(std::string("<1> "), std::string("<1> ")));
  c.log_prefix = "rank";
  EXPECT_EQ(prefixes(plan(c, false, false)[1]), std::make_pair(std::string("[r1] "), std::string("[r1] ")));
  c.log_prefix = "${local_rank}| ";
  EXPECT_EQ(prefixes(plan(c, false, false)[1]), std::make_pair(std::string("1| "), std::string("1| ")));
  LaunchConfig tee;
  tee.tee = "3";
  EXPECT_EQ(prefixes(plan(tee, false, false)[1]),
            std::make_pair(std::string("[default1]:"), std::string("[default1]:")));
}

TEST(OutputPlan, RedirectWithoutTeeWritesFilesDirectly) {
  LaunchConfig c;
  c.redirects = "3";
  auto p = Plan(c, 2);
  EXPECT_EQ(p[1].out.target.kind, Kind::kFile);
  EXPECT_EQ(p[1].out.target.path, "/L/run/attempt_0/1/stdout.log");
  EXPECT_EQ(p[1].err.target.kind, Kind::kFile);
  EXPECT_EQ(p[1].err.log_file, "/L/run/attempt_0/1/stderr.log");
  EXPECT_FALSE(p[1].out.relayed());
  c.redirects = "0:1,1:2";
  p = Plan(c, 2);
  EXPECT_EQ(p[0].out.target.kind, Kind::kFile);
  EXPECT_EQ(p[0].err.target.kind, Kind::kPipe);
  EXPECT_EQ(p[1].out.target.kind, Kind::kPipe);
  EXPECT_EQ(p[1].err.target.kind, Kind::kFile);
}

TEST(OutputPlan, TeePipesToFileAndConsoleWithTorchrunHeader) {
  LaunchConfig c;
  c.tee = "0:3";
  auto p = Plan(c, 2);
  EXPECT_EQ(p[0].out.target.kind, Kind::kPipe);
  EXPECT_TRUE(p[0].out.console);
  EXPECT_EQ(p[0].out.tee_file, "/L/run/attempt_0/0/stdout.log");
  EXPECT_EQ(p[0].err.tee_file, "/L/run/attempt_0/0/stderr.log");
  EXPECT_EQ(p[0].prefix, "[default0]:");
  // rank 1 is not tee'd: ctrun's default console relay, same header style for the whole run.
  EXPECT_EQ(p[1].out.target.kind, Kind::kPipe);
  EXPECT_TRUE(p[1].out.tee_file.empty());
  EXPECT_EQ(p[1].prefix, "[default1]:");
  // The torchrun template wins over the tee header.
  auto q = Plan(c, 2, true, "[rank${rank}]: ");
  EXPECT_EQ(q[1].prefix, "[rank1]: ");
}

TEST(OutputPlan, FiltersDropConsoleButNotFiles) {
  LaunchConfig c;
  c.tee = "3";
  c.local_ranks_filter = "0";
  auto p = Plan(c, 2);
  EXPECT_TRUE(p[0].out.console);
  // Hidden tee'd rank: file only, written directly.
  EXPECT_EQ(p[1].out.target.kind, Kind::kFile);
  EXPECT_EQ(p[1].err.target.kind, Kind::kFile);
  c.tee = "0";
  p = Plan(c, 2);
  EXPECT_EQ(p[1].out.target.kind, Kind::kDevNull);
  EXPECT_EQ(p[1].err.target.kind, Kind::kPipe);  // kept for the failure summary's tail
  EXPECT_FALSE(p[1].err.console);
  // --ranks-filter works on global ranks: node 1 of 2 has global ranks 2, 3.
  LaunchConfig g;
  g.ranks_filter = "3";
  auto n1 = Plan(g, 2, true, nullptr, 1);
  EXPECT_EQ(n1[0].global_rank, 2);
  EXPECT_EQ(n1[0].out.target.kind, Kind::kDevNull);
  EXPECT_TRUE(n1[1].out.console);
}

TEST(OutputPlan, DevNullLogDir) {
  LaunchConfig c;
  c.redirects = "3";
  c.tee = "0:1";
  auto p = Plan(c, 2, false);
  EXPECT_EQ(p[0].error_file, "");
  EXPECT_EQ(p[0].out.target.kind, Kind::kPipe);  // tee: console only
  EXPECT_TRUE(p[0].out.tee_file.empty());
  EXPECT_EQ(p[1].out.target.kind, Kind::kDevNull);
  EXPECT_EQ(p[1].err.target.kind, Kind::kPipe);
  EXPECT_FALSE(p[1].err.console);
}

TEST(OutputPlan, RedirectsThatADevNullLogDirWouldDiscardAreRefused) {
  LaunchConfig c;
  c.log_dir = "/dev/null";
  EXPECT_TRUE(ParseOutputFlags(c, nullptr).ok());  // files off, nothing redirected: fine
  c.redirects = "3";
  auto r = ParseOutputFlags(c, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.message(),
            "--redirects 3 with --log_dir /dev/null: the redirected worker output would be discarded (/dev/null "
            "turns log files off); give a log directory, or --tee to keep it on the console");
  c.tee = "3";  // tee'd: the console still shows everything
  EXPECT_TRUE(ParseOutputFlags(c, nullptr).ok());
  c.tee = "0:3";
  EXPECT_FALSE(ParseOutputFlags(c, nullptr).ok());
  c.log_dir = "/tmp/logs";
  EXPECT_TRUE(ParseOutputFlags(c, nullptr).ok());
}

TEST(OutputPlan, BadFlagsAreErrors) {
  LaunchConfig c;
  c.tee = "0:5";
  EXPECT_NE(ParseOutputFlags(c, nullptr).message().find("--tee"), std::string::npos);
  c.tee = "0";
  c.log_prefix = "${oops}";
  EXPECT_FALSE(ParseOutputFlags(c, nullptr).ok());
  c.log_prefix = "";
  // TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE is rendered as torchrun does (safe_substitute), with a warning.
  auto from_env = ParseOutputFlags(c, "${oops}");
  ASSERT_TRUE(from_env.ok());
  EXPECT_NE(from_env->prefix.warning().find("'$oops'"), std::string::npos);
  ASSERT_TRUE(ParseOutputFlags(c, nullptr).ok());
  // The filters' grammar is the logs module's alone (ranges included); the CLI passes the text.
  for (const char* bad : {"a,b", "0,-1"}) {
    c.local_ranks_filter = bad;
    EXPECT_NE(ParseOutputFlags(c, nullptr).message().find("--local-ranks-filter"), std::string::npos) << bad;
    c.local_ranks_filter = "";
    c.ranks_filter = bad;
    EXPECT_NE(ParseOutputFlags(c, nullptr).message().find("--ranks-filter"), std::string::npos) << bad;
    c.ranks_filter = "";
  }
  c.ranks_filter = "0,2-3";
  auto ranges = ParseOutputFlags(c, nullptr);
  ASSERT_TRUE(ranges.ok()) << ranges.message();
  EXPECT_TRUE(ranges->rank_filter.Allows(3));
  EXPECT_FALSE(ranges->rank_filter.Allows(1));

  AttemptPaths paths = Paths(2);
  PlanInputs in;
  in.nproc = 3;  // more ranks than paths
  in.paths = &paths;
  EXPECT_FALSE(PlanOutput(c, *ranges, in).ok());
}

}  // namespace
}  // namespace ctrun::logs

namespace ctrun::logs {
namespace {

std::vector<WorkerOutputPlan> PlanWithInputs(const LaunchConfig& c, int nproc, std::optional<WindowSize> window,
                                             bool forward_stdin, bool files = true) {
  AttemptPaths paths = Paths(nproc, files);
  paths.filtered_stdout = files ? paths.dir + "/filtered_stdout.log" : kDevNull;
  paths.filtered_stderr = files ? paths.dir + "/filtered_stderr.log" : kDevNull;
  PlanInputs in;
  in.nproc = nproc;
  in.world_size = nproc;
  in.paths = &paths;
  in.pty_window = window;
  in.stdout_terminal = in.stderr_terminal = window.has_value();
  in.forward_stdin = forward_stdin;
  return RunPlan(c, in, nullptr);
}

TEST(OutputPlan, WithAWindowConsoleStdoutGetsAPtyLessThePrefixStderrStaysAPipe) {
  LaunchConfig c;
  auto p = PlanWithInputs(c, 2, WindowSize{30, 100}, false);
  ASSERT_EQ(p.size(), 2u);
  for (const auto& w : p) {
    EXPECT_EQ(w.out.target.kind, Kind::kPty);
    EXPECT_EQ(w.out.target.rows, 30);
    EXPECT_EQ(w.out.target.cols, 95);  // "[r0] "
    EXPECT_TRUE(w.out.relayed());
    EXPECT_EQ(w.err.target.kind, Kind::kPipe);
    EXPECT_EQ(w.in.kind, Kind::kInherit);
  }
}

TEST(OutputPlan, PtyOnlyWhereTheConsoleShowsTheStream) {
  LaunchConfig c;
  c.redirects = "1";  // stdout to files, written by the worker: no pty
  auto p = PlanWithInputs(c, 2, WindowSize{24, 80}, false);
  EXPECT_EQ(p[0].out.target.kind, Kind::kFile);
  c = LaunchConfig{};
  c.tee = "1";  // console and file: a pipe, so the file gets no colour codes or redrawn bars
  p = PlanWithInputs(c, 2, WindowSize{24, 80}, false);
  EXPECT_EQ(p[0].out.target.kind, Kind::kPipe);
  EXPECT_EQ(p[0].out.tee_file, "/L/run/attempt_0/0/stdout.log");
  c = LaunchConfig{};
  c.duplicate_stdout_filters = {"loss"};  // matching lines copied to a file: a pipe too
  p = PlanWithInputs(c, 2, WindowSize{24, 80}, false);
  EXPECT_EQ(p[0].out.target.kind, Kind::kPipe);
  c = LaunchConfig{};
  c.tee = "2";  // only stderr is tee'd: stdout, on the console alone, still gets its pty
  p = PlanWithInputs(c, 2, WindowSize{24, 80}, false);
  EXPECT_EQ(p[0].out.target.kind, Kind::kPty);
  c = LaunchConfig{};
  c.local_ranks_filter = "0";  // rank 1 hidden: /dev/null
  p = PlanWithInputs(c, 2, WindowSize{24, 80}, false);
  EXPECT_EQ(p[0].out.target.kind, Kind::kPty);
  EXPECT_EQ(p[1].out.target.kind, Kind::kDevNull);
  // One worker without a prefix keeps the console itself (already a terminal).
  p = PlanWithInputs(LaunchConfig{}, 1, WindowSize{24, 80}, false);
  EXPECT_EQ(p[0].out.target.kind, Kind::kInherit);
}

TEST(OutputPlan, NarrowConsoleLeavesTheWorkerAtLeastTwentyColumns) {
  EXPECT_EQ(WorkerWindow(WindowSize{24, 22}, 5).cols, 20);
  EXPECT_EQ(WorkerWindow(WindowSize{24, 10}, 5).cols, 10);
  EXPECT_EQ(WorkerWindow(WindowSize{24, 80}, 5), (WindowSize{24, 75}));
}

TEST(OutputPlan, ForwardedStdinGoesToLocalRankZeroOthersReadDevNull) {
  auto p = PlanWithInputs(LaunchConfig{}, 3, std::nullopt, true);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].in.kind, Kind::kPipe);
  EXPECT_EQ(p[1].in.kind, Kind::kDevNull);
  EXPECT_EQ(p[2].in.kind, Kind::kDevNull);
}

TEST(OutputPlan, DuplicateFiltersRouteEveryRankOfThatStreamThroughTheRelay) {
  LaunchConfig c;
  c.duplicate_stdout_filters = {"loss"};
  c.redirects = "3";
  c.local_ranks_filter = "0";
  auto p = PlanWithInputs(c, 2, std::nullopt, false);
  ASSERT_EQ(p.size(), 2u);
  for (const auto& w : p) {
    // stdout: the worker's file is now written by the relay (same path), nothing on the console.
    EXPECT_EQ(w.out.target.kind, Kind::kPipe);
    EXPECT_TRUE(w.out.duplicated);
    EXPECT_FALSE(w.out.console);
    EXPECT_EQ(w.out.tee_file, w.out.log_file);
    EXPECT_FALSE(w.out.tee_file.empty());
    // stderr has no filter: written by the worker as before.
    EXPECT_EQ(w.err.target.kind, Kind::kFile);
    EXPECT_FALSE(w.err.duplicated);
  }
  // One worker inheriting the console is relayed instead (with its console lines).
  c = LaunchConfig{};
  c.duplicate_stderr_filters = {"warn"};
  p = PlanWithInputs(c, 1, std::nullopt, false);
  EXPECT_EQ(p[0].err.target.kind, Kind::kPipe);
  EXPECT_TRUE(p[0].err.console);
  EXPECT_TRUE(p[0].err.duplicated);
  EXPECT_EQ(p[0].out.target.kind, Kind::kInherit);
  // Files off (--log_dir /dev/null): nowhere to copy to, nothing changes.
  p = PlanWithInputs(c, 1, std::nullopt, false, /*files=*/false);
  EXPECT_FALSE(p[0].err.duplicated);
  EXPECT_EQ(p[0].err.target.kind, Kind::kInherit);
}

}  // namespace
}  // namespace ctrun::logs
