// End-to-end tests of the real ctrun binary against ctrun_fake_worker: every wait polls against a
// deadline; nothing sleeps and hopes.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "helpers/ctrun_command.h"
#include "helpers/free_port.h"
#include "helpers/test_util.h"

namespace ctrun::testing {
namespace {

using namespace std::chrono_literals;


std::string EnvValue(const std::string& env_dump, const std::string& key) {
  for (const auto& l : SplitLines(env_dump))
    if (l.rfind(key + "=", 0) == 0) return l.substr(key.size() + 1);
  return "<unset>";
}

bool AllDead(const std::vector<pid_t>& pids) {
  for (pid_t p : pids)
    if (ProcessAlive(p)) return false;
  return true;
}

TEST(CtrunE2E, SetsTorchrunEnvironmentPerRankAndPassesInheritedEnv) {
  TempDir d;
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=4", "--max_restarts=2", "--rdzv_id=job7"},
                     {"--env-file", d / "env"}),
               {"TEST_SENTINEL_PARENT=sentinel"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::set<std::string> ports;
  for (int i = 0; i < 4; ++i) {
    std::string env = ReadFileOr(d / ("env." + std::to_string(i)));
    ASSERT_FALSE(env.empty()) << "rank " << i;
    EXPECT_EQ(EnvValue(env, "RANK"), std::to_string(i));
    EXPECT_EQ(EnvValue(env, "LOCAL_RANK"), std::to_string(i));
    EXPECT_EQ(EnvValue(env, "WORLD_SIZE"), "4");
    EXPECT_EQ(EnvValue(env, "LOCAL_WORLD_SIZE"), "4");
    EXPECT_EQ(EnvValue(env, "GROUP_RANK"), "0");
    EXPECT_EQ(EnvValue(env, "GROUP_WORLD_SIZE"), "1");
    EXPECT_EQ(EnvValue(env, "ROLE_RANK"), std::to_string(i));
    EXPECT_EQ(EnvValue(env, "ROLE_NAME"), "default");
    EXPECT_EQ(EnvValue(env, "ROLE_WORLD_SIZE"), "4");
    EXPECT_EQ(EnvValue(env, "MASTER_ADDR"), "127.0.0.1");
    EXPECT_EQ(EnvValue(env, "TORCHELASTIC_RESTART_COUNT"), "0");
    EXPECT_EQ(EnvValue(env, "TORCHELASTIC_MAX_RESTARTS"), "2");
    EXPECT_EQ(EnvValue(env, "TORCHELASTIC_RUN_ID"), "job7");
    EXPECT_NE(EnvValue(env, "TORCHELASTIC_USE_AGENT_STORE"), "<unset>");
    EXPECT_NE(EnvValue(env, "TORCHELASTIC_ERROR_FILE").find("/" + std::to_string(i) + "/error.json"), std::string::npos);
    EXPECT_EQ(EnvValue(env, "OMP_NUM_THREADS"), "1");
    EXPECT_EQ(EnvValue(env, "TORCH_NCCL_ASYNC_ERROR_HANDLING"), "1");
    EXPECT_EQ(EnvValue(env, "TEST_SENTINEL_PARENT"), "sentinel");
    ports.insert(EnvValue(env, "MASTER_PORT"));
  }
  EXPECT_EQ(ports.size(), 1u);
  EXPECT_GT(std::stoi(*ports.begin()), 0);
}

// A templated `--rdzv_id=$JOB_ID` with the variable unset, and `--role=`: torchrun runs them (a
// random run id with a warning; ROLE_NAME=""), so does ctrun on one node. Across nodes each would
// take a random id of its own and never meet: refused before anything starts.
TEST(CtrunE2E, AnEmptyRunIdIsARandomOneOnOneNodeAndAnEmptyRoleIsKept) {
  TempDir d;
  auto r = RunCommand(Ctrun({"--nproc_per_node=1", "--rdzv_id=", "--role="}, {"--env-file", d / "env"}), {});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string env = ReadFileOr(d / "env.0");
  const std::string id = EnvValue(env, "TORCHELASTIC_RUN_ID");
  // torchrun's str(uuid.uuid4())
  EXPECT_TRUE(std::regex_match(id, std::regex("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"))) << id;
  EXPECT_EQ(EnvValue(env, "ROLE_NAME"), "");
  EXPECT_EQ(ctrun::testing::CountOf(r.err, "--rdzv_id is empty: the run id is the random " + id), 1) << r.err;
  auto multi = RunCommand(Ctrun({"--nnodes=2", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:1", "--rdzv_id=",
                                 "--nproc_per_node=1"},
                                {"--env-file", d / "never"}),
                          {}, std::chrono::seconds(20));
  EXPECT_EQ(multi.exit_code, 2) << multi.err;
  EXPECT_NE(multi.err.find("--rdzv_id is empty: every node would take a random run id of its own"), std::string::npos)
      << multi.err;
  EXPECT_FALSE(std::filesystem::exists(d / "never.0"));
  // The same for a job whose nodes come from Slurm's step (no node flags given).
  auto slurm = RunCommand(Ctrun({"--nproc_per_node=1", "--rdzv_id="}, {"--env-file", d / "never"}),
                          {"SLURM_JOB_ID=1", "SLURM_STEP_NODELIST=vm,vm2", "SLURM_NODEID=0", "SLURM_STEP_NUM_NODES=2",
                           "SLURM_STEP_NUM_TASKS=2"},
                          std::chrono::seconds(20));
  EXPECT_EQ(slurm.exit_code, 2) << slurm.err;
  EXPECT_NE(slurm.err.find("--rdzv_id is empty: every node would take a random run id of its own"), std::string::npos)
      << slurm.err;
  EXPECT_FALSE(std::filesystem::exists(d / "never.0"));
}

TEST(CtrunE2E, HeartbeatVariablesReachWorkers) {
  // The agent side of hang detection is a later issue; today the contract is that ctrun passes the
  // worker library's variables through and the library beats into them.
  TempDir d;
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=1"}, {"--heartbeat", "5"}),
                      {"CTRUN_HEARTBEAT_FILE=" + (d / "hb")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string rec = ReadFileOr(d / "hb");
  ASSERT_EQ(rec.size(), 42u) << rec;
  EXPECT_EQ(std::stoull(rec.substr(0, 20)), 5u) << rec;
}

TEST(CtrunE2E, NoExtraFdsInWorkers) {
  TempDir d;
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2"}, {"--fd-file", d / "fds"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (int i = 0; i < 2; ++i) {
    auto lines = SplitLines(ReadFileOr(d / ("fds." + std::to_string(i))));
    std::set<int> fds;
    for (const auto& l : lines) fds.insert(std::stoi(l));
    EXPECT_EQ(fds, (std::set<int>{0, 1, 2})) << ReadFileOr(d / ("fds." + std::to_string(i)));
  }
}

TEST(CtrunE2E, ManyWorkersUnderALowFdLimitAndWorkersGetTheUsersLimitBack) {
  TempDir d;
  // 100 workers need ~300 fds in ctrun (pidfd + 2 pipes each): more than a 256 soft limit.
  std::string script = "ulimit -Sn 256 && exec " + std::string(CTRUN_BINARY) +
                       " --standalone --nproc_per_node=100 /bin/sh -c 'ulimit -Sn > " + d.path() + "/lim.$RANK'";
  auto r = RunCommand({"/bin/sh", "-c", script});
  ASSERT_EQ(r.exit_code, 0) << r.err.substr(0, 2000);
  for (int i : {0, 57, 99}) EXPECT_EQ(ReadFileOr(d / ("lim." + std::to_string(i))), "256\n") << i;
}

TEST(CtrunE2E, RestartsAfterFailureWithIncrementedRestartCount) {
  TempDir d;
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=3", "--max_restarts=2"},
                     {"--env-file", d / "env", "--only-rank", "1", "--only-attempt", "0", "--exit", "5"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(EnvValue(ReadFileOr(d / ("env." + std::to_string(i))), "TORCHELASTIC_RESTART_COUNT"), "1");
  EXPECT_NE(r.err.find("restarting all workers (restart 1 of 2)"), std::string::npos) << r.err;
}

// torchrun names its own interpreter's job by the script: `--no_python /usr/bin/python3 fail.py`
// is titled "fail.py FAILED", not with the interpreter.
TEST(CtrunE2E, APythonInterpreterGivenWithNoPythonIsTitledByItsScript) {
  if (::access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/python3";
  TempDir d;
  {
    std::ofstream(d / "fail.py") << "import sys\nsys.exit(3)\n";
  }
  auto r = RunCommand({CTRUN_BINARY, "--nproc_per_node=1", "--no_python", "/usr/bin/python3", "-B", d / "fail.py"}, {});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_NE(r.err.find("\n" + (d / "fail.py") + " FAILED\n"), std::string::npos) << r.err;
}

TEST(CtrunE2E, MaxRestartsExhaustedPrintsSummaryAndRootCauseExitCode) {
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2", "--max_restarts=1"},
                     {"--only-rank", "1", "--exit", "7", "--stderr", "something broke"}));
  EXPECT_EQ(r.exit_code, 7) << r.err;
  // Titled with the entrypoint as given (here a full path), as torchrun titles it.
  EXPECT_NE(r.err.find("\n" + std::string(FAKE_WORKER) + " FAILED\n"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Root Cause (first observed failure):"), std::string::npos);
  EXPECT_NE(r.err.find("exitcode  : 7"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank      : 1 (local_rank: 1)"), std::string::npos) << r.err;
}

// Rank 0 dies of SIGPIPE at once (it wrote to a peer that went away); rank 1, the peer, is still
// unwinding and writes its error file 300 ms later. It ends on its own and is the root cause.
// ("$$$$": worker arguments go through string.Template as in torchrun, where "$$" is one '$'.)
TEST(CtrunE2E, ARankThatLostAPeerDoesNotHideThePeerThatCrashed) {
  const std::string script = std::string("[ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] || exit 0; "
                                         "if [ \"$RANK\" = 0 ]; then kill -PIPE $$$$; fi; exec ") +
                             FAKE_WORKER + " --sleep-ms 300 --error-file 'crashed at step 14' --exit 3";
  auto r = RunCommand({CTRUN_BINARY, "--standalone", "--nproc_per_node=2", "--max_restarts=1", "/bin/sh", "-c",
                       script});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("killed by signal 13 (SIGPIPE) after losing a peer; waiting up to 1.0 s"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("attempt 0 failed; root cause: worker rank 1 (local_rank 1, pid "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(") exited with code 3: RuntimeError: crashed at step 14"), std::string::npos) << r.err;
}

// The same with scripts that write no error file (no @record): rank 0's traceback ends in gloo's
// "Connection closed by peer" at once; rank 1, the peer, fails with its own error 300 ms later.
// Rank 0's last stderr line says it lost a peer: ctrun waits, and names rank 1.
TEST(CtrunE2E, ATracebackThatLostAPeerDoesNotHideThePeerThatCrashed) {
  const std::string script = std::string("[ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] || exit 0; "
                                         "if [ \"$RANK\" = 0 ]; then echo 'Traceback (most recent call last):' >&2; "
                                         "echo 'RuntimeError: [pair.cc:598] Connection closed by peer [127.0.0.1]:41234' >&2; "
                                         "exit 1; fi; sleep 0.3; echo 'ValueError: bad batch at step 14' >&2; exit 3");
  auto r = RunCommand({CTRUN_BINARY, "--standalone", "--nproc_per_node=2", "--max_restarts=1", "/bin/sh", "-c",
                       script});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("exited with code 1 after losing a peer; waiting up to 1.0 s"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("attempt 0 failed; root cause: worker rank 1 (local_rank 1, pid "), std::string::npos) << r.err;
}

// Rank 1 has written its error file and is still exiting (a Python rank in interpreter shutdown)
// when rank 0 dies of SIGPIPE: rank 1 is the root cause whatever ends it, so ctrun does not wait.
// ("$$$$": see above.)
TEST(CtrunE2E, ALostPeerIsNotWaitedForWhenThePeerHasRecordedItsError) {
  TempDir d;
  const std::string script = std::string("[ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] || exit 0; if [ \"$RANK\" = 1 ]; then ") +
                             FAKE_WORKER + " --error-file 'crashed at step 14' && touch " + (d / "written") +
                             " && exec sleep 30; fi; while [ ! -e " + (d / "written") + " ]; do sleep 0.01; done; kill -PIPE $$$$";
  auto r = RunCommand({CTRUN_BINARY, "--standalone", "--nproc_per_node=2", "--max_restarts=1", "/bin/sh", "-c",
                       script}, {}, 60s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("waiting up to"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("attempt 0 failed; root cause: worker rank 1 (local_rank 1, pid "), std::string::npos) << r.err;
  // Its status is ctrun's signal; the live line says that it had failed before.
  EXPECT_NE(r.err.find(") failed on its own and was then killed by signal 15 (SIGTERM) as ctrun stopped the attempt: "
                       "RuntimeError: crashed at step 14"),
            std::string::npos)
      << r.err;
}

TEST(CtrunE2E, SignalDeathGives128PlusSignalAndSignalName) {
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2"}, {"--only-rank", "0", "--signal", "11"}));
  EXPECT_EQ(r.exit_code, 128 + 11) << r.err;
  EXPECT_NE(r.err.find("SIGSEGV"), std::string::npos) << r.err;
}

TEST(CtrunE2E, ErrorFileTracebackShowsInSummary) {
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2"}, {"--only-rank", "1", "--error-file", "bad batch", "--exit", "1"}));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("RuntimeError: bad batch"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("fake frame"), std::string::npos) << r.err;
}

TEST(CtrunE2E, SurvivorsIgnoringSigtermAreKilledAfterGrace) {
  TempDir d;
  // Rank 0 fails once every worker is up; ranks 1-2 ignore SIGTERM and hang.
  std::string go = d / "go";
  BackgroundProcess p(Ctrun({"--standalone", "--nproc_per_node=3", "--shutdown-timeout=1"},
                            {"--pid-file", d / "pids", "--ignore-term", "--wait-file", go, "--only-rank", "0",
                             "--exit", "4", "--else-hang"}),
                      {}, d / "out", d / "err");
  ASSERT_TRUE(WaitFor([&] { return ReadPids(d / "pids").size() == 3; }, 10s));
  auto start = std::chrono::steady_clock::now();
  std::ofstream(go).put('x');
  EXPECT_EQ(p.Wait(10s), 4) << ReadFileOr(d / "err");
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(secs, 0.9);
  EXPECT_LT(secs, 5.0);
  EXPECT_TRUE(AllDead(ReadPids(d / "pids")));
  std::string err = ReadFileOr(d / "err");
  EXPECT_NE(err.find("grace period over: sent SIGKILL to 2"), std::string::npos) << err;
  EXPECT_NE(err.find("stopped by ctrun"), std::string::npos) << err;
}

TEST(CtrunE2E, HangingSigtermIgnoringSurvivorsGetSigkill) {
  TempDir d;
  // Every rank hangs and ignores SIGTERM; ctrun gets SIGTERM; after the 1 s grace it SIGKILLs.
  BackgroundProcess p(Ctrun({"--standalone", "--nproc_per_node=2", "--shutdown-timeout=1"},
                            {"--pid-file", d / "pids", "--ignore-term", "--hang"}),
                      {}, d / "out", d / "err");
  ASSERT_TRUE(WaitFor([&] { return ReadPids(d / "pids").size() == 2; }, 10s));
  auto start = std::chrono::steady_clock::now();
  p.Signal(SIGTERM);
  EXPECT_EQ(p.Wait(10s), 128 + SIGTERM);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(secs, 0.9);
  EXPECT_LT(secs, 5.0);
  EXPECT_TRUE(WaitFor([&] { return AllDead(ReadPids(d / "pids")); }, 2s));
  EXPECT_NE(ReadFileOr(d / "err").find("SIGKILL"), std::string::npos) << ReadFileOr(d / "err");
}

TEST(CtrunE2E, SigintAndSigtermAreForwardedAndExitCodeIs128PlusSignal) {
  for (int sig : {SIGINT, SIGTERM}) {
    TempDir d;
    BackgroundProcess p(Ctrun({"--standalone", "--nproc_per_node=2"}, {"--pid-file", d / "pids", "--hang"}), {},
                        d / "out", d / "err");
    ASSERT_TRUE(WaitFor([&] { return ReadPids(d / "pids").size() == 2; }, 10s));
    p.Signal(sig);
    EXPECT_EQ(p.Wait(10s), 128 + sig) << ReadFileOr(d / "err");
    EXPECT_TRUE(WaitFor([&] { return AllDead(ReadPids(d / "pids")); }, 2s));
  }
}

// timeout(1) sends its SIGTERM to ctrun, then to its own process group, ctrun included: one
// process's second copy right after the first is the same request, and the workers keep their
// grace period (it was skipped as "SIGTERM again"). The test sends both itself, the second once
// ctrun has acted on the first.
TEST(CtrunE2E, OneSendersSigtermTwiceAtOnceIsOneRequestAndKeepsTheGracePeriod) {
  TempDir d;
  BackgroundProcess p(Ctrun({"--standalone", "--nproc_per_node=1", "--shutdown-timeout=2"},
                            {"--pid-file", d / "pids", "--ignore-term", "--hang"}),
                      {}, d / "out", d / "err");
  ASSERT_TRUE(WaitFor([&] { return ReadPids(d / "pids").size() == 1; }, 10s));
  const auto start = std::chrono::steady_clock::now();
  p.Signal(SIGTERM);
  ASSERT_TRUE(WaitFor([&] { return ReadFileOr(d / "err").find("received SIGTERM") != std::string::npos; }, 5s));
  p.Signal(SIGTERM);
  EXPECT_EQ(p.Wait(10s), 128 + SIGTERM) << ReadFileOr(d / "err");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(ReadFileOr(d / "err").find("killing the workers now"), std::string::npos) << ReadFileOr(d / "err");
  EXPECT_GE(took, 1.9) << "the 2 s grace period was cut short";
}

// A signal to the whole process group of `timeout 60 ctrun ...` (a ^C at a terminal, a kill of
// the job's group) reaches ctrun twice: from its sender, and forwarded by timeout, ctrun's
// parent. One request: the workers keep their grace period (the compat review saw them SIGKILLed
// within 4 ms, and no KeyboardInterrupt handler could save a checkpoint).
TEST(CtrunE2E, ASignalThatTheParentForwardsTooIsOneRequestAndKeepsTheGracePeriod) {
  TempDir d;
  std::vector<std::string> argv{"/usr/bin/timeout", "60"};
  for (const auto& a : Ctrun({"--standalone", "--nproc_per_node=1", "--shutdown-timeout=2"},
                             {"--pid-file", d / "pids", "--ignore-term", "--hang"}))
    argv.push_back(a);
  BackgroundProcess p(argv, {}, d / "out", d / "err");  // its own process group, timeout its leader
  ASSERT_TRUE(WaitFor([&] { return ReadPids(d / "pids").size() == 1; }, 10s)) << ReadFileOr(d / "err");
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(-p.pid(), SIGTERM), 0);
  EXPECT_EQ(p.Wait(10s), 128 + SIGTERM) << ReadFileOr(d / "err");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(ReadFileOr(d / "err").find("killing the workers now"), std::string::npos) << ReadFileOr(d / "err");
  EXPECT_GE(took, 1.9) << "the 2 s grace period was cut short";
}

// A wrapper that turns a ^C into SIGTERM for its child (a Python parent's p.terminate() on
// KeyboardInterrupt, a shell trap): ctrun gets SIGINT, then SIGTERM from its parent. One request:
// the grace period holds, and the workers get both signals, as under torchrun.
TEST(CtrunE2E, ACtrlCThatTheParentTurnsIntoSigtermIsOneRequestAndBothReachTheWorkers) {
  if (::access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/python3";
  TempDir d;
  {
    std::ofstream(d / "worker.sh") << "trap 'echo INT >> \"$1\"' INT\ntrap 'echo TERM >> \"$1\"' TERM\n"
                                      ": > \"$1.up\"\nwhile :; do sleep 0.05; done\n";
  }
  std::vector<std::string> argv{"/usr/bin/python3", "-c",
                                "import subprocess, sys\n"
                                "p = subprocess.Popen(sys.argv[1:])\n"
                                "try:\n    p.wait()\n"
                                "except KeyboardInterrupt:\n    p.terminate()\n    sys.exit(p.wait() & 255)\n",
                                CTRUN_BINARY, "--standalone", "--nproc_per_node=1", "--shutdown-timeout=2", "--no_python",
                                "/bin/sh", d / "worker.sh", d / "sigs"};
  BackgroundProcess p(argv, {}, d / "out", d / "err");  // its own process group
  ASSERT_TRUE(WaitFor([&] { return std::filesystem::exists(d / "sigs.up"); }, 20s)) << ReadFileOr(d / "err");
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(-p.pid(), SIGINT), 0);
  p.Wait(15s);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::string err = ReadFileOr(d / "err");
  EXPECT_EQ(err.find("killing the workers now"), std::string::npos) << err;
  EXPECT_GE(took, 1.9) << "the 2 s grace period was cut short\n" << err;
  EXPECT_TRUE(WaitFor([&] { return ReadFileOr(d / "sigs") == "INT\nTERM\n"; }, 5s)) << ReadFileOr(d / "sigs") << err;
  EXPECT_NE(err.find("the same request, not a second one; forwarded to the workers"), std::string::npos) << err;
}

TEST(CtrunE2E, AWorkerThatFindsTheAgentStoresPortTakenIsToldWhyInTheSummary) {
  TempDir d;
  const std::string port = std::to_string(ctrun::testing::FreePort());  // the agent store's, as torch names it
  auto r = RunCommand(Ctrun({"--master_port=" + port, "--nproc_per_node=2"},  // stderr relayed: its tail is kept
                            {"--env-file", d / "env", "--only-rank", "0", "--stderr",
                             "bind to [::]:" + port + " (errno: 98 - Address already in use)", "--exit", "1"}),
                      {});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(EnvValue(ReadFileOr(d / "env.0"), "MASTER_PORT"), port);
  EXPECT_NE(r.err.find("note      : MASTER_PORT=" + port + " is ctrun's agent store"), std::string::npos) << r.err;
  auto without = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2", "--no-agent-store"},
                                  {"--only-rank", "0", "--stderr", "errno: 98 - Address already in use", "--exit", "1"}),
                            {});
  EXPECT_EQ(without.err.find("agent store"), std::string::npos) << without.err;
}

TEST(CtrunE2E, Usr1IsForwardedWithoutEndingTheJob) {
  TempDir d;
  // Workers die of SIGUSR1 (default action): proof that it reached them, and ctrun reports it.
  BackgroundProcess p(Ctrun({"--standalone", "--nproc_per_node=2"}, {"--pid-file", d / "pids", "--hang"}), {},
                      d / "out", d / "err");
  ASSERT_TRUE(WaitFor([&] { return ReadPids(d / "pids").size() == 2; }, 10s));
  p.Signal(SIGUSR1);
  EXPECT_EQ(p.Wait(10s), 128 + SIGUSR1);
  EXPECT_NE(ReadFileOr(d / "err").find("forwarding SIGUSR1"), std::string::npos) << ReadFileOr(d / "err");
}

TEST(CtrunE2E, GrandchildrenAreGoneAfterRestartAndAfterExit) {
  TempDir d;
  // Attempt 0: both workers fork 2 grandchildren, then (once the test says go) rank 0 fails.
  // Attempt 1: everyone exits 0 at once, leaving grandchildren behind that ctrun must sweep.
  std::string go = d / "go";
  BackgroundProcess p(Ctrun({"--standalone", "--nproc_per_node=2", "--max_restarts=1"},
                            {"--pid-file", d / "pids", "--grandchildren", "2", "--wait-file", go, "--only-rank", "0",
                             "--only-attempt", "0", "--exit", "1"}),
                      {}, d / "out", d / "err");
  ASSERT_TRUE(WaitFor([&] { return ReadPids(d / "pids").size() == 6; }, 10s));
  std::ofstream(go).put('x');
  ASSERT_EQ(p.Wait(10s), 0) << ReadFileOr(d / "err");
  auto pids = ReadPids(d / "pids");
  EXPECT_EQ(pids.size(), 12u);  // 2 attempts x 2 workers x (1 + 2 grandchildren)
  EXPECT_TRUE(WaitFor([&] { return AllDead(pids); }, 1s));
}

TEST(CtrunE2E, SigkilledCtrunLeavesNoWorkerOrGrandchild) {
  TempDir d;
  BackgroundProcess p(Ctrun({"--standalone", "--nproc_per_node=3"}, {"--pid-file", d / "pids", "--grandchildren", "2", "--hang"}),
                      {}, d / "out", d / "err");
  ASSERT_TRUE(WaitFor([&] { return ReadPids(d / "pids").size() == 9; }, 10s));
  auto pids = ReadPids(d / "pids");
  p.Signal(SIGKILL);
  p.Wait(5s);
  EXPECT_TRUE(WaitFor([&] { return AllDead(pids); }, 1s)) << "survivors after ctrun was SIGKILLed";
}

// What ctrun inherits from its parent must not blind it. SIGCHLD ignored: the kernel would reap
// the workers itself and ctrun waited for ever. Fds 1 and 2 closed: ctrun's own fds took their
// slots, and the watchdog's /dev/null over 0-2 closed its pipe (workers died of SIGPIPE, or
// the watchdog was gone and a SIGKILL of ctrun left grandchildren).
TEST(CtrunE2E, AnIgnoredSigchldInheritedFromTheParentChangesNothing) {
  const std::vector<std::string> ok = Ctrun({"--standalone", "--nproc_per_node=2"}, {"--sleep-ms", "50"});
  std::vector<std::string> argv{"/usr/bin/env", "--ignore-signal=CHLD"};
  argv.insert(argv.end(), ok.begin(), ok.end());
  auto r = RunCommand(argv, {}, 20s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  argv.resize(2);
  const std::vector<std::string> fail =
      Ctrun({"--standalone", "--nproc_per_node=2"}, {"--only-rank", "1", "--exit", "3", "--sleep-ms", "50"});
  argv.insert(argv.end(), fail.begin(), fail.end());
  r = RunCommand(argv, {}, 20s);
  EXPECT_EQ(r.exit_code, 3) << r.err;
}

TEST(CtrunE2E, StdoutAndStderrClosedByTheParentChangeNothing) {
  TempDir d;
  // argv run by a shell that closes fds 1 and 2 first.
  auto closed_1_and_2 = [](const std::vector<std::string>& argv) {
    std::string cmd = "exec";
    for (const auto& a : argv) cmd += " '" + a + "'";
    return std::vector<std::string>{"/bin/sh", "-c", cmd + " >&- 2>&-"};
  };
  const auto two = closed_1_and_2(Ctrun({"--standalone", "--nproc_per_node=2", "--summary-file", d / "s.json"},
                                        {"--fd-file", d / "fds", "--sleep-ms", "20"}));
  for (int i = 0; i < 5; ++i) {
    auto r = RunCommand(two, {}, 20s);
    ASSERT_EQ(r.exit_code, 0) << i << ": " << ReadFileOr(d / "s.json");
  }
  // A single worker inherits ctrun's stdout and stderr: it sees them closed, as ctrun did (the
  // slots ctrun filled are close-on-exec).
  ASSERT_EQ(RunCommand(closed_1_and_2(Ctrun({"--standalone", "--nproc_per_node=1"}, {"--fd-file", d / "one"})), {}, 20s)
                .exit_code,
            0);
  std::set<int> fds;
  for (const auto& l : SplitLines(ReadFileOr(d / "one.0"))) fds.insert(std::stoi(l));
  EXPECT_EQ(fds, (std::set<int>{0}));
  // The watchdog still runs: a SIGKILL of ctrun takes the grandchildren with it.
  BackgroundProcess p(closed_1_and_2(Ctrun({"--standalone", "--nproc_per_node=2"},
                                           {"--pid-file", d / "pids", "--grandchildren", "2", "--hang"})),
                      {}, d / "out", d / "err");
  ASSERT_TRUE(WaitFor([&] { return ReadPids(d / "pids").size() == 6; }, 10s));
  auto pids = ReadPids(d / "pids");
  p.Signal(SIGKILL);
  p.Wait(5s);
  EXPECT_TRUE(WaitFor([&] { return AllDead(pids); }, 5s)) << "survivors after ctrun was SIGKILLed";
}

// A watchdog killed by hand: the workers of later attempts still start. Each new worker's
// announcement to the dead watchdog left a SIGPIPE pending (blocked before exec), which killed it
// as soon as its signals were reset: every restart died of SIGPIPE.
TEST(CtrunE2E, RestartsStillStartWorkersAfterTheWatchdogWasKilled) {
  TempDir d;
  const std::string go = d / "go";
  BackgroundProcess p(Ctrun({"--standalone", "--nproc_per_node=2", "--max_restarts=2"},
                            {"--pid-file", d / "pids", "--wait-file", go, "--only-rank", "0", "--only-attempt", "0",
                             "--exit", "1"}),
                      {}, d / "out", d / "err");
  ASSERT_TRUE(WaitFor([&] { return ReadPids(d / "pids").size() == 2; }, 10s));
  pid_t watchdog = 0;
  // A forked watchdog (no ct-watchdog program) takes its name a moment after the fork.
  ASSERT_TRUE(WaitFor([&] { return (watchdog = ctrun::testing::WatchdogBelow(p.pid())) != 0; }, 10s));
  ASSERT_EQ(::kill(watchdog, SIGKILL), 0);
  ASSERT_TRUE(WaitFor([&] { return ReadFileOr(d / "err").find("the watchdog") != std::string::npos; }, 5s));
  std::ofstream(go).put('x');
  EXPECT_EQ(p.Wait(20s), 0) << ReadFileOr(d / "err");
  EXPECT_EQ(ReadFileOr(d / "err").find("SIGPIPE"), std::string::npos) << ReadFileOr(d / "err");
}

// `pkill -9 -f ctrun` (or -f of the training script) must not take the watchdog with ctrun: its
// command line names neither, whether it is the ct-watchdog program (the cleanup's arguments,
// which hold ctrun-<pid>, travel in its environment) or a fork of ctrun. Then a SIGKILL of ctrun
// still takes the workers' grandchildren.
TEST(CtrunE2E, TheWatchdogsCommandLineNamesNeitherCtrunNorTheJob) {
  for (const bool forked : {false, true}) {
    SCOPED_TRACE(forked ? "forked watchdog" : "ct-watchdog program");
    TempDir d;
    BackgroundProcess p(Ctrun({"--standalone", "--nproc_per_node=1"},
                              {"--pid-file", d / "pids", "--grandchildren", "1", "--hang"}),
                        forked ? std::vector<std::string>{"CTRUN_WATCHDOG_HELPER=/nonexistent"} : std::vector<std::string>{},
                        d / "out", d / "err");
    ASSERT_TRUE(WaitFor([&] { return ReadPids(d / "pids").size() == 2; }, 10s)) << ReadFileOr(d / "err");
    pid_t watchdog = 0;
    std::string cmdline;
    ASSERT_TRUE(WaitFor([&] {
      watchdog = ctrun::testing::WatchdogBelow(p.pid());
      cmdline = watchdog ? ReadFileOr("/proc/" + std::to_string(watchdog) + "/cmdline") : "";
      return watchdog != 0 && cmdline.find("ctrun") == std::string::npos;
    }, 10s)) << cmdline;
    EXPECT_EQ(cmdline.substr(0, cmdline.find('\0')), "ct-watchdog");
    EXPECT_EQ(cmdline.find("fake_worker"), std::string::npos) << cmdline;
    const auto pids = ReadPids(d / "pids");
    p.Signal(SIGKILL);
    p.Wait(5s);
    EXPECT_TRUE(WaitFor([&] { return AllDead(pids); }, 5s)) << "survivors after ctrun was SIGKILLed";
  }
}

// ctrun's cleanup mode, which the ct-watchdog program execs after a SIGKILL of ctrun
// (process/watchdog.h): it removes a run directory's trees made ahead, and empties no cgroup
// directory that is not a workers' one (it would kill what runs there).
TEST(CtrunE2E, TheWatchdogCleanupModeTouchesOnlyWhatCtrunMade) {
  TempDir d;
  for (const char* dir : {"notours", "run", "run/attempt_0", "run/attempt_0/0", "run/.attempt_1", "run/.attempt_1/0"})
    ASSERT_TRUE(std::filesystem::create_directory(d / dir)) << dir;
  EXPECT_EQ(RunCommand({CTRUN_BINARY, "--ct-watchdog-cleanup"}).exit_code, 2);
  EXPECT_EQ(RunCommand({CTRUN_BINARY, "--ct-watchdog-cleanup", d / "notours", ""}).exit_code, 2);
  EXPECT_TRUE(std::filesystem::is_directory(d / "notours"));
  RunResult r = RunCommand({CTRUN_BINARY, "--ct-watchdog-cleanup", "", d / "run"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(std::filesystem::exists(d / "run/.attempt_1"));
  EXPECT_TRUE(std::filesystem::is_directory(d / "run/attempt_0/0"));
}

TEST(CtrunE2E, MissingEntrypointIsAUsageError) {
  auto r = RunCommand({CTRUN_BINARY, "--standalone", "--nproc_per_node=2", "/nonexistent/train"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(SplitLines(r.err).size(), 1u) << r.err;
  EXPECT_NE(r.err.find("cannot execute /nonexistent/train"), std::string::npos) << r.err;
}

TEST(CtrunE2E, NonExecutableEntrypointIsAUsageError) {
  TempDir d;
  std::ofstream(d / "train") << "#!/bin/sh\n";
  auto r = RunCommand({CTRUN_BINARY, "--nproc_per_node=2", d / "train"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(SplitLines(r.err).size(), 1u) << r.err;
  EXPECT_NE(r.err.find("Permission denied"), std::string::npos) << r.err;
}

TEST(CtrunE2E, ExecFailureAtSpawnIs127WithoutRestartLoop) {
  TempDir d;
  std::string script = d / "train";
  std::ofstream(script) << "#!/nonexistent/interpreter\n";
  chmod(script.c_str(), 0755);
  auto r = RunCommand({CTRUN_BINARY, "--standalone", "--nproc_per_node=2", "--max_restarts=50", script});
  EXPECT_EQ(r.exit_code, 127) << r.err;
  EXPECT_NE(r.err.find("cannot execute " + script), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("restarting"), std::string::npos) << r.err;
}

TEST(CtrunE2E, BadInputIsOneLineAndExitTwo) {
  const std::vector<std::vector<std::string>> cases = {
      {"--bogus-flag", FAKE_WORKER},
      {"--nnodes=2:1", FAKE_WORKER},
      {"--nproc_per_node=0", FAKE_WORKER},
      {"--nproc_per_node=abc", FAKE_WORKER},
      {"-m", "--no_python", FAKE_WORKER},
      {"--master_port=70000", FAKE_WORKER},
      {"--nproc_per_node=2"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> argv{CTRUN_BINARY};
    argv.insert(argv.end(), c.begin(), c.end());
    auto r = RunCommand(argv);
    EXPECT_EQ(r.exit_code, 2) << c[0] << ": " << r.err;
    EXPECT_EQ(SplitLines(r.err).size(), 1u) << c[0] << ": " << r.err;
    EXPECT_EQ(r.err.rfind("ctrun: error: ", 0), 0u) << r.err;
  }
}

TEST(CtrunE2E, GpuWithoutGpusIsAClearError) {
  auto r = RunCommand({CTRUN_BINARY, "--nproc_per_node=gpu", FAKE_WORKER}, {"CUDA_VISIBLE_DEVICES="});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no GPU"), std::string::npos) << r.err;
  auto r2 = RunCommand({CTRUN_BINARY, "--standalone", "--nproc_per_node=gpu", FAKE_WORKER, "--env-file", "/dev/null/x"},
                {"CUDA_VISIBLE_DEVICES=0,1,2"});
  EXPECT_EQ(r2.exit_code, 0) << r2.err;
  EXPECT_NE(r2.err.find("starting 3 workers"), std::string::npos) << r2.err;
}

TEST(CtrunE2E, PlaceholdersReachTheWorker) {
  TempDir d;
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2", "--expand-placeholders"},
                     {"--env-file", d.path() + "/env_${local_rank}_${rank}_${world_size}"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string env0 = ReadFileOr(d / "env_0_0_2.0"), env1 = ReadFileOr(d / "env_1_1_2.1");
  EXPECT_FALSE(env0.empty());
  EXPECT_FALSE(env1.empty());
  EXPECT_EQ(EnvValue(env1, "RANK"), "1");
}

}  // namespace
}  // namespace ctrun::testing
