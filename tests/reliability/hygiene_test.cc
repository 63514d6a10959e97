// Hygiene after jobs that fail, restart and get killed: no process of the job left (found by the
// environment marker across /proc), no zombie under ctrun, no fd leaked by ctrun over 50 restarts,
// no temporary file besides the log directory, and a complete log directory.
#include <signal.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "helpers/ctrun_command.h"
#include "helpers/test_util.h"
#include "reliability/hygiene.h"

namespace ctrun::reliability {
namespace {

using namespace std::chrono_literals;
using ctrun::testing::BackgroundProcess;
using ctrun::testing::Ctrun;
using ctrun::testing::ReadEnvFile;
using ctrun::testing::ReadFileOr;
using ctrun::testing::ReadPids;
using ctrun::testing::RunCommand;
using ctrun::testing::RunResult;
using ctrun::testing::TempDir;
using ctrun::testing::WaitFor;
using ctrun::testing::ProcessAlive;

// Every rank's env file shows restart count `attempt` (the workers of that attempt all started).
bool AllStarted(const TempDir& dir, int nproc, int attempt) {
  for (int r = 0; r < nproc; ++r) {
    if (ReadEnvFile(dir / ("env." + std::to_string(r)))["TORCHELASTIC_RESTART_COUNT"] != std::to_string(attempt))
      return false;
  }
  return true;
}

// What ctrun's fds point at, as a multiset ("pipe" x 9, ...): fd numbers differ from one attempt to
// the next, the kinds and counts must not.
std::multiset<std::string> Targets(const std::set<std::string>& fds) {
  std::multiset<std::string> out;
  for (const auto& f : fds) out.insert(f.substr(f.find(" -> ") + 4));
  return out;
}

// ctrun's fds once they stop changing (exec-confirmation pipes of just-started workers close
// within milliseconds): two equal samples 100 ms apart, within 5 s.
std::set<std::string> SteadyFds(pid_t pid) {
  std::set<std::string> prev = OpenFds(pid), cur;
  WaitFor(
      [&] {
        std::this_thread::sleep_for(100ms);
        cur = OpenFds(pid);
        const bool same = cur == prev;
        prev = cur;
        return same;
      },
      5s);
  return cur;
}

std::string Diff(const std::set<std::string>& a, const std::set<std::string>& b) {
  std::string out;
  for (const auto& x : a)
    if (!b.count(x)) out += " -" + x;
  for (const auto& x : b)
    if (!a.count(x)) out += " +" + x;
  return out;
}

// The one log directory ctrun made under TMPDIR (torchelastic_XXXXXX/<run>_XXXXXX), or "".
std::string RunDirUnder(const std::string& tmpdir) {
  for (const std::string& base : DirEntries(tmpdir)) {
    if (base.rfind("torchelastic_", 0) != 0) continue;
    for (const std::string& run : DirEntries(tmpdir + "/" + base)) return tmpdir + "/" + base + "/" + run;
  }
  return "";
}

// What ctrun left in TMPDIR besides its log directory and the test's own files.
std::vector<std::string> StrayTempFiles(const std::string& tmpdir, const std::set<std::string>& ours) {
  std::vector<std::string> out;
  int log_dirs = 0;
  for (const std::string& e : DirEntries(tmpdir)) {
    if (ours.count(e)) continue;
    if (e.rfind("torchelastic_", 0) == 0 && ++log_dirs == 1) continue;
    out.push_back(e);
  }
  return out;
}

TEST(Hygiene, FiftyRestartsLeakNoFdNoZombieNoProcessNoFile) {
  TempDir dir;
  const std::string tmpdir = dir / "tmp";
  ::mkdir(tmpdir.c_str(), 0700);
  const std::string marker = NewJobMarker();
  constexpr int kNproc = 4, kRestarts = 50;
  // Rank 1 fails in attempts 0..49 (after `go` exists); attempt 50 hangs until ctrun is stopped.
  BackgroundProcess job(Ctrun({"--standalone", "--nproc_per_node=4", "--max_restarts=100", "--shutdown-timeout=5"},
                              {"--env-file", dir / "env", "--pid-file", dir / "pids", "--grandchildren", "1",
                               "--wait-file", dir / "go", "--only-rank", "1", "--exit", "1", "--attempts-below",
                               std::to_string(kRestarts), "--else-hang"}),
                        {MarkerEnv(marker), "TMPDIR=" + tmpdir}, dir / "out", dir / "err");
  ASSERT_TRUE(WaitFor([&] { return AllStarted(dir, kNproc, 0); }, 20s)) << ReadFileOr(dir / "err");
  const std::set<std::string> fds_at_start = SteadyFds(job.pid());
  const long rss_at_start = RssKib(job.pid());
  std::ofstream(dir / "go").put('1');
  ASSERT_TRUE(WaitFor([&] { return AllStarted(dir, kNproc, kRestarts); }, 90s)) << ReadFileOr(dir / "err");
  // Attempt 50 is steady (every rank hangs): ctrun's fds must be the ones it had in attempt 0.
  const std::set<std::string> fds_after = SteadyFds(job.pid());
  EXPECT_EQ(Targets(fds_after), Targets(fds_at_start)) << "ctrun's fds changed over " << kRestarts << " restarts:"
                                     << Diff(fds_at_start, fds_after);
  EXPECT_EQ(ZombieChildren(job.pid()), std::vector<pid_t>{});
  const long rss_after = RssKib(job.pid());
  // ctrun, its watchdog, and this attempt's 4 workers + 4 grandchildren: earlier attempts' are gone.
  EXPECT_EQ(ProcessesOfJob(marker).size(), 2u + 2 * kNproc) << Describe(ProcessesOfJob(marker));
  job.Signal(SIGTERM);
  EXPECT_EQ(job.Wait(30s), 128 + SIGTERM) << ReadFileOr(dir / "err");
  const auto left = WaitJobGone(marker);
  EXPECT_EQ(left, std::vector<pid_t>{}) << Describe(left);
  // Every worker and grandchild any attempt recorded is gone (the marker scan above covers the ones
  // that died before recording their pid).
  for (pid_t p : ReadPids(dir / "pids")) EXPECT_FALSE(ctrun::testing::ProcessAlive(p)) << p;
  EXPECT_EQ(StrayTempFiles(tmpdir, {}), std::vector<std::string>{});
  const LogDirCheck logs = CheckLogDir(RunDirUnder(tmpdir), kNproc, /*redirected=*/false);
  EXPECT_EQ(logs.attempts, kRestarts + 1);
  EXPECT_EQ(logs.missing, std::vector<std::string>{});
  std::printf("[reliability] hygiene: %d restarts, ctrun fds %zu -> %zu (leaked %zu), RSS %ld -> %ld KiB, "
              "processes left %zu\n",
              kRestarts, fds_at_start.size(), fds_after.size(),
              fds_after.size() > fds_at_start.size() ? fds_after.size() - fds_at_start.size() : 0, rss_at_start,
              rss_after, left.size());
}

TEST(Hygiene, RedirectedFailingJobLeavesACompleteLogDirAndNothingElse) {
  TempDir dir;
  const std::string marker = NewJobMarker();
  RunResult r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=3", "--max_restarts=2", "--log_dir", dir / "logs", "--redirects=3",
                                  "--rdzv_id=hyg"},
                                 {"--print", "5", "--stderr", "oops", "--grandchildren", "2", "--only-rank", "2",
                                  "--exit", "7"}),
                           {MarkerEnv(marker), "TMPDIR=" + dir.path()}, 60s);
  EXPECT_EQ(r.exit_code, 7) << r.err;
  EXPECT_EQ(WaitJobGone(marker), std::vector<pid_t>{}) << Describe(ProcessesOfJob(marker));
  EXPECT_EQ(StrayTempFiles(dir.path(), {"logs"}), std::vector<std::string>{});
  const auto runs = DirEntries(dir / "logs");
  ASSERT_EQ(runs.size(), 1u);
  const std::string run = dir / ("logs/" + *runs.begin());
  const LogDirCheck logs = CheckLogDir(run, 3, /*redirected=*/true);
  EXPECT_EQ(logs.attempts, 3);
  EXPECT_EQ(logs.missing, std::vector<std::string>{});
  EXPECT_EQ(logs.unexpected, std::vector<std::string>{});
  // The failing rank printed everything before it exited: all of it is in every attempt's files
  // (the others may be stopped before they print).
  for (int a = 0; a < 3; ++a) {
    const std::string rank2 = run + "/attempt_" + std::to_string(a) + "/2/";
    EXPECT_NE(ReadFileOr(rank2 + "stdout.log").find("rank 2 line 4"), std::string::npos) << "attempt " << a;
    EXPECT_EQ(ReadFileOr(rank2 + "stderr.log"), "oops\n") << "attempt " << a;
  }
}

// The next attempt's directories are made ahead while an attempt runs (logs/log_dir.h): a restart
// renames them into place, and a run that ends with restarts to spare leaves no such tree behind,
// whether it succeeded or was stopped.
TEST(Hygiene, ARunWithRestartsToSpareLeavesOnlyTheAttemptsThatRan) {
  for (const bool stopped : {false, true}) {
    SCOPED_TRACE(stopped ? "stopped by SIGTERM" : "succeeded");
    TempDir dir;
    const std::string marker = NewJobMarker();
    std::vector<std::string> worker = {"--only-rank", "1", "--only-attempt", "0", "--error-file", "boom", "--exit", "3"};
    if (stopped) worker = {"--env-file", dir / "env", "--only-rank", "1", "--only-attempt", "0", "--error-file", "boom",
                           "--exit", "3", "--else-hang"};
    BackgroundProcess job(Ctrun({"--standalone", "--nproc_per_node=3", "--max_restarts=5", "--log_dir", dir / "logs"}, worker),
                          {MarkerEnv(marker)}, dir / "out", dir / "err");
    if (stopped) {
      ASSERT_TRUE(WaitFor([&] { return AllStarted(dir, 3, 1); }, 20s)) << ReadFileOr(dir / "err");
      job.Signal(SIGTERM);
    }
    const int code = job.Wait(60s);
    EXPECT_EQ(code, stopped ? 128 + SIGTERM : 0) << ReadFileOr(dir / "err");
    EXPECT_EQ(WaitJobGone(marker), std::vector<pid_t>{}) << Describe(ProcessesOfJob(marker));
    const auto runs = DirEntries(dir / "logs");
    ASSERT_EQ(runs.size(), 1u);
    const std::string run = dir / ("logs/" + *runs.begin());
    const LogDirCheck logs = CheckLogDir(run, 3, /*redirected=*/false);
    EXPECT_EQ(logs.attempts, 2);
    EXPECT_EQ(logs.missing, std::vector<std::string>{});
    EXPECT_EQ(logs.unexpected, std::vector<std::string>{});
    EXPECT_NE(ReadFileOr(run + "/attempt_0/1/error.json").find("boom"), std::string::npos);
  }
}

TEST(Hygiene, SigkillOfCtrunLeavesNoProcessOfTheJob) {
  TempDir dir;
  const std::string marker = NewJobMarker();
  BackgroundProcess job(Ctrun({"--standalone", "--nproc_per_node=3"}, {"--env-file", dir / "env", "--grandchildren", "2", "--hang"}),
                        {MarkerEnv(marker), "TMPDIR=" + dir.path()}, dir / "out", dir / "err");
  ASSERT_TRUE(WaitFor([&] { return AllStarted(dir, 3, 0); }, 20s)) << ReadFileOr(dir / "err");
  ASSERT_TRUE(WaitFor([&] { return ProcessesOfJob(marker).size() >= 1 + 3 * 3; }, 10s));
  const std::string before = Describe(ProcessesOfJob(marker));
  job.Signal(SIGKILL);
  EXPECT_EQ(job.Wait(10s), 128 + SIGKILL);
  const auto left = WaitJobGone(marker);
  EXPECT_EQ(left, std::vector<pid_t>{}) << Describe(left) << "\nbefore: " << before << "\n" << ReadFileOr(dir / "err");
}

// The watchdog either way it starts (process/watchdog.h): the ct-watchdog program, which reaches
// the cleanup by exec'ing ctrun, or a fork of ctrun (CTRUN_WATCHDOG_HELPER="", as where the
// program is missing). Its environment entries, and whether ctrun's debug log must say it forked.
struct WatchdogWay {
  std::vector<std::string> env;
  bool forked;
};
void PrintTo(const WatchdogWay& way, std::ostream* os) { *os << (way.forked ? "forked" : "the ct-watchdog program"); }
class HygieneWatchdog : public ::testing::TestWithParam<WatchdogWay> {
 protected:
  // Checks that the job ran with the watchdog this test is about (ctrun run with --log-level=debug).
  void ExpectWatchdogWay(const std::string& log) {
    EXPECT_EQ(log.find("the watchdog is a fork of ctrun") != std::string::npos, GetParam().forked) << log;
  }
};
INSTANTIATE_TEST_SUITE_P(Ways, HygieneWatchdog,
                         ::testing::Values(WatchdogWay{{}, false}, WatchdogWay{{"CTRUN_WATCHDOG_HELPER="}, true}),
                         [](const ::testing::TestParamInfo<WatchdogWay>& p) { return p.param.forked ? "Forked" : "Program"; });

// A SIGKILLed ctrun cannot drop the next attempt's directories it made ahead: its watchdog does,
// so the run directory it leaves holds the attempts that ran, as after any other ending.
TEST_P(HygieneWatchdog, SigkillOfCtrunLeavesNoTreeMadeAhead) {
  TempDir dir;
  const std::string marker = NewJobMarker();
  std::vector<std::string> env = GetParam().env;
  env.push_back(MarkerEnv(marker));
  BackgroundProcess job(Ctrun({"--standalone", "--nproc_per_node=3", "--max_restarts=3", "--log_dir", dir / "logs",
                               "--log-level=debug"},
                              {"--env-file", dir / "env", "--hang"}),
                        env, dir / "out", dir / "err");
  ASSERT_TRUE(WaitFor([&] { return AllStarted(dir, 3, 0); }, 20s)) << ReadFileOr(dir / "err");
  ExpectWatchdogWay(ReadFileOr(dir / "err"));
  const auto runs = DirEntries(dir / "logs");
  ASSERT_EQ(runs.size(), 1u);
  const std::string run = dir / ("logs/" + *runs.begin());
  // Rank directories are made in order: the last one means the tree made ahead is complete.
  ASSERT_TRUE(WaitFor([&] { return std::filesystem::is_directory(run + "/.attempt_1/2"); }, 10s));
  job.Signal(SIGKILL);
  EXPECT_EQ(job.Wait(10s), 128 + SIGKILL);
  EXPECT_EQ(WaitJobGone(marker), std::vector<pid_t>{}) << Describe(ProcessesOfJob(marker));
  EXPECT_TRUE(WaitFor([&] { return !std::filesystem::exists(run + "/.attempt_1"); }, 10s)) << run << "/.attempt_1 is left";
  const LogDirCheck logs = CheckLogDir(run, 3, /*redirected=*/false);
  EXPECT_EQ(logs.attempts, 1);
  EXPECT_EQ(logs.missing, std::vector<std::string>{});
  EXPECT_EQ(logs.unexpected, std::vector<std::string>{});
}

// With a cgroup for the workers, the watchdog of a SIGKILLed ctrun also kills what left the
// workers' process groups (a setsid daemon) and removes the cgroup: no ctrun-<pid> is left behind
// for a later ctrun of the same pid to find.
TEST_P(HygieneWatchdog, SigkillOfCtrunAlsoKillsDetachedDescendantsAndRemovesTheCgroup) {
  if (::geteuid() != 0) GTEST_SKIP() << "not root: no cgroup for the workers";
  TempDir dir;
  const std::string marker = NewJobMarker();
  std::vector<std::string> env = GetParam().env;
  env.push_back(MarkerEnv(marker));
  env.push_back("TMPDIR=" + dir.path());
  BackgroundProcess job(Ctrun({"--standalone", "--nproc_per_node=2", "--log-level=debug"},
                              {"--env-file", dir / "env", "--detached-grandchild", "--hang"}),
                        env, dir / "out", dir / "err");
  ASSERT_TRUE(WaitFor([&] { return AllStarted(dir, 2, 0); }, 20s)) << ReadFileOr(dir / "err");
  ExpectWatchdogWay(ReadFileOr(dir / "err"));
  ASSERT_TRUE(WaitFor([&] { return ProcessesOfJob(marker).size() >= 1 + 2 * 2; }, 10s));
  const std::string cgroup = ctrun::testing::WorkersCgroupFromLog(ReadFileOr(dir / "err"));
  if (cgroup.empty()) {
    job.Signal(SIGKILL);
    job.Wait(10s);
    WaitJobGone(marker);
    GTEST_SKIP() << "no cgroup for the workers here: " << ReadFileOr(dir / "err");
  }
  ASSERT_TRUE(std::filesystem::is_directory(cgroup)) << cgroup;
  job.Signal(SIGKILL);
  EXPECT_EQ(job.Wait(10s), 128 + SIGKILL);
  const auto left = WaitJobGone(marker);
  EXPECT_EQ(left, std::vector<pid_t>{}) << Describe(left) << "\n" << ReadFileOr(dir / "err");
  EXPECT_TRUE(WaitFor([&] { return !std::filesystem::exists(cgroup); }, 10s)) << cgroup << " is left";
}

// A ctrun SIGKILLed together with its watchdog (`pkill -9` of both, an OOM kill of the whole
// session) leaves its empty ctrun-<pid> behind. The next ctrun removes those of dead pids once its
// first workers started, and leaves alone one whose pid lives, one made in the last seconds (a
// new ctrun that took a dead one's pid) and anything that is not a ctrun worker cgroup.
TEST(Hygiene, TheNextCtrunRemovesEmptyWorkerCgroupsThatDeadCtrunsLeft) {
  if (::geteuid() != 0) GTEST_SKIP() << "not root: no cgroup for the workers";
  TempDir dir;
  RunResult first = RunCommand(Ctrun({"--standalone", "--nproc_per_node=1", "--log-level=debug"}, {}), {}, 30s);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const std::string cgroup = ctrun::testing::WorkersCgroupFromLog(first.err);
  if (cgroup.empty()) GTEST_SKIP() << "no cgroup for the workers here: " << first.err;
  const std::string parent = std::filesystem::path(cgroup).parent_path().string();
  pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);
  const std::string stale = parent + "/ctrun-" + std::to_string(dead);
  const std::string alive = parent + "/ctrun-" + std::to_string(::getpid());
  const std::string other = parent + "/ctrun-" + std::to_string(dead) + "-ns1";
  const std::string fresh_dead = parent + "/ctrun-" + std::to_string(dead) + "0";  // a pid not alive either
  const auto old = [](const std::string& d) {
    const timespec times[2] = {{1577836800, 0}, {1577836800, 0}};  // 2020-01-01
    return ::utimensat(AT_FDCWD, d.c_str(), times, 0) == 0;
  };
  for (const auto& d : {stale, stale + "/rank-0", alive, other})
    ASSERT_EQ(::mkdir(d.c_str(), 0755), 0) << d << ": " << std::strerror(errno);
  ASSERT_TRUE(old(stale) && old(alive) && old(other)) << std::strerror(errno);
  const bool made_fresh = ::kill(dead * 10, 0) != 0 && ::mkdir(fresh_dead.c_str(), 0755) == 0;
  RunResult r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=1"}, {"--sleep-ms", "10"}), {}, 30s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(WaitFor([&] { return !std::filesystem::exists(stale); }, 10s)) << stale << " is left";
  EXPECT_TRUE(std::filesystem::exists(alive)) << "removed the cgroup of a live pid";
  EXPECT_TRUE(std::filesystem::exists(other)) << "removed the cgroup of another PID namespace";
  if (made_fresh) {
    EXPECT_TRUE(std::filesystem::exists(fresh_dead)) << "removed a cgroup made a moment ago";
  }
  for (const auto& d : {stale + "/rank-0", stale, alive, other, fresh_dead}) ::rmdir(d.c_str());
}

// `pkill -9 ctrun` SIGKILLs every process whose name contains "ctrun": the watchdog must not be
// one of them, or nothing kills the workers' children (they ran on).
TEST_P(HygieneWatchdog, PkillOfCtrunByNameLeavesTheWatchdogToKillTheGrandchildren) {
  TempDir dir;
  BackgroundProcess job(Ctrun({"--standalone", "--nproc_per_node=2", "--log-level=debug"},
                              {"--pid-file", dir / "pids", "--grandchildren", "2", "--hang"}),
                        GetParam().env, dir / "out", dir / "err");
  ASSERT_TRUE(WaitFor([&] { return ReadPids(dir / "pids").size() == 6; }, 20s)) << ReadFileOr(dir / "err");
  ExpectWatchdogWay(ReadFileOr(dir / "err"));
  const std::vector<pid_t> job_pids = ReadPids(dir / "pids");
  // A forked watchdog takes its name a moment after the fork, with no word to ctrun.
  ASSERT_TRUE(WaitFor([&] { return ctrun::testing::WatchdogBelow(job.pid()) != 0; }, 10s));
  // pkill signals in pid order, ctrun first; the watchdog, woken by ctrun's death, often wins
  // that race. The other order (the watchdog first) is the one that must not matter either.
  // (The fake worker's own name has "ctrun" in it too; a real worker's would not: spared.)
  std::vector<pid_t> named;
  for (pid_t p : ctrun::testing::LiveDescendants(job.pid()))
    if (std::find(job_pids.begin(), job_pids.end(), p) == job_pids.end() &&
        ReadFileOr("/proc/" + std::to_string(p) + "/comm").find("ctrun") != std::string::npos)
      named.push_back(p);
  named.push_back(job.pid());
  for (pid_t p : named) ::kill(p, SIGKILL);
  job.Wait(10s);
  EXPECT_TRUE(WaitFor([&] {
    for (pid_t p : job_pids)
      if (ProcessAlive(p)) return false;
    return true;
  }, 10s)) << "killed by name: " << named.size() << " process(es); the job's processes ran on";
}

// In a PID namespace without its own /proc (unshare --pid --fork, no --mount-proc), /proc/<n> is
// another process than pid n: without a cgroup ctrun cannot find what the workers leave behind.
// It says so once, at the start, and reads no wrong tree; the job runs as usual.
TEST(Hygiene, APidNamespaceWithoutItsOwnProcIsSaid) {
  if (::geteuid() != 0 || ::access("/usr/bin/unshare", X_OK) != 0) GTEST_SKIP() << "needs root and unshare";
  if (RunCommand({"/usr/bin/unshare", "--pid", "--fork", "/bin/true"}, {}, 10s).exit_code != 0)
    GTEST_SKIP() << "cannot make a PID namespace here";
  std::vector<std::string> argv{"/usr/bin/unshare", "--pid", "--fork"};
  for (const auto& a : Ctrun({"--standalone", "--nproc_per_node=2"}, {"--sleep-ms", "10"})) argv.push_back(a);
  RunResult r = RunCommand(argv, {"CTRUN_NO_CGROUP=1"}, 30s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ctrun::testing::CountOf(r.err, "/proc shows another PID namespace than ctrun's"), 1) << r.err;
}

// Two ctruns as pid 1 of two PID namespaces under one parent cgroup: each gets a workers'
// cgroup of its own (both were ctrun-1; the second removed the first one's as stale, between two
// of its attempts, and took it).
TEST(Hygiene, CtrunsOfTwoPidNamespacesNeverShareAWorkersCgroup) {
  if (::geteuid() != 0 || ::access("/usr/bin/unshare", X_OK) != 0) GTEST_SKIP() << "needs root and unshare";
  if (RunCommand({"/usr/bin/unshare", "--pid", "--fork", "--mount-proc", "/bin/true"}, {}, 10s).exit_code != 0)
    GTEST_SKIP() << "cannot make a PID namespace here";
  TempDir dir;
  auto in_namespace = [&](const std::string& wait_file) {
    std::vector<std::string> argv{"/usr/bin/unshare", "--pid", "--fork", "--mount-proc"};
    for (const auto& a : Ctrun({"--standalone", "--nproc_per_node=1", "--log-level=debug"}, {"--wait-file", wait_file}))
      argv.push_back(a);
    return argv;
  };
  BackgroundProcess a(in_namespace(dir / "go"), {}, dir / "a.out", dir / "a.err");
  ASSERT_TRUE(WaitFor([&] { return !ctrun::testing::WorkersCgroupFromLog(ReadFileOr(dir / "a.err")).empty(); }, 20s))
      << ReadFileOr(dir / "a.err");
  BackgroundProcess b(in_namespace(dir / "go"), {}, dir / "b.out", dir / "b.err");
  ASSERT_TRUE(WaitFor([&] { return !ctrun::testing::WorkersCgroupFromLog(ReadFileOr(dir / "b.err")).empty(); }, 20s))
      << ReadFileOr(dir / "b.err");
  const std::string cga = ctrun::testing::WorkersCgroupFromLog(ReadFileOr(dir / "a.err"));
  const std::string cgb = ctrun::testing::WorkersCgroupFromLog(ReadFileOr(dir / "b.err"));
  std::ofstream(dir / "go").put('x');
  EXPECT_EQ(a.Wait(20s), 0) << ReadFileOr(dir / "a.err");
  EXPECT_EQ(b.Wait(20s), 0) << ReadFileOr(dir / "b.err");
  EXPECT_NE(cga, cgb);
}

// A descendant that leaves the workers' cgroup (setsid, then a cgroup of its own; here the test
// moves it, as root) is still ctrun's descendant: the end of the attempt kills it too.
TEST(Hygiene, ADescendantThatLeftTheWorkersCgroupIsKilledAtTheEnd) {
  if (::geteuid() != 0) GTEST_SKIP() << "not root: no cgroup for the workers";
  TempDir dir;
  BackgroundProcess job(Ctrun({"--standalone", "--nproc_per_node=1", "--log-level=debug"},
                              {"--pid-file", dir / "pids", "--detached-grandchild", "--wait-file", dir / "go"}),
                        {}, dir / "out", dir / "err");
  ASSERT_TRUE(WaitFor([&] { return ReadPids(dir / "pids").size() == 2; }, 20s)) << ReadFileOr(dir / "err");
  const pid_t escaped = ReadPids(dir / "pids")[1];
  const std::string cgroup = ctrun::testing::WorkersCgroupFromLog(ReadFileOr(dir / "err"));
  const std::string elsewhere =
      std::filesystem::path(cgroup).parent_path().string() + "/ctrun-test-escape-" + std::to_string(::getpid());
  std::error_code ec;
  const bool moved = !cgroup.empty() && std::filesystem::create_directory(elsewhere, ec) &&
                     (std::ofstream(elsewhere + "/cgroup.procs") << escaped << "\n").flush().good() &&
                     ReadFileOr(elsewhere + "/cgroup.procs").find(std::to_string(escaped)) != std::string::npos;
  std::ofstream(dir / "go").put('x');
  EXPECT_EQ(job.Wait(20s), 0) << ReadFileOr(dir / "err");
  const bool gone = WaitFor([&] { return !ProcessAlive(escaped); }, 5s);
  if (!gone) ::kill(escaped, SIGKILL);
  WaitFor([&] { return ::rmdir(elsewhere.c_str()) == 0 || errno == ENOENT; }, 5s);
  if (!moved) GTEST_SKIP() << "cannot move a process to " << elsewhere << " here";
  EXPECT_TRUE(gone) << "pid " << escaped << " left the workers' cgroup and outlived the job";
  EXPECT_NE(ReadFileOr(dir / "err").find("killed 1 process(es) the workers left running"), std::string::npos)
      << ReadFileOr(dir / "err");
}

}  // namespace
}  // namespace ctrun::reliability
