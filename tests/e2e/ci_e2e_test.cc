// CI smoke-run features end to end, with the real ctrun and ctrun_fake_worker: --max-run-time,
// --dry-run, --summary-file, --events-file and the GitHub Actions annotation. The summary and the
// events are parsed as JSON and checked against the run that wrote them. Every wait polls against
// a deadline; nothing sleeps and hopes.
#include <sys/stat.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <set>

#include "helpers/ctrun_command.h"
#include "helpers/test_util.h"

namespace ctrun::testing {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

json ReadJson(const std::string& path) {
  const std::string text = ReadFileOr(path);
  EXPECT_FALSE(text.empty()) << path << " is missing or empty";
  return text.empty() ? json() : json::parse(text);
}

std::vector<json> ReadEvents(const std::string& path) {
  std::vector<json> out;
  for (const std::string& line : SplitLines(ReadFileOr(path))) out.push_back(json::parse(line));
  return out;
}

std::vector<std::string> Names(const std::vector<json>& events) {
  std::vector<std::string> n;
  for (const auto& e : events) n.push_back(e["event"].get<std::string>());
  return n;
}

std::vector<json> Named(const std::vector<json>& events, const std::string& name) {
  std::vector<json> out;
  for (const auto& e : events)
    if (e["event"] == name) out.push_back(e);
  return out;
}

// The framing every line carries: consecutive seq from 0, non-decreasing monotonic time, one run.
void ExpectWellFramed(const std::vector<json>& events, const std::string& run_id) {
  ASSERT_FALSE(events.empty());
  int64_t mono = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i]["seq"], i);
    EXPECT_GE(events[i]["mono_ns"].get<int64_t>(), mono);
    mono = events[i]["mono_ns"].get<int64_t>();
    EXPECT_EQ(events[i]["wall"].get<std::string>().size(), 27u) << events[i]["wall"];
    EXPECT_EQ(events[i]["run_id"], run_id);
  }
  EXPECT_EQ(events.back()["event"], "run_end");
}

// The summary's ranks and the events' worker_start/worker_exit describe the same workers.
void ExpectSummaryMatchesEvents(const json& summary, const std::vector<json>& events) {
  std::vector<json> starts = Named(events, "worker_start");
  const int last_attempt = starts.empty() ? 0 : starts.back()["attempt"].get<int>();
  std::map<int, int> pid_of;
  for (const auto& s : starts)
    if (s["attempt"] == last_attempt) pid_of[s["rank"].get<int>()] = s["pid"].get<int>();
  ASSERT_EQ(summary["ranks"].size(), pid_of.size());
  for (const auto& r : summary["ranks"]) {
    EXPECT_EQ(r["pid"], pid_of[r["rank"].get<int>()]) << r;
    bool found = false;
    for (const auto& e : Named(events, "worker_exit"))
      if (e["pid"] == r["pid"]) {
        found = true;
        EXPECT_EQ(e["cause"], r["state"]);
        EXPECT_EQ(e["exit_code"], r["exit_code"]);
        EXPECT_EQ(e["signal"], r["signal"]);
      }
    EXPECT_TRUE(found) << "no worker_exit for " << r;
  }
  const json end = events.back();
  EXPECT_EQ(end["exit_code"], summary["exit_code"]);
  EXPECT_EQ(end["outcome"], summary["outcome"]);
  EXPECT_EQ(end["attempts"], summary["attempts"]);
  EXPECT_EQ(Named(events, "attempt_start").size(), summary["attempts"].get<size_t>());
}

TEST(CiE2E, MaxRunTimeStopsTheRunningRanksAndExits124) {
  TempDir d;
  const std::vector<std::string> flags{"--standalone", "--nproc_per_node=3", "--max-run-time=1",
                                       "--summary-file=" + (d / "summary.json"), "--events-file", d / "events.jsonl"};
  // Rank 1 finishes at once; ranks 0 and 2 hang until stopped.
  auto r = RunCommand(Ctrun(flags, {"--only-rank", "1", "--else-hang", "--pid-file", d / "pids"}), {}, 30s);
  EXPECT_EQ(r.exit_code, 124) << r.err;
  EXPECT_GE(r.seconds, 1.0);
  EXPECT_LT(r.seconds, 3.0) << "the deadline fired late";
  EXPECT_NE(r.err.find("reached --max-run-time (1 s); ranks still running: 0, 2"), std::string::npos) << r.err;
  for (pid_t p : ReadPids(d / "pids")) EXPECT_FALSE(ProcessAlive(p));

  const json s = ReadJson(d / "summary.json");
  EXPECT_EQ(s["outcome"], "max_run_time");
  EXPECT_EQ(s["exit_code"], 124);
  EXPECT_EQ(s["exit_code_from"], "ctrun");
  EXPECT_EQ(s["running_at_deadline"], json({0, 2}));
  EXPECT_EQ(s["root_cause"], "reached --max-run-time (1 s); ranks still running: 0, 2");
  ASSERT_EQ(s["ranks"].size(), 3u);
  EXPECT_EQ(s["ranks"][1]["state"], "succeeded");
  EXPECT_EQ(s["ranks"][0]["state"], "stopped");
  EXPECT_EQ(s["ranks"][0]["signal_name"], "SIGTERM");

  const auto events = ReadEvents(d / "events.jsonl");
  ExpectWellFramed(events, s["run_id"].get<std::string>());
  ExpectSummaryMatchesEvents(s, events);
  const auto deadline = Named(events, "max_run_time");
  ASSERT_EQ(deadline.size(), 1u);
  EXPECT_EQ(deadline[0]["running_ranks"], json({0, 2}));
  const double start_to_deadline =
      (deadline[0]["mono_ns"].get<int64_t>() - events.front()["mono_ns"].get<int64_t>()) / 1e9;
  const double deadline_to_end =
      (events.back()["mono_ns"].get<int64_t>() - deadline[0]["mono_ns"].get<int64_t>()) / 1e9;
  EXPECT_GE(start_to_deadline, 0.9);
  EXPECT_LT(start_to_deadline, 1.5);
  EXPECT_LT(deadline_to_end, 1.0) << "workers that die of SIGTERM are gone at once";
  std::printf("max-run-time 1 s: run_start->deadline %.3f s, deadline->run_end %.3f s, whole run %.3f s\n",
              start_to_deadline, deadline_to_end, r.seconds);
}

TEST(CiE2E, DryRunPrintsEveryRankAndStartsNothing) {
  TempDir d;
  const std::string touched = d / "touched";
  ASSERT_EQ(mkdir(touched.c_str(), 0755), 0);
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=3", "--dry-run", "--summary-file", d / "s.json",
                             "--events-file", d / "e.jsonl"},
                            {"--touch", touched, "--pid-file", d / "pids", "--print", "1"}));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("ctrun dry run: nothing is started\n", 0), 0u) << r.out;
  for (int i = 0; i < 3; ++i) {
    const std::string rank = "rank " + std::to_string(i) + " (local_rank " + std::to_string(i) + "):\n";
    const size_t at = r.out.find(rank);
    ASSERT_NE(at, std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("  exec: " + std::string(FAKE_WORKER) + " --touch " + touched, at), at + rank.size());
    EXPECT_NE(r.out.find("  env: RANK=" + std::to_string(i) + "\n", at), std::string::npos);
  }
  EXPECT_NE(r.out.find("  env: WORLD_SIZE=3\n"), std::string::npos);
  EXPECT_NE(r.out.find("  binding: none\n"), std::string::npos);
  // Proof that no worker ran: none touched its file, none wrote its pid, none printed.
  EXPECT_TRUE(std::filesystem::is_empty(touched));
  EXPECT_FALSE(std::filesystem::exists(d / "pids"));
  EXPECT_EQ(r.out.find("rank 0 line"), std::string::npos);
  EXPECT_EQ(ReadJson(d / "s.json")["outcome"], "dry_run");
  EXPECT_EQ(Names(ReadEvents(d / "e.jsonl")), std::vector<std::string>{"run_end"});
}

// The dry run shows the binding the run would apply, as --report-bindings prints it.
TEST(CiE2E, DryRunShowsThePlannedCpuBinding) {
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2", "--dry-run", "--cpu-binding=core"}, {}));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const size_t rank1 = r.out.find("rank 1 (local_rank 1):\n");
  ASSERT_NE(rank1, std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  binding: cpus "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  binding: cpus ", rank1), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("  binding: none"), std::string::npos) << r.out;
}

// Everything the run would add or change is shown: the GPU list --gpus narrows (set by the GPU
// probe, not per rank) and the heartbeat channel (set at spawn).
TEST(CiE2E, DryRunShowsTheNarrowedGpuListAndTheHeartbeatChannel) {
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=gpu", "--gpus=1,2", "--heartbeat-timeout=100", "--dry-run"}, {}),
                      {"CUDA_VISIBLE_DEVICES=0,1,2"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("  env: CUDA_VISIBLE_DEVICES=1,2\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  env: CTRUN_HEARTBEAT_FD=3\n"), std::string::npos) << r.out;
}

TEST(CiE2E, DryRunStillRefusesABadEntrypoint) {
  auto r = RunCommand({CTRUN_BINARY, "--dry-run", "/nonexistent/train"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST(CiE2E, SuccessSummaryAndEventsDescribeTheSameRun) {
  TempDir d;
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2", "--rdzv_id=okjob", "--summary-file", d / "s.json",
                             "--events-file", d / "e.jsonl", "--log_dir", d / "logs"},
                            {}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json s = ReadJson(d / "s.json");
  EXPECT_EQ(s["schema"], "ctrun.summary/1");
  EXPECT_EQ(s["outcome"], "success");
  EXPECT_EQ(s["exit_code"], 0);
  EXPECT_EQ(s["run_id"], "okjob");
  EXPECT_TRUE(s["root_cause"].is_null());
  EXPECT_EQ(s["attempts"], 1);
  EXPECT_EQ(s["restarts"], 0);
  EXPECT_FALSE(s["hostname"].get<std::string>().empty());
  EXPECT_FALSE(s["ctrun_version"].get<std::string>().empty());
  EXPECT_EQ(s["log_dir"].get<std::string>().rfind(d / "logs/okjob_", 0), 0u) << s["log_dir"];
  for (const auto& rank : s["ranks"]) {
    EXPECT_EQ(rank["state"], "succeeded");
    EXPECT_EQ(rank["exit_code"], 0);
    EXPECT_GE(rank["duration_s"].get<double>(), 0.0);
  }
  EXPECT_GE(s["duration_s"].get<double>(), s["ranks"][0]["duration_s"].get<double>());
  const auto events = ReadEvents(d / "e.jsonl");
  ExpectWellFramed(events, "okjob");
  EXPECT_EQ(Names(events), (std::vector<std::string>{"run_start", "attempt_start", "worker_start", "worker_start",
                                                     "worker_exit", "worker_exit", "stop", "run_end"}));
  ExpectSummaryMatchesEvents(s, events);
}

TEST(CiE2E, FailureWithRestartIsTheWorkersCodeWithBothAttempts) {
  TempDir d;
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2", "--max_restarts=1", "--summary-file", d / "s.json",
                             "--events-file", d / "e.jsonl"},
                            {"--only-rank", "1", "--exit", "2", "--else-hang"}));
  ASSERT_EQ(r.exit_code, 2) << r.err;
  const json s = ReadJson(d / "s.json");
  EXPECT_EQ(s["outcome"], "worker_failure");
  EXPECT_EQ(s["exit_code_from"], "worker") << "a worker's 2, not ctrun's usage error";
  EXPECT_EQ(s["attempts"], 2);
  EXPECT_EQ(s["restarts"], 1);
  EXPECT_EQ(s["root_cause_rank"], 1);
  EXPECT_NE(s["root_cause"].get<std::string>().find("rank 1 (local_rank 1, pid "), std::string::npos);
  EXPECT_EQ(s["ranks"][1]["state"], "failed");
  EXPECT_EQ(s["ranks"][1]["exit_code"], 2);
  EXPECT_EQ(s["ranks"][0]["state"], "stopped");
  const auto events = ReadEvents(d / "e.jsonl");
  ExpectWellFramed(events, s["run_id"].get<std::string>());
  ExpectSummaryMatchesEvents(s, events);
  ASSERT_EQ(Named(events, "restart").size(), 1u);
  EXPECT_EQ(Named(events, "restart")[0]["restart_count"], 1);
  EXPECT_EQ(Named(events, "worker_start").size(), 4u);
}

TEST(CiE2E, UsageErrorsAreCtrunsOwnCodeInTheSummary) {
  TempDir d;
  // A missing entrypoint, a bad value, an unknown option: all exit 2, all say usage_error.
  const std::vector<std::vector<std::string>> cases{
      {CTRUN_BINARY, "--summary-file", d / "s0.json", "/nonexistent/train"},
      {CTRUN_BINARY, "--summary-file", d / "s1.json", "--nproc_per_node=abc", FAKE_WORKER},
      {CTRUN_BINARY, "--summary-file=" + (d / "s2.json"), "--bogus", FAKE_WORKER}};
  for (size_t i = 0; i < cases.size(); ++i) {
    auto r = RunCommand(cases[i], {"GITHUB_ACTIONS=false"});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    const json s = ReadJson(d / ("s" + std::to_string(i) + ".json"));
    EXPECT_EQ(s["outcome"], "usage_error") << i;
    EXPECT_EQ(s["exit_code"], 2);
    EXPECT_EQ(s["exit_code_from"], "ctrun");
    EXPECT_EQ(s["attempts"], 0);
    EXPECT_EQ("ctrun: error: " + s["root_cause"].get<std::string>() + "\n", r.err) << "the same one line";
  }
}

TEST(CiE2E, ABadSummaryPathIsAUsageErrorBeforeAnythingStarts) {
  TempDir d;
  auto r = RunCommand(Ctrun({"--standalone", "--summary-file", "/nonexistent-dir/s.json"}, {"--touch", d.path()}));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--summary-file /nonexistent-dir/s.json"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(d / "0"));
}

TEST(CiE2E, AnExecFailureAtSpawnIsAStartErrorWithItsEvent) {
  TempDir d;
  const std::string script = d / "bad_interp.sh";
  std::ofstream(script) << "#!/nonexistent/interpreter\n";
  ASSERT_EQ(chmod(script.c_str(), 0755), 0);
  auto r = RunCommand({CTRUN_BINARY, "--standalone", "--nproc_per_node=2", "--summary-file", d / "s.json",
                       "--events-file", d / "e.jsonl", script});
  EXPECT_EQ(r.exit_code, 127) << r.err;
  const json s = ReadJson(d / "s.json");
  EXPECT_EQ(s["outcome"], "start_error");
  EXPECT_EQ(s["exit_code"], 127);
  EXPECT_NE(s["root_cause"].get<std::string>().find(script), std::string::npos) << s["root_cause"];
  const auto events = ReadEvents(d / "e.jsonl");
  ExpectWellFramed(events, s["run_id"].get<std::string>());
  ASSERT_EQ(Named(events, "start_error").size(), 2u);
  EXPECT_EQ(Named(events, "start_error")[0]["exit_code"], 127);
  EXPECT_TRUE(Named(events, "worker_start").empty());
}

TEST(CiE2E, AWorkerKilledBySignalHasItsSignalInBothFiles) {
  TempDir d;
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2", "--summary-file", d / "s.json", "--events-file",
                             d / "e.jsonl"},
                            {"--only-rank", "0", "--signal", "9", "--else-hang"}));
  ASSERT_EQ(r.exit_code, 137) << r.err;
  const json s = ReadJson(d / "s.json");
  EXPECT_EQ(s["outcome"], "worker_failure");
  EXPECT_EQ(s["ranks"][0]["state"], "failed");
  EXPECT_TRUE(s["ranks"][0]["exit_code"].is_null());
  EXPECT_EQ(s["ranks"][0]["signal"], 9);
  EXPECT_EQ(s["ranks"][0]["signal_name"], "SIGKILL");
  const auto events = ReadEvents(d / "e.jsonl");
  ExpectWellFramed(events, s["run_id"].get<std::string>());
  ExpectSummaryMatchesEvents(s, events);
}

TEST(CiE2E, EventsAreWrittenAsTheyHappenAndASignalToCtrunIsItsOwnOutcome) {
  TempDir d;
  BackgroundProcess ctrun(Ctrun({"--standalone", "--nproc_per_node=2", "--summary-file", d / "s.json",
                                 "--events-file", d / "e.jsonl"},
                                {"--hang"}),
                          {}, d / "out", d / "err");
  // Both worker_start lines are readable while the job still runs: flushed as they happen.
  ASSERT_TRUE(WaitFor([&] { return Named(ReadEvents(d / "e.jsonl"), "worker_start").size() == 2; }, 20s))
      << ReadFileOr(d / "err");
  EXPECT_FALSE(std::filesystem::exists(d / "s.json")) << "the summary is written at the end only";
  ctrun.Signal(SIGTERM);
  EXPECT_EQ(ctrun.Wait(20s), 143);
  const json s = ReadJson(d / "s.json");
  EXPECT_EQ(s["outcome"], "signal");
  EXPECT_EQ(s["exit_code"], 143);
  EXPECT_EQ(s["root_cause"], "ctrun received signal 15 (SIGTERM)");
  const auto events = ReadEvents(d / "e.jsonl");
  ExpectWellFramed(events, s["run_id"].get<std::string>());
  ASSERT_EQ(Named(events, "stop").size(), 1u);
  EXPECT_EQ(Named(events, "stop")[0]["reason"], "signal");
  for (const auto& e : Named(events, "worker_exit")) EXPECT_EQ(e["cause"], "stopped");
}

TEST(CiE2E, GithubAnnotationOnlyUnderActions) {
  const auto flags = std::vector<std::string>{"--standalone", "--nproc_per_node=2"};
  const auto worker = std::vector<std::string>{"--only-rank", "1", "--exit", "3", "--else-hang"};
  auto on = RunCommand(Ctrun(flags, worker), {"GITHUB_ACTIONS=true"});
  EXPECT_EQ(on.exit_code, 3);
  const size_t at = on.out.find("::error title=ctrun%3A worker_failure (exit 3)::rank 1 (local_rank 1, pid ");
  ASSERT_NE(at, std::string::npos) << on.out;
  EXPECT_TRUE(at == 0 || on.out[at - 1] == '\n') << "a workflow command starts a line";
  auto off = RunCommand(Ctrun(flags, worker), {"GITHUB_ACTIONS=false"});
  EXPECT_EQ(off.exit_code, 3);
  EXPECT_EQ(off.out.find("::error"), std::string::npos) << off.out;
  auto ok = RunCommand(Ctrun(flags, {}), {"GITHUB_ACTIONS=true"});
  EXPECT_EQ(ok.exit_code, 0);
  EXPECT_EQ(ok.out.find("::error"), std::string::npos) << "nothing to annotate on success";
  auto usage = RunCommand({CTRUN_BINARY, "--nproc_per_node=abc", FAKE_WORKER}, {"GITHUB_ACTIONS=true"});
  EXPECT_EQ(usage.exit_code, 2);
  EXPECT_EQ(usage.out.rfind("::error title=ctrun%3A usage_error (exit 2)::invalid value 'abc' for --nproc_per_node", 0),
            0u)
      << usage.out;
}

}  // namespace
}  // namespace ctrun::testing
