// ctrun --warm with a C++ worker that opts in (CTRUN_MAIN, include/ctrun/warm_main.h), end to
// end: the binary is started once as the warm server and its forked workers cannot be told from
// cold ones (environment, argv, cwd, fds, signal state, exit codes, error files, stdio); every
// broken rule falls back to a cold start with one warning; a changed binary restarts the server;
// nothing survives a SIGKILL of ctrun. The fake (tests/helpers/warm_fake.cc) writes what it
// observes to a JSON file per attempt and rank.
#include <signal.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <regex>

#include "helpers/test_util.h"
#include "warm/warm_test_util.h"

namespace ctrun::warm {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using ctrun::testing::BackgroundProcess;
using ctrun::testing::CountOf;
using ctrun::testing::LiveDescendants;
using ctrun::testing::ProcessAlive;
using ctrun::testing::ReadFileOr;
using ctrun::testing::RunCommand;
using ctrun::testing::RunResult;
using ctrun::testing::TempDir;
using ctrun::testing::WaitFor;

std::vector<std::string> Ctrun(int nproc, int max_restarts, const std::vector<std::string>& flags,
                               const std::vector<std::string>& cmd) {
  return ctrun::testing::StandaloneCtrun(nproc, max_restarts, flags, cmd);
}

std::vector<std::string> Fake(const std::string& dir, std::vector<std::string> args = {},
                              const std::string& binary = WARM_FAKE) {
  std::vector<std::string> cmd{binary, dir};
  cmd.insert(cmd.end(), args.begin(), args.end());
  return cmd;
}

json ReadObservation(const std::string& dir, int attempt, int rank) {
  const std::string text =
      ReadFileOr(dir + "/attempt" + std::to_string(attempt) + "-rank" + std::to_string(rank) + ".json");
  return text.empty() ? json() : json::parse(text, nullptr, false);
}

bool StartedWarm(const RunResult& r) { return ctrun::testing::StartedNativeWarm(r.err); }

// What differs between any two runs by design: the run's own ids, ports and paths.
json Comparable(json j, const std::string& dir, const std::string& reference_dir) {
  for (const char* k : {"MASTER_PORT", "PET_MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"})
    j["env"].erase(k);
  // The heartbeat socket's identity differs per run; its shape does not.
  if (j["env"].contains("CTRUN_HEARTBEAT_ID") &&
      std::regex_match(j["env"]["CTRUN_HEARTBEAT_ID"].get<std::string>(), std::regex("[0-9]+:[0-9]+")))
    j["env"]["CTRUN_HEARTBEAT_ID"] = "<st_dev>:<st_ino>";
  std::string s = j.dump(1);
  for (size_t p = 0; (p = s.find(dir, p)) != std::string::npos; p += reference_dir.size())
    s.replace(p, dir.size(), reference_dir);
  return json::parse(s);
}

class WarmNative : public ::testing::Test {
 protected:
  TempDir dir_;
};

TEST_F(WarmNative, WorkerLooksExactlyLikeAColdOne) {
  const std::string cold = dir_ / "cold", warm = dir_ / "warm";
  std::filesystem::create_directories(cold);
  std::filesystem::create_directories(warm);
  // With heartbeats: the worker's fd 3 is its heartbeat socket, warm or cold.
  const std::vector<std::string> hb{"--heartbeat-timeout=60"};
  RunResult c = RunCommand(Ctrun(2, 0, hb, Fake(cold, {"--unflushed", "no newline, no fflush", "--cout", "cout, no flush"})), {}, 60s);
  ASSERT_EQ(c.exit_code, 0) << c.err;
  std::vector<std::string> flags = hb;
  flags.push_back("--warm");
  RunResult w = RunCommand(Ctrun(2, 0, flags, Fake(warm, {"--unflushed", "no newline, no fflush", "--cout", "cout, no flush"})), {}, 60s);
  ASSERT_EQ(w.exit_code, 0) << w.err;
  ASSERT_TRUE(StartedWarm(w)) << w.err;
  EXPECT_EQ(w.err.find("start cold"), std::string::npos) << w.err;
  for (int rank = 0; rank < 2; ++rank) {
    json a = ReadObservation(cold, 0, rank), b = ReadObservation(warm, 0, rank);
    ASSERT_TRUE(a.is_object() && b.is_object());
    EXPECT_EQ(a["heartbeat"], true);
    EXPECT_EQ(a["parent_comm"], "ctrun\n");
    EXPECT_EQ(Comparable(a, cold, cold).dump(1), Comparable(b, warm, cold).dump(1)) << "rank " << rank;
  }
  // stdout flushed at exit, warm as cold.
  EXPECT_EQ(CountOf(c.out, "no newline, no fflush"), 2) << c.out;
  EXPECT_EQ(CountOf(w.out, "no newline, no fflush"), 2) << w.out;
  EXPECT_EQ(CountOf(c.out, "cout, no flush"), 2) << c.out;
  EXPECT_EQ(CountOf(w.out, "cout, no flush"), 2) << w.out;
}

// The heartbeat library read its variables in the server, before main (where there are none):
// each forked worker reads its own again, as an exec'd one does, and its beats go out.
TEST_F(WarmNative, HeartbeatsWorkWhenTheServerAskedForThemBeforeMain) {
  RunResult w = RunCommand(Ctrun(2, 0, {"--heartbeat-timeout=60", "--warm"}, Fake(dir_.path())),
                           {"WARM_FAKE_STATIC_BEAT=1"}, 60s);
  ASSERT_EQ(w.exit_code, 0) << w.err;
  ASSERT_TRUE(StartedWarm(w)) << w.err;
  EXPECT_EQ(w.err.find("start cold"), std::string::npos) << w.err;  // the server lived to serve
  for (int rank = 0; rank < 2; ++rank) {
    const json seen = ReadObservation(dir_.path(), 0, rank);
    ASSERT_TRUE(seen.is_object()) << "rank " << rank;
    EXPECT_EQ(seen["heartbeat"], true) << "rank " << rank;
  }
}

TEST_F(WarmNative, ExitCodesErrorFilesAndAbortsAsCold) {
  for (const bool warm : {false, true}) {
    std::vector<std::string> flags;
    if (warm) flags = {"--warm"};
    // The worker's own atexit handler runs and its output is flushed, and the code is kept.
    RunResult code = RunCommand(Ctrun(1, 0, flags, Fake(dir_.path(), {"--exit", "7", "--atexit", "handler ran"})), {}, 60s);
    EXPECT_EQ(code.exit_code, 7) << code.err;
    EXPECT_EQ(StartedWarm(code), warm) << code.err;
    EXPECT_EQ(CountOf(code.out, "handler ran"), 1) << code.out;
    RunResult error = RunCommand(Ctrun(1, 0, flags, Fake(dir_.path(), {"--error", "recorded on purpose"})), {}, 60s);
    EXPECT_EQ(error.exit_code, 1) << error.err;
    EXPECT_NE(error.err.find("exited with code 1: RuntimeError: recorded on purpose"), std::string::npos) << error.err;
    // An exception out of main: std::terminate, the library's handler records it, SIGABRT.
    RunResult thrown = RunCommand(Ctrun(1, 0, flags, Fake(dir_.path(), {"--throw", "thrown on purpose"})), {}, 60s);
    EXPECT_EQ(thrown.exit_code, 128 + SIGABRT) << thrown.err;
    EXPECT_NE(thrown.err.find("std::runtime_error: thrown on purpose"), std::string::npos) << thrown.err;
    EXPECT_EQ(thrown.err.find("ctrun --warm"), std::string::npos) << thrown.err;
  }
}

TEST_F(WarmNative, WithoutCtrunItIsAPlainProgram) {
  RunResult r = RunCommand(Fake(dir_.path(), {"--exit", "5", "--unflushed", "plain"}), {}, 30s);
  EXPECT_EQ(r.exit_code, 5) << r.err;
  EXPECT_EQ(r.out, "plain");
  json j = ReadObservation(dir_.path(), 0, 0);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["argv"][0], WARM_FAKE);
  EXPECT_FALSE(j["env"].contains("CTRUN_WARM_SERVER"));
  // A leftover or forged variable does not make a plain run a server.
  RunResult forged = RunCommand(Fake(dir_.path(), {"--exit", "6"}), {"CTRUN_WARM_SERVER=0:1"}, 30s);
  EXPECT_EQ(forged.exit_code, 6) << forged.err;
}

TEST_F(WarmNative, ServerWithAThreadFallsBackCold) {
  RunResult r = RunCommand(Ctrun(2, 0, {"--warm"}, Fake(dir_.path())), {"WARM_FAKE_STATIC_THREAD=1"}, 60s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(CountOf(r.err, "--warm: the warm server has 2 threads"), 1) << r.err;
  EXPECT_EQ(CountOf(r.err, "workers start cold"), 1) << r.err;
  EXPECT_TRUE(ReadObservation(dir_.path(), 0, 1).is_object());
}

// The CUDA driver initialised before main (a static initialiser's cuInit). A stand-in libcuda.so.
TEST_F(WarmNative, ServerWithTheCudaDriverInitialisedFallsBackCold) {
  RunResult r = RunCommand(Ctrun(1, 0, {"--warm"}, Fake(dir_.path())),
                           {std::string("WARM_FAKE_STATIC_DLOPEN=") + FAKE_LIBCUDA, "WARM_FAKE_STATIC_CUINIT=1"}, 60s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(CountOf(r.err, "--warm: CUDA was initialised before main (the CUDA driver, libcuda, is initialised)"), 1)
      << r.err;
  EXPECT_EQ(CountOf(r.err, "workers start cold"), 1) << r.err;
}

// libcuda mapped but never called, as in every binary linked with a CUDA build of LibTorch 2.x (a
// library of torch's links it): the server forks.
TEST_F(WarmNative, ServerWithTheCudaDriverOnlyMappedStartsWarm) {
  RunResult r = RunCommand(Ctrun(1, 0, {"--warm"}, Fake(dir_.path())),
                           {std::string("WARM_FAKE_STATIC_DLOPEN=") + FAKE_LIBCUDA}, 60s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("cold"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--warm: worker server pid"), std::string::npos) << r.err;
}

TEST_F(WarmNative, ServerThatDiesBeforeReadyFallsBackCold) {
  // The fake's static initialiser exits only in the server role (CTRUN_WARM_SERVER set).
  RunResult r = RunCommand(Ctrun(2, 0, {"--warm"}, Fake(dir_.path())), {"WARM_FAKE_STATIC_EXIT=3"}, 60s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(CountOf(r.err, "--warm: the warm server did not start: the warm server exited"), 1) << r.err;
  EXPECT_FALSE(StartedWarm(r)) << r.err;
  EXPECT_TRUE(ReadObservation(dir_.path(), 0, 1).is_object());
}

TEST_F(WarmNative, ChangedBinaryRestartsTheServer) {
  // A copy of its own: the worker sets the copy's mtime, as a rebuild would change it.
  const std::string binary = dir_ / "warm_fake";
  std::filesystem::copy_file(WARM_FAKE, binary);
  RunResult r = RunCommand(
      Ctrun(2, 1, {"--warm"}, Fake(dir_.path(), {"--touch-self", "--barrier", "2", "--exit", "1", "--exit-attempt", "0"}, binary)),
      {}, 60s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(CountOf(r.err, "warm_fake changed on disk; restarting the warm server"), 1) << r.err;
  EXPECT_EQ(CountOf(r.err, "--warm: worker server pid"), 2) << r.err;
  EXPECT_TRUE(ReadObservation(dir_.path(), 1, 0).is_object());
  EXPECT_TRUE(ReadObservation(dir_.path(), 1, 1).is_object());
}

TEST_F(WarmNative, NothingSurvivesSigkillOfCtrun) {
  // One restart left: the next attempt's children are forked ahead (none are when no attempt can follow).
  BackgroundProcess ctrun(Ctrun(2, 1, {"--warm"}, Fake(dir_.path(), {"--sleep-ms", "60000"})), {}, dir_ / "out.txt",
                          dir_ / "err.txt");
  ASSERT_TRUE(WaitFor(
      [&] { return ReadObservation(dir_.path(), 0, 0).is_object() && ReadObservation(dir_.path(), 0, 1).is_object(); },
      30s))
      << ReadFileOr(dir_ / "err.txt");
  // The watchdog, the server, two workers and the next attempt's two waiting children.
  std::vector<pid_t> procs;
  ASSERT_TRUE(WaitFor([&] { return (procs = LiveDescendants(ctrun.pid())).size() >= 6; }, 30s))
      << procs.size() << " processes; " << ReadFileOr(dir_ / "err.txt");
  ctrun.Signal(SIGKILL);
  EXPECT_EQ(ctrun.Wait(10s), 128 + SIGKILL);
  for (pid_t p : procs) EXPECT_TRUE(WaitFor([&] { return !ProcessAlive(p); }, 10s)) << "pid " << p << " survived";
}

}  // namespace
}  // namespace ctrun::warm
