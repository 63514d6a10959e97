// The machine-readable reports of a run: the GitHub annotation's escaping, the events file's lines,
// the summary file's document, the recorder that feeds it, the job outcome decision and the
// dry-run text. Pure functions and in-memory sinks, plus one real events file in a temp dir.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "agent/dry_run.h"
#include "agent/job_outcome.h"
#include "helpers/test_util.h"
#include "report/events.h"
#include "report/github_annotation.h"
#include "report/run_end.h"
#include "report/run_recorder.h"
#include "report/summary_file.h"

namespace ctrun {
namespace {

using nlohmann::json;

TEST(GithubAnnotation, EscapesDataAndPropertiesByTheRunnersRules) {
  EXPECT_EQ(EscapeAnnotationData("100% done\r\nnext: a,b"), "100%25 done%0D%0Anext: a,b");
  EXPECT_EQ(EscapeAnnotationProperty("100% done\r\nnext: a,b"), "100%25 done%0D%0Anext%3A a%2Cb");
  EXPECT_EQ(EscapeAnnotationData("%0A"), "%250A") << "an escape sequence in the text stays literal";
  EXPECT_EQ(GithubErrorAnnotation("ctrun: worker_failure (exit 3)", "rank 1 exited with code 3\nTraceback"),
            "::error title=ctrun%3A worker_failure (exit 3)::rank 1 exited with code 3%0ATraceback\n");
}

TEST(GithubAnnotation, OnlyWhenGithubActionsIsExactlyTrue) {
  EXPECT_TRUE(UnderGithubActions(Environment::FromEntries({"GITHUB_ACTIONS=true"})));
  EXPECT_FALSE(UnderGithubActions(Environment::FromEntries({"GITHUB_ACTIONS=false"})));
  EXPECT_FALSE(UnderGithubActions(Environment::FromEntries({"GITHUB_ACTIONS=1"})));
  EXPECT_FALSE(UnderGithubActions(Environment::FromEntries({})));
}

TEST(Events, LineHasTheFramingFirstThenTheFieldsAndEndsInNewline) {
  EventStamp stamp;
  stamp.seq = 7;
  stamp.mono = std::chrono::steady_clock::time_point(std::chrono::nanoseconds(123456789));
  stamp.wall = std::chrono::system_clock::time_point(std::chrono::microseconds(1764512401123456));
  const std::string line =
      FormatEventLine(events::kWorkerExit, json{{"rank", 1}, {"pid", 42}, {"seq", 99}}, stamp, {"h1", "job"});
  ASSERT_FALSE(line.empty());
  EXPECT_EQ(line.back(), '\n');
  EXPECT_EQ(line.find('\n'), line.size() - 1) << "one line";
  EXPECT_EQ(line.rfind("{\"event\":\"worker_exit\",\"seq\":7,\"mono_ns\":123456789,\"wall\":\"", 0), 0u) << line;
  const json j = json::parse(line);
  EXPECT_EQ(j["wall"], "2025-11-30T14:20:01.123456Z");
  EXPECT_EQ(j["host"], "h1");
  EXPECT_EQ(j["run_id"], "job");
  EXPECT_EQ(j["rank"], 1);
  EXPECT_EQ(j["seq"], 7) << "a field cannot override the framing";
}

TEST(Events, InvalidUtf8IsReplacedNotThrown) {
  const std::string line = FormatEventLine("x", json{{"message", std::string("bad \xff byte")}}, {}, {});
  EXPECT_NO_THROW(json::parse(line));
}

TEST(Events, FileSinkAppendsOneParseableLinePerEventInOrder) {
  testing::TempDir d;
  const std::string path = d / "events.jsonl";
  {
    std::ofstream(path) << "{\"event\":\"earlier\"}\n";  // never truncated
    auto sink = FileEventSink::Open(path, {"h", "r"});
    ASSERT_TRUE(sink.ok()) << sink.message();
    for (int i = 0; i < 3; ++i) sink.value()->Emit(events::kAttemptStart, json{{"attempt", i}});
  }
  auto lines = testing::SplitLines(testing::ReadFileOr(path));
  ASSERT_EQ(lines.size(), 4u);
  int64_t last_mono = 0;
  for (int i = 0; i < 3; ++i) {
    const json j = json::parse(lines[static_cast<size_t>(i) + 1]);
    EXPECT_EQ(j["attempt"], i);
    EXPECT_EQ(j["seq"], i);
    EXPECT_GE(j["mono_ns"].get<int64_t>(), last_mono);
    last_mono = j["mono_ns"].get<int64_t>();
  }
}

TEST(Events, OpeningAMissingDirectoryFailsWithThePath) {
  auto sink = FileEventSink::Open("/nonexistent-dir/events.jsonl", {});
  ASSERT_FALSE(sink.ok());
  EXPECT_NE(sink.message().find("/nonexistent-dir/events.jsonl"), std::string::npos);
}

RunOutcome FailedOutcome() {
  RunOutcome o;
  o.kind = OutcomeKind::kWorkerFailure;
  o.exit_code = 3;
  o.root_cause = "rank 1 (local_rank 1, pid 11) exited with code 3";
  o.root_cause_rank = 1;
  o.attempts = 2;
  o.restarts = 1;
  o.start = std::chrono::system_clock::time_point(std::chrono::seconds(1000));
  o.end = o.start + std::chrono::milliseconds(2500);
  o.log_dir = "/tmp/logs/job_x";
  RankOutcome r0;
  r0.global_rank = 0;
  r0.pid = 10;
  r0.state = "stopped";
  r0.status = ExitStatus::Signaled(SIGTERM);
  r0.duration_s = 1.5;
  RankOutcome r1;
  r1.global_rank = 1;
  r1.local_rank = 1;
  r1.pid = 11;
  r1.state = "failed";
  r1.status = ExitStatus::Exited(3);
  r1.duration_s = 1.25;
  o.ranks = {r0, r1};
  return o;
}

TEST(SummaryFile, DocumentHasEveryDocumentedField) {
  const auto j = SummaryJson(FailedOutcome(), {"job", "host1", "0.1.0", 0});
  std::vector<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"schema", "ctrun_version", "run_id", "hostname", "node_rank", "outcome",
                                            "exit_code", "exit_code_from", "root_cause", "root_cause_rank",
                                            "attempts", "restarts", "start", "end", "duration_s", "log_dir",
                                            "running_at_deadline", "ranks"}));
  EXPECT_EQ(j["schema"], "ctrun.summary/1");
  EXPECT_EQ(j["outcome"], "worker_failure");
  EXPECT_EQ(j["exit_code_from"], "worker");
  EXPECT_EQ(j["exit_code"], 3);
  EXPECT_EQ(j["root_cause_rank"], 1);
  EXPECT_DOUBLE_EQ(j["duration_s"].get<double>(), 2.5);
  EXPECT_EQ(j["start"], "1970-01-01T00:16:40.000000Z");
  ASSERT_EQ(j["ranks"].size(), 2u);
  EXPECT_EQ(j["ranks"][0]["state"], "stopped");
  EXPECT_TRUE(j["ranks"][0]["exit_code"].is_null());
  EXPECT_EQ(j["ranks"][0]["signal"], SIGTERM);
  EXPECT_EQ(j["ranks"][0]["signal_name"], "SIGTERM");
  EXPECT_EQ(j["ranks"][1]["exit_code"], 3);
  EXPECT_TRUE(j["ranks"][1]["signal"].is_null());
}

TEST(SummaryFile, UsageErrorIsCtrunsOwnCodeWithNullsWhereNothingRan) {
  RunOutcome o = EarlyOutcome(OutcomeKind::kUsageError, "unrecognized option '--bogus'");
  const auto j = SummaryJson(o, {"none", "h", "0.1.0", 0});
  EXPECT_EQ(j["exit_code"], 2);
  EXPECT_EQ(j["exit_code_from"], "ctrun");
  EXPECT_EQ(j["outcome"], "usage_error");
  EXPECT_TRUE(j["log_dir"].is_null());
  EXPECT_TRUE(j["root_cause_rank"].is_null());
  EXPECT_TRUE(j["ranks"].empty());
  EXPECT_EQ(j["attempts"], 0);
}

TEST(SummaryFile, WrittenAtomicallyAndParsesBack) {
  testing::TempDir d;
  const std::string path = d / "summary.json";
  ASSERT_TRUE(WriteSummaryFile(path, FailedOutcome(), {"job", "h", "0.1.0", 0}).ok());
  const json j = json::parse(testing::ReadFileOr(path));
  EXPECT_EQ(j["root_cause"], "rank 1 (local_rank 1, pid 11) exited with code 3");
  EXPECT_FALSE(WriteSummaryFile("/nonexistent-dir/s.json", FailedOutcome(), {}).ok());
  EXPECT_FALSE(CheckSummaryPath("/nonexistent-dir/s.json").ok());
  EXPECT_TRUE(CheckSummaryPath(path).ok());
  const Status is_dir = CheckSummaryPath(d.path());
  EXPECT_EQ(is_dir.message(), "cannot write --summary-file " + d.path() + ": it is a directory");
}

TEST(RunEnd, AnnotationOnlyOnFailureAndOnlyUnderActions) {
  testing::TempDir d;
  const std::string out_path = d / "out";
  std::FILE* out = std::fopen(out_path.c_str(), "w");
  ASSERT_NE(out, nullptr);
  RunEndTargets t;
  t.annotation_out = out;
  t.github_actions = true;
  RunOutcome ok;
  EXPECT_EQ(ReportRunEnd(ok, {}, t), 0);
  EXPECT_EQ(ReportRunEnd(FailedOutcome(), {}, t), 3);
  t.github_actions = false;
  EXPECT_EQ(ReportRunEnd(FailedOutcome(), {}, t), 3);
  std::fclose(out);
  EXPECT_EQ(testing::ReadFileOr(out_path),
            "::error title=ctrun%3A worker_failure (exit 3)::rank 1 (local_rank 1, pid 11) exited with code 3\n");
}

// torchrun's @record on its main writes the exception that ends it to TORCHELASTIC_ERROR_FILE.
// ctrun writes its own set-up and rendezvous errors there; a worker failure's record comes from
// the failure report, and a usage error (torchrun: SystemExit) writes none.
TEST(RunEnd, SetUpAndRendezvousErrorsGoToCtrunsOwnErrorFile) {
  testing::TempDir d;
  RunEndTargets t;
  t.agent_error_file = d / "agent.json";
  EXPECT_EQ(ReportRunEnd(EarlyOutcome(OutcomeKind::kSetupError, "cannot create the log directory: x"), {}, t), 1);
  const json j = json::parse(testing::ReadFileOr(t.agent_error_file));
  EXPECT_EQ(j["message"]["message"], "cannot create the log directory: x");
  ::unlink(t.agent_error_file.c_str());
  EXPECT_EQ(ReportRunEnd(EarlyOutcome(OutcomeKind::kRendezvousError, "join timeout"), {}, t), 3);
  EXPECT_EQ(json::parse(testing::ReadFileOr(t.agent_error_file))["message"]["message"], "join timeout");
  ::unlink(t.agent_error_file.c_str());
  EXPECT_EQ(ReportRunEnd(EarlyOutcome(OutcomeKind::kUsageError, "bad flag"), {}, t), 2);
  EXPECT_EQ(ReportRunEnd(FailedOutcome(), {}, t), 3);
  EXPECT_FALSE(std::filesystem::exists(t.agent_error_file));
}

TEST(RunRecorder, KeepsTheLastAttemptsWorkersAndTheDeadlinesRanks) {
  RunRecorder rec;
  rec.Emit(events::kAttemptStart, {{"attempt", 0}, {"restart_count", 0}});
  rec.Emit(events::kWorkerStart, {{"rank", 0}, {"local_rank", 0}, {"pid", 10}});
  rec.Emit(events::kWorkerExit, {{"rank", 0}, {"cause", "failed"}, {"exit_code", 1}, {"signal", nullptr}});
  rec.Emit(events::kAttemptStart, {{"attempt", 1}, {"restart_count", 1}});
  rec.Emit(events::kWorkerStart, {{"rank", 1}, {"local_rank", 1}, {"pid", 21}});
  rec.Emit(events::kWorkerStart, {{"rank", 0}, {"local_rank", 0}, {"pid", 20}});
  rec.Emit(events::kWorkerExit,
           {{"rank", 0}, {"cause", "stopped"}, {"exit_code", nullptr}, {"signal", SIGKILL}, {"core_dumped", false}});
  rec.Emit(events::kMaxRunTime, {{"running_ranks", {0, 1}}});
  rec.Emit(events::kRendezvousRound, {{"round", 3}, {"node_rank", 2}});
  RunOutcome o;
  rec.Fill(&o);
  EXPECT_EQ(o.attempts, 2);
  EXPECT_EQ(o.restarts, 1);
  EXPECT_EQ(o.running_at_deadline, (std::vector<int>{0, 1}));
  EXPECT_EQ(o.node_rank, 2);
  EXPECT_EQ(SummaryJson(o, {"job", "h", "0.1.0", 0})["node_rank"], 2) << "the round's node rank wins";
  ASSERT_EQ(o.ranks.size(), 2u);
  EXPECT_EQ(o.ranks[0].pid, 20);
  EXPECT_EQ(o.ranks[0].state, "stopped");
  EXPECT_EQ(o.ranks[0].status, ExitStatus::Signaled(SIGKILL));
  EXPECT_EQ(o.ranks[1].pid, 21);
  EXPECT_EQ(o.ranks[1].state, "running") << "never reaped";
  EXPECT_FALSE(o.ranks[1].status);
}

TEST(JobOutcome, DescribesTheRootCauseWithItsErrorFileMessage) {
  WorkerFailure f;
  f.global_rank = 5;
  f.local_rank = 1;
  f.pid = 77;
  f.status = ExitStatus::Exited(2);
  EXPECT_EQ(DescribeFailure(f), "rank 5 (local_rank 1, pid 77) exited with code 2");
  f.error_data = ErrorFileContents{};
  f.error_data->message = "ValueError: bad lr\nmore";
  EXPECT_EQ(DescribeFailure(f), "rank 5 (local_rank 1, pid 77) exited with code 2: ValueError: bad lr");
}

TEST(JobOutcome, EarlyOutcomesHaveTheirFixedCodes) {
  EXPECT_EQ(EarlyOutcome(OutcomeKind::kUsageError, "x").exit_code, 2);
  EXPECT_EQ(EarlyOutcome(OutcomeKind::kSetupError, "x").exit_code, 1);
  EXPECT_EQ(EarlyOutcome(OutcomeKind::kRendezvousError, "x").exit_code, 3);
  EXPECT_EQ(EarlyOutcome(OutcomeKind::kDryRun, "").exit_code, 0);
}

TEST(DryRun, ShellQuoteRoundTripsThroughTheShellRules) {
  EXPECT_EQ(ShellQuote("--lr=0.1"), "--lr=0.1");
  EXPECT_EQ(ShellQuote(""), "''");
  EXPECT_EQ(ShellQuote("a b"), "'a b'");
  EXPECT_EQ(ShellQuote("it's"), "'it'\\''s'");
}

TEST(DryRun, PrintsEveryRankWithItsCommandChangedEnvAndBinding) {
  LaunchConfig c;
  c.nproc_per_node = 2;
  c.standalone = true;
  c.run_id = "job";
  c.entrypoint = "/bin/train";
  c.args = {"--name", "a b"};
  const Environment base = Environment::FromEntries({"PATH=/bin", "HOME=/root", "RANK=stale"});
  const std::string text = FormatDryRun(c, base, "/bin/train", "host1");
  EXPECT_EQ(text.rfind("ctrun dry run: nothing is started\n"
                       "node: host=host1 node_rank=0 nnodes=1 nproc_per_node=2 world_size=2 rdzv_backend=static\n"
                       "rank 0 (local_rank 0):\n"
                       "  exec: /bin/train --name 'a b'\n",
                       0),
            0u)
      << text;
  EXPECT_NE(text.find("  env: RANK=0\n"), std::string::npos) << "changed values are shown";
  EXPECT_NE(text.find("  env: RANK=1\n"), std::string::npos);
  EXPECT_NE(text.find("  env: MASTER_PORT=<free port chosen at start>\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  env: TORCHELASTIC_ERROR_FILE=<log dir>/attempt_0/1/error.json\n"), std::string::npos);
  EXPECT_EQ(text.find("PATH="), std::string::npos) << "inherited unchanged: not shown";
  EXPECT_NE(text.find("rank 1 (local_rank 1):\n"), std::string::npos);
  EXPECT_NE(text.find("  binding: none\n"), std::string::npos);
}

// The dry run shows the MASTER_ADDR/MASTER_PORT the run would bind, whichever flags chose them.
TEST(DryRun, ShowsTheStoreAddressTheRunWouldBind) {
  const Environment base = Environment::FromEntries({"PATH=/bin"});
  auto master = [&](const LaunchConfig& c) {
    const std::string text = FormatDryRun(c, base, "/bin/train", "host1");
    const size_t a = text.find("  env: MASTER_ADDR="), p = text.find("  env: MASTER_PORT=");
    if (a == std::string::npos || p == std::string::npos) return std::string("?");
    return text.substr(a + 19, text.find('\n', a) - a - 19) + " " + text.substr(p + 19, text.find('\n', p) - p - 19);
  };
  LaunchConfig c;
  c.entrypoint = "/bin/train";
  c.rdzv_endpoint = "localhost:29999";
  c.rdzv.endpoints = {HostPort{"localhost", 29999}};
  EXPECT_EQ(master(c), "localhost 29999");
  LaunchConfig s;
  s.entrypoint = "/bin/train";
  s.standalone = true;
  s.local_addr = "localhost";
  EXPECT_EQ(master(s), "localhost <free port chosen at start>");
  LaunchConfig m;
  m.entrypoint = "/bin/train";
  m.master_addr = "10.0.0.1";
  m.master_port = 1234;
  EXPECT_EQ(master(m), "10.0.0.1 1234");
}

}  // namespace
}  // namespace ctrun
