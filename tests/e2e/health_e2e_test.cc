// Hang detection, stack capture and the restart policy through the real ctrun binary and
// ctrun_fake_worker: deadlines are checked against the silence ctrun measured and printed, and
// every run is bounded by RunCommand's timeout (no test sleeps and hopes).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "helpers/ctrun_command.h"
#include "helpers/test_util.h"

namespace ctrun::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr int kExitHung = 124;

bool Contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// Files under dir whose name starts with prefix, with their contents.
std::vector<std::pair<std::string, std::string>> FilesStartingWith(const std::string& dir, const std::string& prefix) {
  std::vector<std::pair<std::string, std::string>> out;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec))
    if (e.is_regular_file() && e.path().filename().string().rfind(prefix, 0) == 0)
      out.emplace_back(e.path().string(), ReadFileOr(e.path().string()));
  return out;
}

TEST(HealthE2E, WorkersGetTheHeartbeatSocketAsFd3OnlyWhenAsked) {
  TempDir d;
  auto r = RunCommand(Ctrun({"--nproc_per_node=2", "--heartbeat-timeout=5"}, {"--env-file", d / "env", "--fd-file", d / "fds"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(Contains(ReadFileOr(d / "env.1"), "\nCTRUN_HEARTBEAT_FD=3\n"));
  EXPECT_TRUE(std::regex_search(ReadFileOr(d / "fds.1"), std::regex("(^|\n)3 socket:")));
  // CTRUN_HEARTBEAT_ID names fd 3's socket: "<st_dev>:<st_ino>", the inode /proc shows for it.
  for (const char* rank : {"0", "1"}) {
    std::smatch id, fd3;
    const std::string env = ReadFileOr(d / ("env." + std::string(rank)));
    const std::string fds = ReadFileOr(d / ("fds." + std::string(rank)));
    ASSERT_TRUE(std::regex_search(env, id, std::regex("\nCTRUN_HEARTBEAT_ID=[0-9]+:([0-9]+)\n"))) << env;
    ASSERT_TRUE(std::regex_search(fds, fd3, std::regex("(^|\n)3 socket:\\[([0-9]+)\\]"))) << fds;
    EXPECT_EQ(id[1], fd3[2]) << "rank " << rank;
  }
  r = RunCommand(Ctrun({"--nproc_per_node=1"}, {"--env-file", d / "env2", "--fd-file", d / "fds2"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(Contains(ReadFileOr(d / "env2.0"), "CTRUN_HEARTBEAT_FD"));
  EXPECT_FALSE(Contains(ReadFileOr(d / "env2.0"), "CTRUN_HEARTBEAT_ID"));
  EXPECT_FALSE(Contains(ReadFileOr(d / "fds2.0"), "\n3 "));
}

// A process the worker starts inherits CTRUN_HEARTBEAT_FD and CTRUN_HEARTBEAT_ID but not fd 3
// (CLOEXEC); its own socket at fd 3 is a stranger's to the worker library, which sends it no
// beat and leaves its flags as they are.
TEST(HealthE2E, AChildsOwnSocketAtFd3GetsNoBeats) {
  TempDir d;
  auto r = RunCommand(Ctrun({"--nproc_per_node=1", "--heartbeat-timeout=30"},
                            {"--env-file", d / "env", "--stranger-child", d / "stranger", "--heartbeat", "2"}),
                      {}, 30s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(Contains(ReadFileOr(d / "env.0"), "\nCTRUN_HEARTBEAT_ID=")) << "the child inherits the variables";
  EXPECT_EQ(ReadFileOr(d / "stranger.0"), "beats=0 received=0 cloexec=0 nonblock=0\n");
}

TEST(HealthE2E, BeatThenStopIsFoundAtTheDeadlineAndIsTheRootCause) {
  TempDir d;
  auto r = RunCommand(Ctrun({"--nproc_per_node=3", "--heartbeat-timeout=1", "--stack-timeout=0", "--log-dir", d.path()},
                            {"--heartbeat", "3", "--heartbeat-ms", "10", "--beat-step", "1198", "--only-rank", "1",
                             "--hang", "--else-beat", "50"}),
                      {}, 30s);
  ASSERT_EQ(r.exit_code, kExitHung) << r.err;
  // The silence ctrun measured when it gave the verdict: the deadline, plus the loop's latency.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex(R"(no heartbeat for (1\.[0-9]) s \(last beat at step 1200\))")))
      << r.err;
  EXPECT_LE(std::stod(m[1]), 1.2) << "verdict well after the deadline";
  EXPECT_TRUE(Contains(r.err, "cause     : hung: no heartbeat for")) << r.err;
  EXPECT_TRUE(Contains(r.err, "rank      : 1 (local_rank: 1)")) << r.err;
  EXPECT_LT(r.seconds, 10) << r.err;
}

TEST(HealthE2E, NoFirstBeatUsesTheFirstDeadline) {
  auto r = RunCommand(Ctrun({"--nproc_per_node=2", "--heartbeat-timeout=0.2", "--heartbeat-first-timeout=1",
                             "--stack-timeout=0"},
                            {"--only-rank", "0", "--hang", "--else-beat", "20"}),
                      {}, 30s);
  ASSERT_EQ(r.exit_code, kExitHung) << r.err;
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(rank 0 .*hung: no first heartbeat within 1\.[0-2] s)"))) << r.err;
}

TEST(HealthE2E, SlowButSteadyBeatsAreNotAHang) {
  auto r = RunCommand(Ctrun({"--nproc_per_node=2", "--heartbeat-timeout=1", "--heartbeat-first-timeout=2"},
                            {"--heartbeat", "5", "--heartbeat-ms", "300"}),
                      {}, 30s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(Contains(r.err, "hung")) << r.err;
}

TEST(HealthE2E, OutputTimeoutCatchesAWorkerThatPrintsWithoutBeating) {
  TempDir d;
  // Rank 0's output goes to its log file (-r 3): the relay still sees it, and it keeps it alive.
  auto r = RunCommand(Ctrun({"--nproc_per_node=2", "--output-timeout=1", "--stack-timeout=0", "-r", "0:3",
                             "--log-dir", d.path()},
                            {"--print", "20", "--print-ms", "100", "--quiet-rank", "1", "--only-rank", "1", "--hang",
                             "--else-hang"}),
                      {}, 30s);
  ASSERT_EQ(r.exit_code, kExitHung) << r.err;
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(rank 1 .*hung: no output for 1\.[0-2] s)"))) << r.err;
  EXPECT_FALSE(std::regex_search(r.err, std::regex(R"(rank 0 .*hung)"))) << r.err;
  auto logs = FilesStartingWith(d.path(), "stdout.log");
  bool rank0_file = false;
  for (const auto& [path, text] : logs) rank0_file |= Contains(text, "rank 0 line 9");
  EXPECT_TRUE(rank0_file) << "-r still writes rank 0's file";
}

TEST(HealthE2E, AHungWorkerThatIgnoresSigtermIsKilledAfterTheGrace) {
  auto r = RunCommand(Ctrun({"--nproc_per_node=2", "--heartbeat-timeout=0.5", "--heartbeat-first-timeout=0.5",
                             "--stack-timeout=0", "--shutdown-timeout=1"},
                            {"--ignore-term", "--only-rank", "1", "--hang", "--else-beat", "20"}),
                      {}, 30s);
  ASSERT_EQ(r.exit_code, kExitHung) << r.err;
  EXPECT_TRUE(Contains(r.err, "SIGKILL")) << r.err;
  EXPECT_LT(r.seconds, 10);
}

TEST(HealthE2E, StacksOfAHungRankAreSavedAndNamedInTheSummary) {
  if (!fs::exists("/usr/bin/eu-stack") && !fs::exists("/usr/bin/gdb")) GTEST_SKIP() << "no eu-stack or gdb";
  TempDir d;
  auto r = RunCommand(Ctrun({"--nproc_per_node=2", "--heartbeat-timeout=0.5", "--stack-timeout=20", "--log-dir",
                             d.path()},
                            {"--heartbeat", "2", "--grandchildren", "1", "--only-rank", "1", "--hang", "--else-beat",
                             "20"}),
                      {}, 60s);
  ASSERT_EQ(r.exit_code, kExitHung) << r.err;
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(stacks    : stacks of 2 processes saved in \S+/1/stacks)"))) << r.err;
  auto native = FilesStartingWith(d.path(), "native.");
  int with_frames = 0;
  for (const auto& [path, text] : native) with_frames += Contains(text, "#0") || Contains(text, "#1");
  EXPECT_EQ(with_frames, 2) << r.err;
}

// Both ranks stop beating within moments (as in a collective hang): the first to fall silent is
// blamed, the other is named, and both ranks' stacks are saved.
TEST(HealthE2E, EveryRankSilentWithTheHungOneHasItsStacksSavedAndIsNamed) {
  if (!fs::exists("/usr/bin/eu-stack") && !fs::exists("/usr/bin/gdb")) GTEST_SKIP() << "no eu-stack or gdb";
  TempDir d;
  auto r = RunCommand(Ctrun({"--nproc_per_node=2", "--heartbeat-timeout=1", "--stack-timeout=20", "--log-dir",
                             d.path()},
                            {"--heartbeat", "2", "--hang"}),
                      {}, 60s);
  ASSERT_EQ(r.exit_code, kExitHung) << r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m, std::regex(R"(cause     : hung: no heartbeat for \S+ s \(last beat at step \d+\); rank ([01]) had fallen silent too)")))
      << r.err;
  const std::string other = m[1];
  EXPECT_TRUE(Contains(r.err, "rank      : " + std::string(other == "0" ? "1" : "0"))) << r.err;
  for (const std::string rank : {"0", "1"}) {
    EXPECT_TRUE(std::regex_search(r.err, std::regex("rank " + rank + R"(: stacks of 1 process saved in \S+/)" + rank +
                                                    "/stacks")))
        << r.err;
    auto native = FilesStartingWith(d.path() + "/", "native.");
    int with_frames = 0;
    for (const auto& [path, text] : native)
      with_frames += Contains(path, "/" + rank + "/stacks/") && (Contains(text, "#0") || Contains(text, "#1"));
    EXPECT_EQ(with_frames, 1) << "rank " << rank << "\n" << r.err;
  }
}

TEST(HealthE2E, MissingStackToolsAreReportedAndDoNotDelayTheStop) {
  TempDir d;
  auto r = RunCommand(Ctrun({"--nproc_per_node=2", "--heartbeat-timeout=0.5", "--heartbeat-first-timeout=0.5",
                             "--stack-timeout=30", "--log-dir", d.path()},
                            {"--only-rank", "1", "--hang", "--else-beat", "20"}),
                      {"PATH=" + d.path()}, 30s);  // neither eu-stack nor gdb in PATH
  ASSERT_EQ(r.exit_code, kExitHung) << r.err;
  EXPECT_TRUE(Contains(r.err, "stacks not captured: neither eu-stack (elfutils) nor gdb is installed")) << r.err;
  EXPECT_LT(r.seconds, 10) << "the 30 s bound is not waited for";
}

// The Python dump's gdb outlives the bound (a fake gdb first on PATH sleeps in that step): the
// capture is cut, and the summary counts the Python dumps that were written (none), not the ones
// planned.
TEST(HealthE2E, ACutCaptureCountsOnlyThePythonDumpsWritten) {
  TempDir d;
  fs::create_directories(d / "bin");
  std::ofstream(d / "bin/gdb") << "#!/bin/sh\n"
                                  "case \"$*\" in *_Py_Dump*) exec sleep 30;; esac\n"
                                  "echo 'Thread 1 (Thread 0x1 (LWP 1) \"python3\"):'; echo '#0  0x0 in fake ()'\n";
  fs::permissions(d / "bin/gdb", fs::perms::owner_all);
  std::ofstream(d / "w.py") << "import os, time\n"
                               "os.write(int(os.environ['CTRUN_HEARTBEAT_FD']), b'1\\n')\n"
                               "time.sleep(1000)\n";
  auto r = RunCommand({CTRUN_BINARY, "--nproc_per_node=2", "--heartbeat-timeout=0.5", "--stack-timeout=2",
                       "--shutdown-timeout=1", "--log-dir", d.path(), d / "w.py"},
                      {"PYTHON_EXEC=/usr/bin/python3", "PATH=" + (d / "bin") + ":/usr/bin:/bin"}, 60s);
  ASSERT_EQ(r.exit_code, kExitHung) << r.err;
  EXPECT_TRUE(Contains(r.err, "Python: 0 of 1 process, on the rank's stderr)")) << r.err;
  EXPECT_TRUE(Contains(r.err, "the capture was cut at its 2.0 s bound")) << r.err;
}

TEST(HealthE2E, CaptureOfAStoppedRankIsBounded) {
  if (!fs::exists("/usr/bin/eu-stack") && !fs::exists("/usr/bin/gdb")) GTEST_SKIP() << "no eu-stack or gdb";
  TempDir d;
  // Rank 1 SIGSTOPs itself after two beats: a tracer may wait on it forever; the capture may not.
  auto r = RunCommand(Ctrun({"--nproc_per_node=2", "--heartbeat-timeout=0.5", "--stack-timeout=2",
                             "--shutdown-timeout=1", "--log-dir", d.path()},
                            {"--heartbeat", "2", "--only-rank", "1", "--signal", "19", "--else-beat", "20"}),
                      {}, 60s);
  ASSERT_EQ(r.exit_code, kExitHung) << r.err;
  // deadline 0.5 + capture <= 2 + grace 1 + start/stop: well under 8 s.
  EXPECT_LT(r.seconds, 8) << r.err;
  EXPECT_TRUE(Contains(r.err, "stacks    :")) << r.err;
}

TEST(HealthE2E, HungAttemptIsRestartedAndTheJobFinishes) {
  auto r = RunCommand(Ctrun({"--nproc_per_node=2", "--heartbeat-timeout=0.5", "--stack-timeout=0", "--max_restarts=1"},
                            {"--heartbeat", "2", "--only-rank", "1", "--only-attempt", "0", "--hang"}),
                      {}, 30s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(Contains(r.err, "hung: no heartbeat for")) << r.err;
  // The live line names the hang, not the SIGTERM ctrun stopped the hung rank with.
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(attempt 0 failed; root cause: worker rank 1 \(local_rank 1, pid \d+\) hung: no heartbeat for)")))
      << r.err;
  EXPECT_TRUE(Contains(r.err, "restart 1 of 1")) << r.err;
}

TEST(HealthE2E, RestartsBackOff) {
  auto r = RunCommand(Ctrun({"--nproc_per_node=1", "--max_restarts=2", "--restart-backoff=0.3"}, {"--exit", "3"}), {},
                      30s);
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_TRUE(Contains(r.err, "restarting in 0.30 s")) << r.err;
  EXPECT_TRUE(Contains(r.err, "restarting in 0.60 s")) << r.err;
  EXPECT_GE(r.seconds, 0.9);
}

TEST(HealthE2E, CrashLoopGuardStopsRestartsThatMakeNoProgress) {
  auto r = RunCommand(Ctrun({"--nproc_per_node=2", "--heartbeat-timeout=5", "--max_restarts=10", "--crash-loop-limit=2"},
                            {"--heartbeat", "3", "--beat-step", "1", "--exit", "1"}),
                      {}, 30s);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(Contains(r.err, "crash loop: 2 attempts in a row failed without progress (no heartbeat step beyond 3)"))
      << r.err;
  EXPECT_TRUE(Contains(r.err, "restart 2 of 10")) << r.err;
  EXPECT_FALSE(Contains(r.err, "restart 3 of 10")) << r.err;
}

// The README's Python lines (the start-up three and the beat), checked verbatim against README.md
// (comments aside) and run: in the worker they beat; in a process the worker starts with
// subprocess (fds above 2 closed), whose own socket is at fd 3, they find no channel.
TEST(HealthE2E, TheReadmePythonSnippetBeats) {
  const std::vector<std::string> setup = {
      "import os; hb = os.environ.get(\"CTRUN_HEARTBEAT_FD\")",
      "try: s = os.fstat(int(hb)); hb = int(hb) if f\"{s.st_dev}:{s.st_ino}\" == "
      "os.environ.get(\"CTRUN_HEARTBEAT_ID\") else None",
      "except (TypeError, ValueError, OSError): hb = None"};
  const std::string beat = "if hb is not None: os.write(hb, b\"%d\\n\" % step)";
  const std::string readme = ReadFileOr(std::string(CTRUN_SOURCE_DIR) + "/README.md");
  for (const std::string& line : setup) EXPECT_TRUE(Contains(readme, "\n  " + line)) << line;
  EXPECT_TRUE(Contains(readme, "\n  " + beat)) << beat;
  TempDir d;
  const std::string script = d / "beat.py", child = d / "child.py", seen = d / "child.out";
  {
    std::ofstream f(child);
    f << "import socket, sys\n"
         "mine, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
         "assert mine.fileno() == 3, mine.fileno()\n";
    for (const std::string& line : setup) f << line << "\n";
    f << "step = 1\n"
      << beat << "\n"
      << "peer.setblocking(False)\n"
         "try: got = peer.recv(64)\n"
         "except BlockingIOError: got = b''\n"
         "open(sys.argv[1], 'w').write('hb=%s got=%r\\n' % (hb, got))\n";
  }
  {
    std::ofstream f(script);
    f << "import os, subprocess, sys, time\n";
    for (const std::string& line : setup) f << line << "\n";
    f << "subprocess.run([sys.executable, '" << child << "', '" << seen << "'], check=True)\n"
      << "for step in range(1, 6):\n"
      << "    " << beat << "\n"
      << "    time.sleep(0.01)\n"
         "time.sleep(1000)\n";
  }
  auto r = RunCommand({CTRUN_BINARY, "--nproc_per_node=1", "--heartbeat-timeout=0.5", "--stack-timeout=0", script},
                      {"PYTHON_EXEC=/usr/bin/python3"}, 30s);
  ASSERT_EQ(r.exit_code, kExitHung) << r.err;
  EXPECT_TRUE(Contains(r.err, "(last beat at step 5)")) << r.err;
  EXPECT_EQ(ReadFileOr(seen), "hb=None got=b''\n") << r.err;
}

}  // namespace
}  // namespace ctrun::testing

namespace ctrun::testing {
namespace {

// --late-exit-notice: ranks 0 and 2 exit 0 at once, rank 1 never ends; ctrun names it at 0.3 s and
// 0.6 s after the first exit and stops nothing until --max-run-time does.
TEST(HealthE2E, ARankStillRunningAfterItsPeersExitedZeroIsNamed) {
  TempDir d;
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=3", "--late-exit-notice=0.3", "--max-run-time=4",
                             "--events-file", d / "events.jsonl"},
                            {"--only-rank", "1", "--hang", "--pid-file", d / "pids"}),
                      {}, 30s);
  EXPECT_EQ(r.exit_code, 124) << r.err;  // the deadline's, not the notice's doing
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.err, m,
                                std::regex(R"(ranks 0, 2 exited 0, the first 0\.3 s ago; still running: worker rank 1 )"
                                           R"(\(local_rank 1, pid ([0-9]+)\)\n)")))
      << r.err;
  EXPECT_TRUE(Contains(r.err, "ranks 0, 2 exited 0, the first 0.6 s ago; still running: worker rank 1 ")) << r.err;
  EXPECT_TRUE(Contains(r.err, "reached --max-run-time (4 s); ranks still running: 1")) << r.err;
  const std::vector<pid_t> pids = ReadPids(d / "pids");
  EXPECT_NE(std::find(pids.begin(), pids.end(), std::stoi(m[1])), pids.end()) << "the notice names rank 1's pid";
  const std::string events = ReadFileOr(d / "events.jsonl");
  EXPECT_TRUE(std::regex_search(events, std::regex(R"("event":"late_exit".*"after_s":0\.3,"attempt":0,)"
                                                   R"("finished_ranks":\[0,2\],"running_ranks":\[1\])")))
      << events;
}

TEST(HealthE2E, LateExitNoticeZeroSaysNothing) {
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2", "--late-exit-notice=0", "--max-run-time=1"},
                            {"--only-rank", "1", "--hang"}),
                      {}, 30s);
  EXPECT_EQ(r.exit_code, 124) << r.err;
  EXPECT_FALSE(Contains(r.err, "exited 0")) << r.err;
}

}  // namespace
}  // namespace ctrun::testing
