// ctrun --warm end to end: Python workers forked from the warm server look exactly like cold ones
// (environment, argv, cwd, stdio, signal dispositions, exit codes, tracebacks), get fresh random
// streams, fall back to a cold start with one warning for every broken rule, follow preloaded
// files that change on disk, and leave nothing behind when ctrun is SIGKILLed. The probe worker
// (warm_probe.py) writes what it observes to a JSON file per attempt and rank.
#include <signal.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

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

const std::vector<std::string> kPythonEnv{"PYTHON_EXEC=/usr/bin/python3"};

std::vector<std::string> Ctrun(int nproc, int max_restarts, const std::vector<std::string>& flags,
                               const std::vector<std::string>& cmd) {
  return ctrun::testing::StandaloneCtrun(nproc, max_restarts, flags, cmd);
}

std::vector<std::string> Probe(const std::string& dir, std::vector<std::string> args = {}) {
  std::vector<std::string> cmd{WARM_PROBE, dir};
  cmd.insert(cmd.end(), args.begin(), args.end());
  return cmd;
}

json ReadProbe(const std::string& dir, int attempt, int rank) {
  const std::string text = ReadFileOr(dir + "/attempt" + std::to_string(attempt) + "-rank" + std::to_string(rank) + ".json");
  return text.empty() ? json() : json::parse(text, nullptr, false);
}

bool StartedWarm(const RunResult& r) { return r.err.find("--warm: worker server pid") != std::string::npos; }

// What differs between any two runs by design: the run's own ids, ports and paths, and entropy.
json Comparable(json j) {
  for (const char* k : {"MASTER_PORT", "PET_MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"}) j["env"].erase(k);
  j.erase("random");
  j.erase("authkey");
  return j;
}

// The probe's records of one rank, cold and warm, equal but for what differs by design
// (Comparable) and the probe's own output directory, which is part of argv.
void ExpectSameRecord(const std::string& cold, const std::string& warm, int rank) {
  json a = ReadProbe(cold, 0, rank), b = ReadProbe(warm, 0, rank);
  ASSERT_TRUE(a.is_object() && b.is_object()) << "rank " << rank;
  std::string bs = Comparable(b).dump();
  for (size_t p; (p = bs.find(warm)) != std::string::npos;) bs.replace(p, warm.size(), cold);
  EXPECT_EQ(Comparable(a).dump(1), json::parse(bs).dump(1)) << "rank " << rank;
}

class Warm : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
  }
  TempDir dir_;
};

TEST_F(Warm, WorkerLooksExactlyLikeAColdOne) {
  const std::string cold = dir_ / "cold", warm = dir_ / "warm";
  std::filesystem::create_directories(cold);
  std::filesystem::create_directories(warm);
  RunResult c = RunCommand(Ctrun(2, 0, {}, Probe(cold, {"--exit", "0"})), kPythonEnv, 60s);
  ASSERT_EQ(c.exit_code, 0) << c.err;
  RunResult w = RunCommand(Ctrun(2, 0, {"--warm", "--warm-preload=json"}, Probe(warm, {"--exit", "0"})), kPythonEnv, 60s);
  ASSERT_EQ(w.exit_code, 0) << w.err;
  ASSERT_TRUE(StartedWarm(w)) << w.err;
  EXPECT_EQ(w.err.find("start cold"), std::string::npos) << w.err;
  for (int rank = 0; rank < 2; ++rank) ExpectSameRecord(cold, warm, rank);
}

// A warm worker's heartbeat socket reaches it through the server (the same socket, at fd 3) with
// CTRUN_HEARTBEAT_ID naming it: the README's Python check finds it, and the beats arrive.
TEST_F(Warm, TheReadmeHeartbeatCheckFindsAWarmWorkersSocket) {
  const std::string script = dir_ / "beat.py";
  std::ofstream(script) << "import os, time\n"
                           "import os; hb = os.environ.get(\"CTRUN_HEARTBEAT_FD\")\n"
                           "try: s = os.fstat(int(hb)); hb = int(hb) if f\"{s.st_dev}:{s.st_ino}\" == "
                           "os.environ.get(\"CTRUN_HEARTBEAT_ID\") else None\n"
                           "except (TypeError, ValueError, OSError): hb = None\n"
                           "for step in range(1, 6):\n"
                           "    if hb is not None: os.write(hb, b\"%d\\n\" % step)\n"
                           "time.sleep(1000)\n";
  RunResult w = RunCommand(Ctrun(1, 0, {"--warm", "--heartbeat-timeout=0.5", "--stack-timeout=0"}, {script}),
                           kPythonEnv, 60s);
  ASSERT_TRUE(StartedWarm(w)) << w.err;
  EXPECT_EQ(w.err.find("start cold"), std::string::npos) << w.err;
  EXPECT_EQ(w.exit_code, 124) << w.err;
  EXPECT_NE(w.err.find("(last beat at step 5)"), std::string::npos) << w.err;
}

TEST_F(Warm, ModuleWorkerLooksExactlyLikeAColdOne) {
  const std::string cold = dir_ / "cold", warm = dir_ / "warm";
  std::filesystem::create_directories(cold);
  std::filesystem::create_directories(warm);
  const std::string probe_dir = std::filesystem::path(WARM_PROBE).parent_path().string();
  const std::vector<std::string> env{"PYTHON_EXEC=/usr/bin/python3", "PYTHONPATH=" + probe_dir};
  RunResult c = RunCommand(Ctrun(1, 0, {"-m"}, {"warm_probe", cold}), env, 60s);
  ASSERT_EQ(c.exit_code, 0) << c.err;
  RunResult w = RunCommand(Ctrun(1, 0, {"--warm", "--warm-preload=json", "-m"}, {"warm_probe", warm}), env, 60s);
  ASSERT_EQ(w.exit_code, 0) << w.err;
  ASSERT_TRUE(StartedWarm(w)) << w.err;
  ExpectSameRecord(cold, warm, 0);
}

TEST_F(Warm, ExitCodesTracebacksAndSignalsAsCold) {
  for (const bool warm : {false, true}) {
    std::vector<std::string> flags;
    if (warm) flags = {"--warm", "--warm-preload=json"};
    RunResult code = RunCommand(Ctrun(1, 0, flags, Probe(dir_.path(), {"--exit", "7"})), kPythonEnv, 60s);
    EXPECT_EQ(code.exit_code, 7) << code.err;
    RunResult raised = RunCommand(Ctrun(1, 0, flags, Probe(dir_.path(), {"--raise"})), kPythonEnv, 60s);
    EXPECT_EQ(raised.exit_code, 1) << raised.err;
    // The traceback starts at the script, as in a cold start: no frame of the warm server.
    EXPECT_NE(raised.err.find("Traceback (most recent call last):"), std::string::npos) << raised.err;
    EXPECT_NE(raised.err.find(std::string("File \"") + WARM_PROBE + "\", line"), std::string::npos) << raised.err;
    EXPECT_NE(raised.err.find("ValueError: probe raised on purpose"), std::string::npos) << raised.err;
    EXPECT_EQ(raised.err.find("ctrun-warm"), std::string::npos) << raised.err;
    EXPECT_EQ(raised.err.find("<string>"), std::string::npos) << raised.err;
    EXPECT_EQ(StartedWarm(raised), warm) << raised.err;
  }
}

TEST_F(Warm, RandomStreamsDifferAcrossRanksAndAttempts) {
  RunResult r = RunCommand(Ctrun(2, 1, {"--warm", "--warm-preload=torch"},
                                 Probe(dir_.path(), {"--torch", "--exit", "1", "--exit-attempt", "0", "--barrier", "2"})),
                           kPythonEnv, 120s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(StartedWarm(r)) << r.err;
  std::set<double> py, torch;
  std::set<std::string> authkeys;
  for (int attempt = 0; attempt < 2; ++attempt)
    for (int rank = 0; rank < 2; ++rank) {
      json j = ReadProbe(dir_.path(), attempt, rank);
      ASSERT_TRUE(j.is_object()) << attempt << " " << rank;
      py.insert(j["random"].get<double>());
      torch.insert(j["torch_rand"].get<double>());
      authkeys.insert(j["authkey"].get<std::string>());
      EXPECT_EQ(j["torch_threads"].get<int>(), 1) << "OMP_NUM_THREADS=1 re-read in the child";
    }
  EXPECT_EQ(py.size(), 4u);
  EXPECT_EQ(torch.size(), 4u);
  EXPECT_EQ(authkeys.size(), 4u) << "multiprocessing's authkey is drawn at its import: one per process, cold";
}

// Under -I (or -P, PYTHONSAFEPATH) the interpreter puts neither the script's directory nor the
// working directory on sys.path; a closed stdin stays closed (sys.stdin is None); the working
// directory never shadows what the server imports. Each exactly as cold.
TEST_F(Warm, SafePathClosedStdinAndTheWorkingDirectoryAsCold) {
  std::filesystem::create_directories(dir_ / "cwd");
  std::ofstream(dir_ / "cwd/json.py") << "raise SystemExit('the working directory shadowed json')\n";
  for (const bool warm : {false, true}) {
    const std::string out = dir_ / (warm ? "warm" : "cold");
    std::filesystem::create_directories(out);
    std::vector<std::string> argv{"/bin/sh", "-c", "cd \"$1\" && shift && exec \"$@\" <&-", "sh", dir_ / "cwd"};
    std::vector<std::string> flags;
    if (warm) flags = {"--warm", "--warm-preload=json"};
    for (const std::string& a : Ctrun(1, 0, flags, {"/usr/bin/python3", "-I", WARM_PROBE, out})) argv.push_back(a);
    RunResult r = RunCommand(argv, {}, 60s);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(StartedWarm(r), warm) << r.err;
  }
  json a = ReadProbe(dir_ / "cold", 0, 0), b = ReadProbe(dir_ / "warm", 0, 0);
  ASSERT_TRUE(a.is_object() && b.is_object());
  EXPECT_EQ(a["path"], b["path"]);
  EXPECT_EQ(a["fds"][0], "closed");
  EXPECT_EQ(b["fds"][0], "closed");
  EXPECT_TRUE(b["stdio"][0].is_null()) << b["stdio"].dump();
  EXPECT_EQ(a["stdio"], b["stdio"]);
}

// Until the script imports torch, imports go through a watcher of the server's (OMP_NUM_THREADS):
// a failed import's traceback, chained ones included, shows none of its frames, as cold.
TEST_F(Warm, AFailedImportsTracebackIsTheColdOne) {
  std::ofstream(dir_ / "imp.py") << "try:\n    import no_such_module_xyz\nexcept ImportError as e:\n"
                                    "    raise RuntimeError('wrapped') from e\n";
  std::string cold_err;
  for (const bool warm : {false, true}) {
    std::vector<std::string> flags{"--log-prefix", "none"};
    if (warm) flags.insert(flags.end(), {"--warm", "--warm-preload=json"});
    RunResult r = RunCommand(Ctrun(1, 0, flags, {dir_ / "imp.py"}), kPythonEnv, 60s);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_EQ(StartedWarm(r), warm) << r.err;
    const size_t from = r.err.find("Traceback"), to = r.err.find("RuntimeError: wrapped");
    ASSERT_NE(from, std::string::npos) << r.err;
    ASSERT_NE(to, std::string::npos) << r.err;
    const std::string tb = r.err.substr(from, to - from);
    EXPECT_EQ(tb.find("ctrun-warm"), std::string::npos) << tb;
    if (!warm) cold_err = tb;
    else EXPECT_EQ(tb, cold_err);
  }
}

// Two things a cold interpreter does at exit, warm as cold: it flushes the original stdout that
// the script replaced (buffered: no -u), and its traceback keeps the script's own "<string>"
// frames (exec, eval, generated methods), not only the frames of files.
TEST_F(Warm, ReplacedStdoutAndExecFramesAsCold) {
  std::ofstream(dir_ / "exe.py") << "import os, sys\nprint('before the rebinding')\n"
                                    "sys.stdout = open(os.devnull, 'w')\n"
                                    "exec(\"def f():\\n    raise ValueError('in exec')\\nf()\")\n";
  std::string cold_tb;
  for (const bool warm : {false, true}) {
    std::vector<std::string> flags{"--log-prefix", "none", "--no-python"};
    if (warm) flags.insert(flags.end(), {"--warm", "--warm-preload=json"});
    RunResult r = RunCommand(Ctrun(1, 0, flags, {"/usr/bin/python3", dir_ / "exe.py"}), kPythonEnv, 60s);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_EQ(StartedWarm(r), warm) << r.err;
    EXPECT_EQ(CountOf(r.out, "before the rebinding"), 1) << (warm ? "warm: " : "cold: ") << r.out;
    const size_t from = r.err.find("Traceback"), to = r.err.find("ValueError: in exec");
    ASSERT_NE(from, std::string::npos) << r.err;
    ASSERT_NE(to, std::string::npos) << r.err;
    const std::string tb = r.err.substr(from, to - from);
    EXPECT_EQ(CountOf(tb, "File \"<string>\""), 2) << tb;
    if (!warm) cold_tb = tb;
    else EXPECT_EQ(tb, cold_tb);
  }
}

// A worker's spec goes to its waiting child as one datagram: an environment larger than the
// socket's default buffer (two variables of 120 KB, as a big exported config can be) still goes
// warm; it used to send every worker cold without a word.
TEST_F(Warm, ALargeEnvironmentStillStartsWarm) {
  std::ofstream(dir_ / "which.py") << "import sys\nprint('preloaded' if 'wave' in sys.modules else 'fresh')\n";
  std::vector<std::string> env = kPythonEnv;
  env.push_back("CTRUN_TEST_BIG1=" + std::string(120000, 'a'));
  env.push_back("CTRUN_TEST_BIG2=" + std::string(120000, 'b'));
  RunResult r = RunCommand(Ctrun(2, 0, {"--warm", "--warm-preload=wave"}, {dir_ / "which.py"}), env, 60s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(StartedWarm(r)) << r.err;
  EXPECT_EQ(CountOf(r.out, "preloaded"), 2) << r.out << r.err;
  EXPECT_EQ(r.err.find("cold"), std::string::npos) << r.err;
}

// What rank 0 reads from stdin is the bytes piped in: no newline translation ("\r", "\r\n").
TEST_F(Warm, StdinIsReadWithoutNewlineTranslationAsCold) {
  std::ofstream(dir_ / "cat.py") << "import sys\nprint(repr(sys.stdin.read()), sys.stdin.mode)\n";
  for (const bool warm : {false, true}) {
    std::vector<std::string> argv{"/bin/sh", "-c", "printf 'a\\rb\\r\\nc\\n' | exec \"$@\"", "sh"};
    std::vector<std::string> flags{"--log-prefix", "none"};
    if (warm) flags.insert(flags.end(), {"--warm", "--warm-preload=json"});
    for (const std::string& a : Ctrun(1, 0, flags, {dir_ / "cat.py"})) argv.push_back(a);
    RunResult r = RunCommand(argv, kPythonEnv, 60s);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(StartedWarm(r), warm) << r.err;
    EXPECT_EQ(r.out, "'a\\rb\\r\\nc\\n' r\n") << (warm ? "warm" : "cold");
  }
}

// The warm path hands argv, the environment and the working directory over as JSON text: one
// that is not UTF-8 starts the workers cold, with one warning, instead of failing.
TEST_F(Warm, AnEnvironmentThatIsNotUtf8StartsColdWithOneWarning) {
  RunResult r = RunCommand(Ctrun(1, 0, {"--warm", "--warm-preload=json"}, Probe(dir_.path(), {"--exit", "0"})),
                           {"PYTHON_EXEC=/usr/bin/python3", "BADVAR=caf\xe9"}, 60s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(CountOf(r.err, "the environment variable BADVAR is not valid UTF-8"), 1) << r.err;
  EXPECT_FALSE(StartedWarm(r)) << r.err;
  EXPECT_EQ(CountOf(r.out, "probe rank 0 attempt 0"), 1) << r.out;
}

TEST_F(Warm, NonPythonEntrypointStartsColdWithOneWarning) {
  RunResult r = RunCommand(Ctrun(2, 0, {"--warm"}, {FAKE_WORKER, "--exit", "0"}), {}, 60s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(CountOf(r.err, "--warm: the entrypoint is not a Python script"), 1) << r.err;
  EXPECT_FALSE(StartedWarm(r));
}

// --run_path workers (`python -u -c <bootstrap> SCRIPT ARGS`, agent/run_path.h) are forked from
// the server too and cannot be told from cold ones: the probe's whole record (run by
// runpy.run_path) is a cold run's; an uncaught exception gives the cold traceback (the bootstrap's
// "<string>" frames and the script's, none of the server's), exit 1 and the same error file
// message; SystemExit keeps its code.
TEST_F(Warm, RunPathWorkerLooksExactlyLikeAColdOne) {
  const std::string cold = dir_ / "cold", warm = dir_ / "warm";
  std::string traceback[2], message[2];
  for (const bool w : {false, true}) {
    const std::string out = w ? warm : cold;
    std::filesystem::create_directories(out);
    std::vector<std::string> flags{"--run_path"};
    if (w) flags = {"--warm", "--warm-preload=json", "--run_path"};
    RunResult ok = RunCommand(Ctrun(2, 0, flags, Probe(out, {"--exit", "0"})), kPythonEnv, 60s);
    ASSERT_EQ(ok.exit_code, 0) << ok.err;
    EXPECT_EQ(StartedWarm(ok), w) << ok.err;
    EXPECT_EQ(ok.err.find("start cold"), std::string::npos) << ok.err;
    RunResult code = RunCommand(Ctrun(1, 0, flags, Probe(out, {"--exit", "7"})), kPythonEnv, 60s);
    EXPECT_EQ(code.exit_code, 7) << code.err;
    TempDir logs;
    flags.insert(flags.end(), {"--log_dir", logs.path(), "--rdzv_id", "rp"});
    RunResult raised = RunCommand(Ctrun(1, 0, flags, Probe(out, {"--raise"})), kPythonEnv, 60s);
    EXPECT_EQ(raised.exit_code, 1) << raised.err;
    EXPECT_EQ(StartedWarm(raised), w) << raised.err;
    const size_t from = raised.err.find("Traceback (most recent call last):");
    const size_t to = raised.err.find("ValueError: probe raised on purpose", from);
    ASSERT_NE(to, std::string::npos) << raised.err;
    traceback[w] = raised.err.substr(from, to - from);
    for (const auto& e : std::filesystem::recursive_directory_iterator(logs.path()))
      if (e.path().filename() == "error.json")
        message[w] = json::parse(ReadFileOr(e.path()), nullptr, false)["message"]["message"].get<std::string>();
  }
  for (int rank = 0; rank < 2; ++rank) ExpectSameRecord(cold, warm, rank);
  EXPECT_EQ(traceback[0], traceback[1]);
  EXPECT_NE(traceback[1].find("File \"<string>\", line"), std::string::npos) << traceback[1];
  EXPECT_NE(traceback[1].find(std::string("File \"") + WARM_PROBE + "\", line"), std::string::npos) << traceback[1];
  EXPECT_EQ(traceback[1].find("ctrun-warm"), std::string::npos) << traceback[1];
  EXPECT_EQ(message[0], "ValueError: probe raised on purpose");
  EXPECT_EQ(message[1], message[0]);
}

TEST_F(Warm, ServerWithAThreadFallsBackCold) {
  std::ofstream(dir_ / "threader.py") << "import threading, time\n"
                                         "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n";
  RunResult r = RunCommand(Ctrun(2, 0, {"--warm", "--warm-preload=threader"}, Probe(dir_.path(), {"--exit", "0"})),
                           {"PYTHON_EXEC=/usr/bin/python3", "PYTHONPATH=" + dir_.path()}, 60s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(CountOf(r.err, "--warm: the warm server has 2 threads"), 1) << r.err;
  EXPECT_NE(r.err.find("workers start cold"), std::string::npos) << r.err;
}

TEST_F(Warm, ServerWithCudaInitialisedFallsBackCold) {
  // A stand-in torch whose CUDA reports itself initialised (no GPU needed).
  std::filesystem::create_directories(dir_ / "torch");
  std::ofstream(dir_ / "torch/__init__.py") << "class cuda:\n    @staticmethod\n    def is_initialized():\n"
                                               "        return True\n";
  RunResult r = RunCommand(Ctrun(1, 0, {"--warm", "--warm-preload=torch"}, Probe(dir_.path(), {"--exit", "0"})),
                           {"PYTHON_EXEC=/usr/bin/python3", "PYTHONPATH=" + dir_.path()}, 60s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(CountOf(r.err, "--warm: CUDA was initialised while preloading"), 1) << r.err;
}

// The CUDA driver initialised by a preloaded library behind torch's back (torch.cuda's own flag
// still false): the driver in the server answers that it is initialised. A stand-in libcuda.so,
// loaded by path.
TEST_F(Warm, ServerWithTheCudaDriverInitialisedFallsBackCold) {
  std::ofstream(dir_ / "driver_user.py") << "import ctypes\nLIB = ctypes.CDLL('" << FAKE_LIBCUDA << "')\nLIB.cuInit(0)\n";
  RunResult r = RunCommand(Ctrun(1, 0, {"--warm", "--warm-preload=driver_user"}, Probe(dir_.path(), {"--exit", "0"})),
                           {"PYTHON_EXEC=/usr/bin/python3", "PYTHONPATH=" + dir_.path()}, 60s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(CountOf(r.err, "--warm: CUDA was initialised while preloading (the CUDA driver, libcuda, is initialised)"),
            1)
      << r.err;
  EXPECT_FALSE(StartedWarm(r)) << r.err;
}

// libcuda mapped but never called, as after `import torch` with every CUDA build of torch 2.x (a
// library of torch's links it): the server forks.
TEST_F(Warm, ServerWithTheCudaDriverOnlyMappedStartsWarm) {
  std::ofstream(dir_ / "driver_user.py") << "import ctypes\nLIB = ctypes.CDLL('" << FAKE_LIBCUDA << "')\n";
  RunResult r = RunCommand(Ctrun(1, 0, {"--warm", "--warm-preload=driver_user"}, Probe(dir_.path(), {"--exit", "0"})),
                           {"PYTHON_EXEC=/usr/bin/python3", "PYTHONPATH=" + dir_.path()}, 60s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(StartedWarm(r)) << r.err;
  EXPECT_EQ(r.err.find("cold"), std::string::npos) << r.err;
}

// OpenBLAS (numpy's, in its wheels) starts a thread pool when it loads, one thread per CPU unless
// OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS or OMP_NUM_THREADS says otherwise: the server preloads it
// with no pool and still forks, and each worker gets the pool a cold one reads from its
// environment. A stand-in OpenBLAS, loaded by path; cold and warm print the same.
TEST_F(Warm, APreloadedOpenBlasLeavesTheServerOneThreadAndTheWorkerItsOwnPool) {
  std::ofstream(dir_ / "blas_user.py") << "import ctypes\nLIB = ctypes.CDLL('" << FAKE_OPENBLAS << "')\n";
  std::ofstream(dir_ / "show_blas.py") << "import os, blas_user\n"
                                          "print('pool', blas_user.LIB.scipy_openblas_get_num_threads64_(),"
                                          " 'threads', len(os.listdir('/proc/self/task')))\n";
  for (const bool warm : {false, true}) {
    const std::vector<std::string> flags =
        warm ? std::vector<std::string>{"--warm", "--warm-preload=blas_user"} : std::vector<std::string>{};
    RunResult r = RunCommand(Ctrun(1, 0, flags, {dir_ / "show_blas.py"}),
                             {"PYTHON_EXEC=/usr/bin/python3", "PYTHONPATH=" + dir_.path(), "OMP_NUM_THREADS=3"}, 60s);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("pool 3 threads 3"), std::string::npos) << (warm ? "warm: " : "cold: ") << r.out << r.err;
    if (warm) {
      EXPECT_TRUE(StartedWarm(r)) << r.err;
      EXPECT_EQ(r.err.find("cold"), std::string::npos) << r.err;
    }
  }
}

TEST_F(Warm, PreloadFailureFallsBackCold) {
  RunResult r = RunCommand(Ctrun(1, 0, {"--warm", "--warm-preload=no_such_module_ctrun"}, Probe(dir_.path(), {"--exit", "0"})),
                           kPythonEnv, 60s);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(CountOf(r.err, "--warm: cannot preload no_such_module_ctrun"), 1) << r.err;
}

TEST_F(Warm, ChangedPreloadedFileRestartsTheServer) {
  const std::string mod = dir_ / "warm_mod.py";
  std::ofstream(mod) << "VALUE = 1\n";
  RunResult r = RunCommand(Ctrun(2, 1, {"--warm", "--warm-preload=warm_mod"},
                                 Probe(dir_.path(), {"--touch", mod, "--print-module", "warm_mod", "--exit", "1",
                                                     "--exit-attempt", "0", "--barrier", "2"})),
                           {"PYTHON_EXEC=/usr/bin/python3", "PYTHONPATH=" + dir_.path()}, 60s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(CountOf(r.err, "warm_mod.py changed on disk; restarting the warm server"), 1) << r.err;
  EXPECT_EQ(CountOf(r.err, "--warm: worker server pid"), 2) << r.err;
  // In attempt 0 the first rank to exit 1 gets the other stopped, perhaps before it wrote its file.
  json first = ReadProbe(dir_.path(), 0, 0);
  if (!first.is_object()) first = ReadProbe(dir_.path(), 0, 1);
  EXPECT_EQ(first["modules_module"], 1);
  EXPECT_EQ(ReadProbe(dir_.path(), 1, 0)["modules_module"], 2) << "attempt 1 must see the file as changed";
}

// Without a cgroup, what an attempt leaves behind is found among ctrun's descendants: the warm
// server and its waiting children are not leftovers, and a restart reuses them.
TEST_F(Warm, WithoutACgroupTheServerOutlivesAFailedAttempt) {
  RunResult r = RunCommand(Ctrun(2, 1, {"--warm", "--warm-preload=json"},
                                 Probe(dir_.path(), {"--exit", "1", "--exit-attempt", "0"})),
                           {"PYTHON_EXEC=/usr/bin/python3", "CTRUN_NO_CGROUP=1"}, 60s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(CountOf(r.err, "--warm: worker server pid"), 1) << r.err;
  EXPECT_EQ(CountOf(r.err, "left running outside their process groups"), 0) << r.err;
  EXPECT_TRUE(ReadProbe(dir_.path(), 1, 0).is_object());
}

TEST_F(Warm, NothingSurvivesSigkillOfCtrun) {
  BackgroundProcess ctrun(
      Ctrun(2, 1, {"--warm", "--warm-preload=json"}, Probe(dir_.path(), {"--grandchild", "--sleep", "60"})), kPythonEnv,
      dir_ / "out.txt", dir_ / "err.txt");
  ASSERT_TRUE(WaitFor([&] { return ReadProbe(dir_.path(), 0, 1).is_object() && ReadProbe(dir_.path(), 0, 0).is_object(); },
                      30s));
  // The watchdog, the server, two workers, their two children and the next attempt's two waiting
  // children. The workers' children are reparented when their worker dies: only the watchdog,
  // told of each worker's group before the worker ran, can kill them.
  std::vector<pid_t> procs;
  ASSERT_TRUE(WaitFor([&] { return (procs = LiveDescendants(ctrun.pid())).size() >= 8; }, 30s))
      << procs.size() << " processes; " << ReadFileOr(dir_ / "err.txt");
  for (int rank : {0, 1}) {
    const json probe = ReadProbe(dir_.path(), 0, rank);
    ASSERT_TRUE(probe["grandchild"].is_number_integer());
    if (std::find(procs.begin(), procs.end(), probe["grandchild"].get<pid_t>()) == procs.end())
      procs.push_back(probe["grandchild"].get<pid_t>());
  }
  ctrun.Signal(SIGKILL);
  EXPECT_EQ(ctrun.Wait(10s), 128 + SIGKILL);
  for (pid_t p : procs) EXPECT_TRUE(WaitFor([&] { return !ProcessAlive(p); }, 10s)) << "pid " << p << " survived";
}

// Children are forked ahead for the next attempt only when there can be one: with
// --max_restarts=0 the job is the watchdog, the server and the two workers, all along.
TEST_F(Warm, NoChildrenAreForkedAheadWhenNoAttemptCanFollow) {
  for (const int max_restarts : {1, 0}) {
    TempDir d;
    BackgroundProcess ctrun(Ctrun(2, max_restarts, {"--warm", "--warm-preload=json"}, Probe(d.path(), {"--sleep", "2"})),
                            kPythonEnv, d / "out.txt", d / "err.txt");
    ASSERT_TRUE(WaitFor([&] { return ReadProbe(d.path(), 0, 1).is_object() && ReadProbe(d.path(), 0, 0).is_object(); },
                        30s))
        << ReadFileOr(d / "err.txt");
    if (max_restarts == 1) {
      // The positive control: the next attempt's two children appear beside the four.
      EXPECT_TRUE(WaitFor([&] { return LiveDescendants(ctrun.pid()).size() >= 6; }, 10s)) << ReadFileOr(d / "err.txt");
    } else {
      size_t most = 0;
      // Until the workers end (2 s of sleep): never more than the watchdog, the server, two workers.
      WaitFor([&] {
        const size_t n = LiveDescendants(ctrun.pid()).size();
        most = std::max(most, n);
        return n < 4;
      }, 10s);
      EXPECT_EQ(most, 4u) << ReadFileOr(d / "err.txt");
    }
    EXPECT_EQ(ctrun.Wait(30s), 0) << ReadFileOr(d / "err.txt");
  }
}

// A cold worker's interpreter shutdown closes the files its script left open (flushing them) and
// runs its objects' __del__; a warm worker, which ends through os._exit, must too.
TEST_F(Warm, ScriptFilesLeftOpenAreFlushedAndDelRunsAsCold) {
  std::ofstream(dir_ / "unclosed.py") << "import os, sys\n"
                                         "class Bye:\n"
                                         "    def __del__(self):\n"
                                         "        print('del ran', os.getpid() > 0, file=sys.stderr)\n"
                                         "log = open(sys.argv[1] + '/out' + os.environ['RANK'], 'w')\n"
                                         "log.write('written, never closed\\n')\n"
                                         "bye = Bye()\n";
  for (const bool warm : {false, true}) {
    TempDir out;
    std::vector<std::string> flags;
    if (warm) flags = {"--warm", "--warm-preload=json"};
    RunResult r = RunCommand(Ctrun(2, 0, flags, {dir_ / "unclosed.py", out.path()}), kPythonEnv, 60s);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(StartedWarm(r), warm) << r.err;
    for (int rank = 0; rank < 2; ++rank)
      EXPECT_EQ(ReadFileOr(out / ("out" + std::to_string(rank))), "written, never closed\n") << (warm ? "warm" : "cold");
    EXPECT_EQ(CountOf(r.err, "del ran True"), 2) << r.err;
  }
}

// The same for a file that a function left open when it raised or called sys.exit (the traceback
// holds its frame), and for one that a module of the user's own code outside the script's
// directory (a source tree on PYTHONPATH) opened at import.
TEST_F(Warm, FilesHeldByAFailingFrameOrALibraryOfTheUsersAreFlushedAsCold) {
  std::filesystem::create_directories(dir_ / "src/mylib");
  std::filesystem::create_directories(dir_ / "scripts");
  std::ofstream(dir_ / "src/mylib/__init__.py") << "import os, sys\n"
                                                   "LOG = open(sys.argv[1] + '/lib' + os.environ['RANK'], 'w')\n";
  std::ofstream(dir_ / "scripts/s.py") << "import os, sys\nimport mylib\n"
                                          "def main():\n"
                                          "    f = open(sys.argv[1] + '/local' + os.environ['RANK'], 'w')\n"
                                          "    f.write('local\\n')\n"
                                          "    mylib.LOG.write('lib\\n')\n"
                                          "    if sys.argv[2] == 'raise':\n"
                                          "        raise RuntimeError('boom')\n"
                                          "    sys.exit(3)\n"
                                          "main()\n";
  for (const std::string how : {"raise", "exit"}) {
    for (const bool warm : {false, true}) {
      TempDir out;
      std::vector<std::string> flags;
      if (warm) flags = {"--warm", "--warm-preload=json"};
      RunResult r = RunCommand(Ctrun(1, 0, flags, {dir_ / "scripts/s.py", out.path(), how}),
                               {"PYTHON_EXEC=/usr/bin/python3", "PYTHONPATH=" + (dir_ / "src")}, 60s);
      EXPECT_EQ(r.exit_code, how == "raise" ? 1 : 3) << r.err;
      EXPECT_EQ(StartedWarm(r), warm) << r.err;
      EXPECT_EQ(ReadFileOr(out / "local0"), "local\n") << how << (warm ? " warm" : " cold");
      EXPECT_EQ(ReadFileOr(out / "lib0"), "lib\n") << how << (warm ? " warm" : " cold");
    }
  }
}

// What the interpreter's shutdown does, a warm worker does too (found by the compat review): a
// script that closed sys.stdout (the "print into a log file" idiom) exits 0, not 120; a buffered
// file that only a library module holds (a preloaded one: json) is flushed, and a gzip file is
// closed with its trailer; __main__ has its __annotations__; os.environ's type is named _Environ.
TEST_F(Warm, AClosedStdoutAndFilesHeldByLibraryModulesEndAsCold) {
  std::ofstream(dir_ / "s.py") << "import gzip, json, os, sys\n"
                                  "r = os.environ['RANK']\n"
                                  "print('annotations', __annotations__, type(os.environ).__name__, file=sys.stderr)\n"
                                  "json.sidecar = open(sys.argv[1] + '/side' + r, 'w')\n"
                                  "json.sidecar.write('side-data')\n"
                                  "json.zipped = gzip.open(sys.argv[1] + '/z' + r + '.gz', 'wt')\n"
                                  "json.zipped.write('zipped-data')\n"
                                  "with open(sys.argv[1] + '/log' + r, 'w') as f:\n"
                                  "    sys.stdout = f\n"
                                  "    print('logged')\n";
  for (const bool warm : {false, true}) {
    TempDir out;
    std::vector<std::string> flags;
    if (warm) flags = {"--warm", "--warm-preload=json,gzip"};
    RunResult r = RunCommand(Ctrun(2, 0, flags, {dir_ / "s.py", out.path()}), kPythonEnv, 60s);
    const std::string how = warm ? "warm" : "cold";
    ASSERT_EQ(r.exit_code, 0) << how << "\n" << r.err;
    EXPECT_EQ(StartedWarm(r), warm) << r.err;
    EXPECT_EQ(CountOf(r.err, "annotations {} _Environ"), 2) << how << "\n" << r.err;
    for (const std::string rank : {"0", "1"}) {
      EXPECT_EQ(ReadFileOr(out / ("log" + rank)), "logged\n") << how;
      EXPECT_EQ(ReadFileOr(out / ("side" + rank)), "side-data") << how;
      RunResult z = RunCommand({"/usr/bin/python3", "-c", "import gzip,sys; print(gzip.open(sys.argv[1], 'rt').read())",
                                out / ("z" + rank + ".gz")},
                               {}, 30s);
      EXPECT_EQ(z.out, "zipped-data\n") << how << ": " << z.err;
    }
  }
}

// The exit's closing of files never waits on a daemon thread blocked in a pipe (reading a helper's
// output, writing to a child that does not read): the interpreter leaves those alone, so must a
// warm worker (it hung for ever). A sys.stdout of the script's own without `closed` (a tee-like
// Logger class) counts as open, as for the interpreter: exit 0, not 120, and its file is flushed.
TEST_F(Warm, ExitNeverWaitsOnAThreadBlockedInAPipeAndACustomStdoutIsNoError) {
  std::ofstream(dir_ / "reader.py") << "import subprocess, threading, time\n"
                                       "p = subprocess.Popen(['sleep', '1000'], stdout=subprocess.PIPE)\n"
                                       "threading.Thread(target=lambda: [l for l in p.stdout], daemon=True).start()\n"
                                       "time.sleep(0.2)\n";
  std::ofstream(dir_ / "writer.py") << "import subprocess, threading, time\n"
                                       "p = subprocess.Popen(['sleep', '1000'], stdin=subprocess.PIPE)\n"
                                       "def feed():\n"
                                       "    while True:\n"
                                       "        p.stdin.write(b'x' * 1000)\n"
                                       "threading.Thread(target=feed, daemon=True).start()\n"
                                       "time.sleep(0.2)\n";
  std::ofstream(dir_ / "logger.py") << "import os, sys\n"
                                       "class Logger:\n"
                                       "    def __init__(self, name):\n"
                                       "        self.terminal, self.log = sys.stdout, open(name, 'a')\n"
                                       "    def write(self, m):\n"
                                       "        self.terminal.write(m)\n"
                                       "        self.log.write(m)\n"
                                       "    def flush(self):\n"
                                       "        pass\n"
                                       "sys.stdout = Logger(sys.argv[1] + '/log' + os.environ['RANK'])\n"
                                       "print('training done')\n";
  for (const std::string script : {"reader.py", "writer.py", "logger.py"}) {
    TempDir out;
    const auto start = std::chrono::steady_clock::now();
    RunResult r = RunCommand(Ctrun(1, 0, {"--warm", "--warm-preload=json"}, {dir_ / script, out.path()}), kPythonEnv,
                             30s);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(r.exit_code, 0) << script << "\n" << r.err;
    EXPECT_TRUE(StartedWarm(r)) << r.err;
    EXPECT_LT(took, 15.0) << script;
    if (script == "logger.py") {
      EXPECT_EQ(ReadFileOr(out / "log0"), "training done\n");
    }
  }
}

// --warm-preload=@script preloads the script's installed imports, never its own modules (they may
// read RANK or LOCAL_RANK at import), and resolves them from the script's directory, not from the
// working directory, where a module of the same name must not shadow the script's.
TEST_F(Warm, ScriptPreloadLeavesTheScriptsOwnModulesToTheWorker) {
  std::filesystem::create_directories(dir_ / "sub");
  std::ofstream(dir_ / "sub/helperx.py") << "import os\nWHO = 'sub'\nLOCAL_RANK = os.environ.get('LOCAL_RANK')\n";
  std::ofstream(dir_ / "helperx.py") << "WHO = 'cwd'\nLOCAL_RANK = None\n";
  std::ofstream(dir_ / "sub/t.py") << "import json\nimport helperx\nimport os\n"
                                      "print('helper', helperx.WHO, helperx.LOCAL_RANK, os.environ['LOCAL_RANK'])\n";
  std::vector<std::string> argv{"/bin/sh", "-c", "cd \"$1\" && shift && exec \"$@\"", "sh", dir_.path()};
  for (const std::string& a : Ctrun(2, 0, {"--warm", "--warm-preload=json,@script", "--log-prefix", "none"}, {"sub/t.py"}))
    argv.push_back(a);
  RunResult r = RunCommand(argv, kPythonEnv, 60s);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(StartedWarm(r)) << r.err;
  EXPECT_EQ(CountOf(r.out, "helper sub 0 0\n"), 1) << r.out;
  EXPECT_EQ(CountOf(r.out, "helper sub 1 1\n"), 1) << r.out;
}

// torch is imported in the server already: a script that sets OMP_NUM_THREADS or
// TORCH_DISTRIBUTED_DEBUG before `import torch` still gets what a cold import would read.
TEST_F(Warm, VariablesTheScriptSetsBeforeImportingTorchApplyAsCold) {
  std::ofstream(dir_ / "omp.py") << "import os\n"
                                    "os.environ['OMP_NUM_THREADS'] = '2'\n"
                                    "os.environ['TORCH_DISTRIBUTED_DEBUG'] = 'DETAIL'\n"
                                    "import torch\nimport torch.distributed as dist\n"
                                    "print('threads', torch.get_num_threads(), dist.get_debug_level())\n";
  // Cold, then warm: the script prints `expected`.
  auto same_both_ways = [&](const std::string& script, const std::string& expected) {
    for (const bool warm : {false, true}) {
      std::vector<std::string> flags{"--log-prefix", "none"};
      if (warm) flags.insert(flags.end(), {"--warm", "--warm-preload=torch,torch.distributed"});
      RunResult r = RunCommand(Ctrun(1, 0, flags, {dir_ / script}), kPythonEnv, 120s);
      ASSERT_EQ(r.exit_code, 0) << r.err;
      EXPECT_EQ(StartedWarm(r), warm) << r.err;
      EXPECT_EQ(r.out, expected) << script << (warm ? " warm" : " cold");
    }
  };
  same_both_ways("omp.py", "threads 2 DebugLevel.DETAIL\n");
  // Set after `import torch`, OMP_NUM_THREADS changes nothing, warm or cold.
  std::ofstream(dir_ / "late.py") << "import os, torch\nos.environ['OMP_NUM_THREADS'] = '2'\n"
                                     "print('threads', torch.get_num_threads())\n";
  same_both_ways("late.py", "threads 1\n");
}

TEST_F(Warm, TrainPyColdAndWarmEndBitIdenticalAfterAMidEpochCrash) {
  if (!ctrun::testing::PythonCanImport("torch.distributed")) GTEST_SKIP() << "Debian python3-torch not importable";
  // 3 ranks: with 2 the sum of two contributions is the same in any order and would hide a
  // layout-dependent reduction. 512 samples / 3 ranks / 16 = 11 steps per epoch; the crash at step
  // 14 is neither a snapshot (every 5) nor an epoch boundary.
  const std::vector<std::string> train{TRAIN_PY, "--epochs", "2", "--quiet"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> v = train;
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
  };
  RunResult ref = RunCommand(Ctrun(3, 0, {}, with({"--out", dir_ / "ref.txt"})), kPythonEnv, 150s);
  ASSERT_EQ(ref.exit_code, 0) << ref.err;
  const std::string expected = ReadFileOr(dir_ / "ref.txt");
  ASSERT_FALSE(expected.empty());
  // Identical NaNs would pass the comparison: the reference must be a trained model (0000c0ff is
  // float32's quiet NaN as train.py writes it).
  ASSERT_EQ(expected.find("0000c0ff"), std::string::npos) << "the reference run diverged";
  const std::vector<std::string> crash{"--snapshot-every", "5", "--fail-at-step", "14", "--fail-rank", "1"};
  for (const bool warm : {false, true}) {
    const std::string tag = warm ? "warm" : "cold";
    std::vector<std::string> flags;
    if (warm) flags = {"--warm"};
    std::vector<std::string> args = with({"--snapshot-dir", dir_ / ("snap-" + tag), "--out", dir_ / (tag + ".txt")});
    args.insert(args.end(), crash.begin(), crash.end());
    RunResult r = RunCommand(Ctrun(3, 1, flags, args), kPythonEnv, 150s);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(StartedWarm(r), warm) << r.err;
    EXPECT_EQ(CountOf(r.out, "resumed from snapshot at step 10"), 1) << r.out;
    EXPECT_EQ(ReadFileOr(dir_ / (tag + ".txt")), expected) << tag << ": parameters differ after the crash";
    // The live line names the rank that crashed, not one that died of its closed connection.
    // The error file the worker wrote (torch's @record, warm or cold) is where the message comes from.
    EXPECT_NE(r.err.find("root cause: worker rank 1 "), std::string::npos) << r.err;
    // Python exits 1 after the traceback, or torch 1.13 aborts in the interpreter's shutdown when
    // a gloo thread is still joinable ("terminate called without an active exception", seen once
    // in a CI run), or a rank that lost its peer ends first, ctrun knows rank 1's recorded failure
    // and stops the attempt while rank 1 is still in its shutdown (seen once in a CI run): either
    // way the message is the one rank 1 recorded.
    const std::string message = ": RuntimeError: injected failure at step 14 on rank 1";
    const bool exited = r.err.find("exited with code 1" + message) != std::string::npos;
    const bool aborted = r.err.find("killed by signal 6 (SIGABRT)" + message) != std::string::npos;
    const bool stopped =
        r.err.find("failed on its own and was then killed by signal 15 (SIGTERM) as ctrun stopped the attempt" +
                   message) != std::string::npos;
    EXPECT_TRUE(exited || aborted || stopped) << r.err;
  }
}

}  // namespace
}  // namespace ctrun::warm
