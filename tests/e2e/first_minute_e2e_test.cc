// End-to-end tests of what a new user meets in the first minute (issue 9): set-up failures that
// name the problem, Python interpreter choice, torchrun's placeholders, usage errors, leftovers of
// escaped descendants (and the cgroup sub-tree), where log files went, and the failure summary's
// torchrun layout. The real ctrun binary against ctrun_fake_worker; every wait polls a deadline.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "helpers/ctrun_command.h"
#include "helpers/free_port.h"
#include "helpers/test_util.h"

namespace ctrun::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

std::string EnvValue(const std::string& env_dump, const std::string& key) {
  for (const auto& l : SplitLines(env_dump))
    if (l.rfind(key + "=", 0) == 0) return l.substr(key.size() + 1);
  return "<unset>";
}

bool Contains(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

// ctrun's error lines ("ctrun: error: ..." or its own "[ctrun] E ..." diagnostics).
std::vector<std::string> ErrorLines(const std::string& err) {
  std::vector<std::string> out;
  for (const auto& l : SplitLines(err))
    if (l.rfind("ctrun: error: ", 0) == 0 || l.rfind("[ctrun] E ", 0) == 0) out.push_back(l);
  return out;
}

void WriteExecutable(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  ::chmod(path.c_str(), 0755);
}

// A stand-in for python: records its arguments (one per line) in $FAKEPY_ARGS.$RANK, prints
// $FAKEPY_STDERR to stderr and exits with $FAKEPY_EXIT (default 0).
std::string FakePython(const TempDir& d) {
  const std::string path = d / "fakepy";
  WriteExecutable(path,
                  "#!/bin/sh\n"
                  "for a in \"$@\"; do echo \"$a\"; done > \"$FAKEPY_ARGS.$RANK\"\n"
                  "[ -n \"$FAKEPY_STDERR\" ] && echo \"$FAKEPY_STDERR\" >&2\n"
                  "exit ${FAKEPY_EXIT:-0}\n");
  return path;
}

// A socket listening on a loopback port (closed by the destructor); port() is 0 when it could not.
class Listener {
 public:
  Listener() : fd_(BindLoopback(0, &port_)) {
    if (fd_ && ::listen(fd_.get(), 4) != 0) port_ = 0;
  }
  int port() const { return port_; }

 private:
  int port_ = 0;
  UniqueFd fd_;
};

bool HasIpv6Loopback() {
  int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// --- each bad command line: exit code and message ------------------------------------------

TEST(FirstMinuteE2E, EveryBadCommandLineHasItsExitCodeAndOneLine) {
  Listener busy;
  ASSERT_NE(busy.port(), 0);
  const std::string free_port = std::to_string(FreePort());
  const std::string w = FAKE_WORKER;
  struct Case {
    std::vector<std::string> args;
    int code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--version", "--foo"}, 2, "ctrun: error: unrecognized option '--foo'"},
      {{"--node_rank=1", w}, 2, "--node_rank=1 is out of range for --nnodes=1 (the default): node ranks are 0..0"},
      {{"--nnodes=2", "--node_rank=2", w}, 2, "--node_rank=2 is out of range for --nnodes=2"},
      {{"--standalone", "--node_rank=1", w}, 2, "--node_rank=1 with --standalone"},
      {{"--rdzv_endpoint=localhost:abc", w}, 2, "--rdzv_endpoint=localhost:abc: bad port in 'localhost:abc'"},
      {{"--rdzv_endpoint=localhost", w}, 2, "the static backend needs HOST:PORT"},
      {{"--rdzv_conf=timeout=abc", w}, 2, "--rdzv_conf timeout=abc: expected a number of seconds: "},
      {{"--standalone", "--rdzv_conf=timeout=abc", w}, 2, "--rdzv_conf timeout=abc"},
      {{"--master_addr=[::1", w}, 2, "invalid value '[::1' for --master_addr: unbalanced '['"},
      {{"--master_addr=localhost:29500", w}, 2, "--master_addr: an address takes no port here"},
      {{"--local_addr=[::1]:5", w}, 2, "--local_addr: an address takes no port here"},
      // A million needs more fds than any RLIMIT_NOFILE ctrun uses (1<<20): refused on every machine.
      {{"--nproc_per_node=1000000", w}, 2, "--nproc_per_node=1000000 is more workers than this machine allows: "},
      {{"--master_port=" + std::to_string(busy.port()), w}, 1,
       "cannot host the workers' store on 127.0.0.1:" + std::to_string(busy.port()) + ": the port is held by pid " +
           std::to_string(::getpid())},
      {{"--master_addr=nosuchhost.invalid", "--master_port=" + free_port, w}, 1,
       "cannot host the workers' store on nosuchhost.invalid:" + free_port +
           ": --master_addr=nosuchhost.invalid does not resolve"},
      {{"--master_addr=192.0.2.1", "--master_port=" + free_port, w}, 1,
       "--master_addr=192.0.2.1 is not an address of this machine"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv{CTRUN_BINARY};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    const RunResult r = RunCommand(argv, {}, 20s);
    const std::string what = c.args[0] + (c.args.size() > 1 ? " " + c.args[1] : "");
    EXPECT_EQ(r.exit_code, c.code) << what << ": " << r.err;
    const std::vector<std::string> errors = ErrorLines(r.err);
    ASSERT_EQ(errors.size(), 1u) << what << ": " << r.err;
    EXPECT_TRUE(Contains(errors[0], c.message)) << what << ":\n  got:  " << errors[0] << "\n  want: " << c.message;
    if (c.code == 2) {
      EXPECT_EQ(SplitLines(r.err).size(), 1u) << what << ": " << r.err;
    }
  }
}

TEST(FirstMinuteE2E, NoArgumentsPrintsTheUsage) {
  const RunResult r = RunCommand({CTRUN_BINARY});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err.rfind("Usage: ctrun [OPTIONS] ENTRYPOINT [ARGS...]\n", 0), 0u) << r.err;
  EXPECT_TRUE(Contains(r.err, "ctrun --help")) << r.err;
}

TEST(FirstMinuteE2E, HelpSaysWhatStandaloneIgnoresAndKeeps) {
  const RunResult r = RunCommand({CTRUN_BINARY, "--help"});
  ASSERT_EQ(r.exit_code, 0);
  std::string flat = r.out;
  std::replace(flat.begin(), flat.end(), '\n', ' ');
  flat.erase(std::unique(flat.begin(), flat.end(), [](char a, char b) { return a == ' ' && b == ' '; }), flat.end());
  EXPECT_TRUE(Contains(flat, "--rdzv-backend, --rdzv-endpoint, --master-addr and --master-port are ignored")) << r.out;
  EXPECT_TRUE(Contains(flat, "the run id is random unless --rdzv-id is given")) << r.out;
}

// --- 1. set-up failures ------------------------------------------------------------------------

TEST(FirstMinuteE2E, PortHeldByARunOfTheSameJobIsNamed) {
  TempDir d;
  const std::string port = std::to_string(FreePort());
  const std::vector<std::string> flags{"--master_port=" + port, "--rdzv_id=job9"};
  BackgroundProcess first(Ctrun(flags, {"--pid-file", d / "pids", "--hang"}), {}, d / "out", d / "err");
  ASSERT_TRUE(WaitFor([&] { return !ReadPids(d / "pids").empty(); }, 10s)) << ReadFileOr(d / "err");
  const RunResult second = RunCommand(Ctrun(flags, {"--hang"}), {}, 20s);
  EXPECT_EQ(second.exit_code, 1) << second.err;
  const std::vector<std::string> errors = ErrorLines(second.err);
  ASSERT_EQ(errors.size(), 1u) << second.err;
  EXPECT_TRUE(Contains(errors[0], "cannot host the workers' store on 127.0.0.1:" + port + ": the port is held by pid " +
                                      std::to_string(first.pid())))
      << errors[0];
  EXPECT_TRUE(Contains(errors[0], "a run of this same job (run id 'job9') that is still running: stop it (kill " +
                                      std::to_string(first.pid()) + ")"))
      << errors[0];
  first.Signal(SIGTERM);
  EXPECT_EQ(first.Wait(10s), 128 + SIGTERM);
}

TEST(FirstMinuteE2E, BracketedIpv6MasterAddrAndEndpointWork) {
  if (!HasIpv6Loopback()) GTEST_SKIP() << "no IPv6 loopback on this machine";
  TempDir d;
  const std::string port = std::to_string(FreePort());
  RunResult r = RunCommand(Ctrun({"--master_addr=[::1]", "--master_port=" + port}, {"--env-file", d / "a"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(EnvValue(ReadFileOr(d / "a.0"), "MASTER_ADDR"), "::1");
  EXPECT_EQ(EnvValue(ReadFileOr(d / "a.0"), "MASTER_PORT"), port);
  r = RunCommand(Ctrun({"--rdzv_endpoint=[::1]:" + port}, {"--env-file", d / "b"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(EnvValue(ReadFileOr(d / "b.0"), "MASTER_ADDR"), "::1");
  EXPECT_EQ(EnvValue(ReadFileOr(d / "b.0"), "MASTER_PORT"), port);
}

// --- 5. Python ---------------------------------------------------------------------------------

TEST(FirstMinuteE2E, PythonExecIsHonouredAndLogged) {
  TempDir d;
  const std::string py = FakePython(d);
  std::ofstream(d / "train.py") << "print('hi')\n";
  const RunResult r = RunCommand({CTRUN_BINARY, "--standalone", d / "train.py", "--lr", "0.1"},
                                 {"PYTHON_EXEC=" + py, "FAKEPY_ARGS=" + (d / "args")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(SplitLines(ReadFileOr(d / "args.0")), (std::vector<std::string>{"-u", d / "train.py", "--lr", "0.1"}));
  EXPECT_TRUE(Contains(r.err, "workers run under " + py + " (PYTHON_EXEC)")) << r.err;
}

TEST(FirstMinuteE2E, MissingTorchNamesTheInterpreterAndHowToChooseAnother) {
  TempDir d;
  const std::string py = FakePython(d);
  std::ofstream(d / "train.py") << "import torch\n";
  const RunResult r = RunCommand(
      {CTRUN_BINARY, "--standalone", "--nproc_per_node=2", d / "train.py"},
      {"PYTHON_EXEC=" + py, "FAKEPY_ARGS=" + (d / "args"), "FAKEPY_EXIT=1",
       "FAKEPY_STDERR=ModuleNotFoundError: No module named 'torch'"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(Contains(r.err, "note      : the worker ran under " + py +
                                  ", which cannot import torch; choose an interpreter that has it with PYTHON_EXEC, "
                                  "e.g. PYTHON_EXEC=/usr/bin/python3"))
      << r.err;
}

// An executable script whose "#!/usr/bin/env python3" finds a python3 without torch: the note
// names that interpreter and says the #! line chose it (PYTHON_EXEC would change nothing).
TEST(FirstMinuteE2E, AShebangScriptWhosePythonLacksTorchIsToldWhatChoseIt) {
  TempDir d;
  std::filesystem::create_directories(d / "bin");
  WriteExecutable(d / "bin/python3", "#!/bin/sh\necho \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n");
  WriteExecutable(d / "train", "#!/usr/bin/env python3\nimport torch\n");
  const char* path = std::getenv("PATH");
  const RunResult r = RunCommand({CTRUN_BINARY, "--standalone", "--nproc_per_node=2", d / "train"},
                                 {"PATH=" + (d / "bin") + ":" + (path ? path : "/usr/bin:/bin")});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(Contains(r.err, "note      : the worker ran under " + (d / "bin/python3") +
                                  ", which its #! line chose and which cannot import torch"))
      << r.err;
}

// torchrun runs a script as `python -u script`, so a line printed just before a crash is seen. A
// script that ctrun execs by its python #! line is unbuffered too (PYTHONUNBUFFERED=1).
TEST(FirstMinuteE2E, AScriptRunByItsPythonShebangLosesNoLineWhenItIsKilled) {
  TempDir d;
  WriteExecutable(d / "train",
                  "#!/usr/bin/python3\nimport os, signal\nprint('the last words', os.environ.get('RANK'))\n"
                  "os.kill(os.getpid(), signal.SIGKILL)\n");
  // Without the variable in ctrun's own environment (a developer's shell or CI may export it).
  const RunResult r = RunCommand({"/usr/bin/env", "-u", "PYTHONUNBUFFERED", CTRUN_BINARY, "--standalone", d / "train"});
  EXPECT_EQ(r.exit_code, 128 + 9) << r.err;
  EXPECT_TRUE(Contains(r.out, "the last words 0")) << r.out;
}

TEST(FirstMinuteE2E, NonExecutablePythonTextFileRunsUnderPythonLikeTorchrun) {
  TempDir d;
  const std::string py = FakePython(d);
  std::ofstream(d / "train") << "#!/usr/bin/env python3\nimport os\n";
  const RunResult r =
      RunCommand({CTRUN_BINARY, "--standalone", d / "train", "x"}, {"PYTHON_EXEC=" + py, "FAKEPY_ARGS=" + (d / "args")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(SplitLines(ReadFileOr(d / "args.0")), (std::vector<std::string>{"-u", d / "train", "x"}));
  EXPECT_TRUE(Contains(r.err, "is not executable and is a text file: it runs under Python")) << r.err;
}

// --run_path's bootstrap in a real interpreter (no torch needed): the script's sys.argv, __name__
// and sys.path[0] as `python SCRIPT` gives them (a directory with a __main__.py too); an uncaught
// exception lands in the error file in torchelastic's layout and exits 1; SystemExit keeps its
// code and writes nothing, as torchrun's record() does; an error file that cannot be written does
// not hide the exception.
TEST(FirstMinuteE2E, RunPathRunsTheScriptAsMainAndRecordsItsException) {
  TempDir d;
  fs::create_directories(d / "app");
  const std::string body =
      "import os, sys\n"
      "print('seen', os.environ['RANK'], __name__, sys.argv, sys.path[0], flush=True)\n"
      "print('parent on path', os.path.dirname(os.path.abspath(sys.argv[0])) in sys.path, flush=True)\n"
      "mode = sys.argv[1]\n"
      "if mode == 'raise': raise KeyError('no shard ' + os.environ['RANK'])\n"
      "if mode == 'exit': sys.exit(5)\n"
      "if mode == 'unwritable':\n"
      "    os.environ['TORCHELASTIC_ERROR_FILE'] = '/nonexistent/error.json'\n"
      "    raise KeyError('no shard ' + os.environ['RANK'])\n";
  std::ofstream(d / "train") << body;  // no .py, no exec bit: run_path runs it anyway
  std::ofstream(d / "app/__main__.py") << body;
  const std::vector<std::string> env{"PYTHON_EXEC=/usr/bin/python3"};
  auto run = [&](const std::string& script, const std::string& mode, std::vector<std::string> extra = {}) {
    std::vector<std::string> argv{CTRUN_BINARY, "--standalone", "--nproc_per_node=2", "--no_python", "--run_path"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.insert(argv.end(), {script, mode});
    return RunCommand(argv, env);
  };

  RunResult ok = run(d / "train", "ok");
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  for (const char* rank : {"0", "1"})
    EXPECT_TRUE(Contains(ok.out, "seen " + std::string(rank) + " __main__ ['" + (d / "train") + "', 'ok'] " + d.path()))
        << ok.out;
  RunResult dir = run(d / "app", "ok");
  ASSERT_EQ(dir.exit_code, 0) << dir.err;
  EXPECT_TRUE(Contains(dir.out, "__main__ ['" + (d / "app") + "', 'ok'] " + (d / "app") + "\n")) << dir.out;
  EXPECT_EQ(CountOf(dir.out, "parent on path False"), 2) << dir.out;  // as under `python DIR`

  TempDir logs;
  RunResult raised = run(d / "train", "raise", {"--log_dir", logs.path(), "--rdzv_id", "rp"});
  EXPECT_EQ(raised.exit_code, 1) << raised.err;
  EXPECT_TRUE(Contains(raised.err, "KeyError: 'no shard ")) << raised.err;  // the interpreter's traceback
  EXPECT_TRUE(Contains(raised.err, "run_script_path FAILED")) << raised.err;
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(logs.path())) {
    if (e.path().filename() != "error.json") continue;
    ++files;
    const auto j = nlohmann::json::parse(ReadFileOr(e.path()), nullptr, false);
    ASSERT_TRUE(j.is_object()) << e.path();
    EXPECT_TRUE(j["message"]["message"].get<std::string>().starts_with("KeyError: 'no shard ")) << j.dump();
    EXPECT_TRUE(Contains(j["message"]["extraInfo"]["py_callstack"].get<std::string>(), "KeyError")) << j.dump();
    EXPECT_TRUE(j["message"]["extraInfo"]["timestamp"].is_string()) << j.dump();
  }
  EXPECT_GE(files, 1);

  TempDir logs2;
  RunResult exited = run(d / "train", "exit", {"--log_dir", logs2.path(), "--rdzv_id", "rp"});
  EXPECT_EQ(exited.exit_code, 5) << exited.err;
  for (const auto& e : fs::recursive_directory_iterator(logs2.path())) EXPECT_NE(e.path().filename(), "error.json");

  // The script points the error file where it cannot be written: the exception still ends it.
  RunResult unwritable = run(d / "train", "unwritable");
  EXPECT_EQ(unwritable.exit_code, 1) << unwritable.err;
  EXPECT_TRUE(Contains(unwritable.err, "KeyError: 'no shard ")) << unwritable.err;
}

// An executable text file without a #! line cannot be exec'd (ENOEXEC); torchrun runs every
// entrypoint under Python, and so does ctrun for this one.
TEST(FirstMinuteE2E, ExecutableTextWithoutShebangRunsUnderPythonLikeTorchrun) {
  TempDir d;
  const std::string py = FakePython(d);
  std::ofstream(d / "train") << "import os\n";
  ASSERT_EQ(::chmod((d / "train").c_str(), 0755), 0);
  const RunResult r =
      RunCommand({CTRUN_BINARY, "--standalone", d / "train", "x"}, {"PYTHON_EXEC=" + py, "FAKEPY_ARGS=" + (d / "args")});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(SplitLines(ReadFileOr(d / "args.0")), (std::vector<std::string>{"-u", d / "train", "x"}));
  EXPECT_TRUE(Contains(r.err, "is a text file without a #! line (the kernel cannot execute it): it runs under Python"))
      << r.err;
}

// A script whose #! interpreter is missing fails its exec with ENOENT (127, as in a shell), which
// would read as if the script itself were missing: the message names the interpreter.
TEST(FirstMinuteE2E, AMissingShebangInterpreterIsNamed) {
  TempDir d;
  std::ofstream(d / "run") << "#!/nonexistent/bin/interp -x\necho hi\n";
  ASSERT_EQ(::chmod((d / "run").c_str(), 0755), 0);
  const RunResult r = RunCommand({CTRUN_BINARY, "--standalone", d / "run"});
  EXPECT_EQ(r.exit_code, 127) << r.err;
  EXPECT_TRUE(Contains(r.err, "cannot execute " + (d / "run") +
                                  ": the interpreter its #! line names, /nonexistent/bin/interp: No such file or directory"))
      << r.err;
}

// A bare name is looked up in PATH; one that only the working directory has gets a hint.
TEST(FirstMinuteE2E, ABareNameFoundOnlyInTheWorkingDirectoryGetsAHint) {
  TempDir d;
  std::ofstream(d / "mytool") << "#!/bin/sh\nexit 0\n";
  ASSERT_EQ(::chmod((d / "mytool").c_str(), 0755), 0);
  const RunResult r = RunCommand({"/bin/sh", "-c", "cd \"$1\" && exec \"$2\" --standalone mytool", "sh", d.path(),
                                  CTRUN_BINARY});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(SplitLines(r.err), (std::vector<std::string>{"ctrun: error: cannot execute mytool: command not found in PATH "
                                                        "(the working directory has one: give it as ./mytool)"}));
}

// What torchrun runs under Python and ctrun could not execute runs under Python too: a bare name
// that only the working directory has, as a Python script; a directory with a __main__.py; a zip
// archive (a zipapp) without a #! line.
TEST(FirstMinuteE2E, ScriptsDirectoriesAndZipappsPythonRunsRunUnderPythonLikeTorchrun) {
  TempDir d;
  const std::string py = FakePython(d);
  std::ofstream(d / "exscript") << "#!/usr/bin/env python3\nprint('hi')\n";
  ASSERT_EQ(::chmod((d / "exscript").c_str(), 0755), 0);
  std::filesystem::create_directories(d / "pkgdir");
  std::ofstream(d / "pkgdir/__main__.py") << "print('hi')\n";
  std::ofstream(d / "app.pyz") << std::string("PK\x03\x04", 4) << std::string(64, '\0');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"exscript", "is not in PATH; the working directory's Python script of that name runs under Python"},
      {"pkgdir", "is a directory with a __main__.py: it runs under Python"},
      {"./app.pyz", "is a zip archive (a zipapp): it runs under Python"}};
  for (const auto& [entry, notice] : cases) {
    std::filesystem::remove(d / "args.0");
    const RunResult r = RunCommand({"/bin/sh", "-c", "cd \"$1\" && shift && exec \"$@\"", "sh", d.path(), CTRUN_BINARY,
                                    "--standalone", entry, "x"},
                                   {"PYTHON_EXEC=" + py, "FAKEPY_ARGS=" + (d / "args")});
    ASSERT_EQ(r.exit_code, 0) << entry << ": " << r.err;
    EXPECT_EQ(SplitLines(ReadFileOr(d / "args.0")), (std::vector<std::string>{"-u", entry, "x"})) << entry;
    EXPECT_TRUE(Contains(r.err, notice)) << r.err;
  }
}

// A directory Python cannot run (no __main__.py) is named as one, given as a path or as a bare
// name PATH lacks; so is a pipe; a PET_NNODES that contradicts --standalone is named as the
// variable.
TEST(FirstMinuteE2E, ADirectoryWithoutMainAPipeAndAStandaloneNnodesFromTheEnvironmentAreNamed) {
  TempDir d;
  std::filesystem::create_directories(d / "pkgdir");
  for (const std::string entry : {"pkgdir", "./pkgdir"}) {
    const RunResult r = RunCommand(
        {"/bin/sh", "-c", "cd \"$1\" && shift && exec \"$@\"", "sh", d.path(), CTRUN_BINARY, "--standalone", entry});
    EXPECT_EQ(r.exit_code, 2) << entry << ": " << r.err;
    EXPECT_TRUE(Contains(r.err, "cannot execute " + entry + ": is a directory without a __main__.py")) << r.err;
  }
  // A script given as a pipe (`/dev/stdin`, `<(...)`): refused at once, without reading it.
  ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0600), 0);
  const RunResult fifo = RunCommand({CTRUN_BINARY, "--standalone", d / "fifo"}, {}, 20s);
  EXPECT_EQ(fifo.exit_code, 2) << fifo.err;
  EXPECT_TRUE(Contains(fifo.err, "cannot execute " + (d / "fifo") + ": a pipe, which only one worker could read once"))
      << fifo.err;
  const RunResult r = RunCommand({CTRUN_BINARY, "--standalone", FAKE_WORKER}, {"PET_NNODES=2"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(Contains(r.err, "--standalone runs a single node, but PET_NNODES=2 asks for more")) << r.err;
}

// --- 6. placeholders ---------------------------------------------------------------------------

TEST(FirstMinuteE2E, OnlyLocalRankIsReplacedUnlessAskedAndTheEscapeWorks) {
  TempDir d;
  RunResult r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2"},
                                 {"--env-file", d.path() + "/plain_${local_rank}_${rank}_key=${world_size}"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(d / "plain_1_${rank}_key=${world_size}.1"));
  r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2", "--expand-placeholders"},
                       {"--env-file", d.path() + "/all_${local_rank}_${rank}_${world_size}_$${rank}"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(d / "all_1_1_2_${rank}.1"));
}

// --- 7. accepted but wrong ---------------------------------------------------------------------

// --nproc_per_node=cpu counts the CPUs ctrun may run on; torchrun's os.cpu_count() counts them
// all. The difference is said, not silent.
TEST(FirstMinuteE2E, NprocCpuCountsTheAffinityAndSaysWhenTorchrunWouldDiffer) {
  if (::sysconf(_SC_NPROCESSORS_ONLN) < 2) GTEST_SKIP() << "needs two online CPUs";
  if (::access("/usr/bin/taskset", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/taskset (util-linux)";
  TempDir d;
  std::vector<std::string> argv{"/usr/bin/taskset", "-c", "0"};
  for (const std::string& a : Ctrun({"--standalone", "--nproc_per_node=cpu"}, {"--env-file", d / "env"})) argv.push_back(a);
  RunResult r = RunCommand(argv);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(EnvValue(ReadFileOr(d / "env.0"), "LOCAL_WORLD_SIZE"), "1");
  EXPECT_TRUE(Contains(r.err, "--nproc_per_node=cpu: 1 worker, one per CPU this process may run on (of ")) << r.err;
}

TEST(FirstMinuteE2E, LocalAddrIsMasterAddrOfAStandaloneJob) {
  TempDir d;
  const RunResult r = RunCommand(Ctrun({"--standalone", "--local_addr=localhost"}, {"--env-file", d / "env"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(EnvValue(ReadFileOr(d / "env.0"), "MASTER_ADDR"), "localhost");
}

TEST(FirstMinuteE2E, StaticBackendUsesTheRendezvousEndpoint) {
  TempDir d;
  const std::string port = std::to_string(FreePort());
  const RunResult r = RunCommand(Ctrun({"--rdzv_endpoint=127.0.0.1:" + port}, {"--env-file", d / "env"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(EnvValue(ReadFileOr(d / "env.0"), "MASTER_PORT"), port);
}

// --- 8. leftovers ------------------------------------------------------------------------------

TEST(FirstMinuteE2E, EscapedSetsidGrandchildrenAreGoneAfterRestartAndExit) {
  // With the cgroup sub-tree where ctrun can make one, and with the /proc sweep (CTRUN_NO_CGROUP=1).
  for (const std::vector<std::string>& env : {std::vector<std::string>{}, std::vector<std::string>{"CTRUN_NO_CGROUP=1"}}) {
    TempDir d;
    const std::string what = env.empty() ? "default" : env[0];
    // Every worker leaves a setsid() grandchild behind. Attempt 0: once all four are recorded,
    // rank 1 fails; attempt 1 succeeds at once.
    const std::string go = d / "go";
    BackgroundProcess p(Ctrun({"--standalone", "--nproc_per_node=2", "--max_restarts=1"},
                              {"--pid-file", d / "pids", "--detached-grandchild", "--wait-file", go, "--only-rank",
                               "1", "--only-attempt", "0", "--exit", "3"}),
                        env, d / "out", d / "err");
    ASSERT_TRUE(WaitFor([&] { return ReadPids(d / "pids").size() == 4; }, 10s)) << what << ": " << ReadFileOr(d / "err");
    std::ofstream(go).put('x');
    ASSERT_EQ(p.Wait(20s), 0) << what << ": " << ReadFileOr(d / "err");
    const std::vector<pid_t> pids = ReadPids(d / "pids");
    ASSERT_EQ(pids.size(), 8u) << what;  // 2 attempts x 2 workers x (worker + grandchild)
    for (pid_t pid : pids) EXPECT_FALSE(ProcessAlive(pid)) << what << ": pid " << pid << " outlived ctrun";
    EXPECT_TRUE(Contains(ReadFileOr(d / "err"), "process(es) the workers left running outside their process groups"))
        << what << ": " << ReadFileOr(d / "err");
  }
}

TEST(FirstMinuteE2E, ChildrenCtrunInheritedFromItsShellAreSpared) {
  TempDir d;
  // `monitor & exec ctrun ...`: the monitor becomes ctrun's child, but it is not the workers'.
  const std::string script = "sleep 60 & echo $! > " + (d / "monitor") + "; exec " + std::string(CTRUN_BINARY) +
                             " --standalone " + FAKE_WORKER + " --detached-grandchild --pid-file " + (d / "pids");
  const RunResult r = RunCommand({"/bin/sh", "-c", script}, {"CTRUN_NO_CGROUP=1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<pid_t> monitor = ReadPids(d / "monitor");
  ASSERT_EQ(monitor.size(), 1u);
  EXPECT_TRUE(ProcessAlive(monitor[0])) << r.err;
  ::kill(monitor[0], SIGKILL);
  for (pid_t p : ReadPids(d / "pids")) EXPECT_FALSE(ProcessAlive(p)) << p;
}

// The cgroup v2 sub-tree: only where ctrun can make one (root with a writable cgroup2 mount).
TEST(FirstMinuteE2E, WorkersRunInTheJobsCgroupWhichIsRemovedAfterwards) {
  std::string mountinfo;
  {
    std::ifstream in("/proc/self/mountinfo");
    mountinfo.assign(std::istreambuf_iterator<char>(in), {});
  }
  if (::geteuid() != 0) GTEST_SKIP() << "not root: ctrun cannot create a cgroup here (it falls back to /proc)";
  if (!Contains(mountinfo, " - cgroup2 ")) GTEST_SKIP() << "no cgroup2 mount";
  TempDir d;
  const std::string go = d / "go";
  BackgroundProcess p(Ctrun({"--standalone", "--nproc_per_node=2", "--log-level=debug"},
                            {"--pid-file", d / "pids", "--detached-grandchild", "--wait-file", go}),
                      {}, d / "out", d / "err");
  ASSERT_TRUE(WaitFor([&] { return ReadPids(d / "pids").size() == 4; }, 10s)) << ReadFileOr(d / "err");
  if (!Contains(ReadFileOr(d / "err"), "workers run in cgroup ")) {
    std::ofstream(go).put('x');
    p.Wait(10s);
    GTEST_SKIP() << "the cgroup2 mount is not writable here: " << ReadFileOr(d / "err");
  }
  // Ranks get cgroups of their own only for per-rank memory.events; otherwise they share ctrun-<pid>.
  const bool per_rank = Contains(ReadFileOr(d / "err"), "(per-rank memory.events)");
  const std::string tag = "/ctrun-" + std::to_string(p.pid()) + (per_rank ? "/rank-" : "\n");
  for (pid_t pid : ReadPids(d / "pids"))
    EXPECT_TRUE(Contains(ReadFileOr("/proc/" + std::to_string(pid) + "/cgroup"), tag)) << pid;
  std::ofstream(go).put('x');
  ASSERT_EQ(p.Wait(10s), 0) << ReadFileOr(d / "err");
  for (pid_t pid : ReadPids(d / "pids")) EXPECT_FALSE(ProcessAlive(pid)) << pid;
  const std::string dir = WorkersCgroupFromLog(ReadFileOr(d / "err"));
  ASSERT_FALSE(dir.empty());
  EXPECT_FALSE(fs::exists(dir)) << dir;
}

// --- 9. where output went ----------------------------------------------------------------------

TEST(FirstMinuteE2E, TheFreshLogDirectoryIsNamedAtStartAndEndOrRemoved) {
  TempDir tmp;
  RunResult r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2", "--tee=3"}, {"--print", "1"}),
                           {"TMPDIR=" + tmp.path()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string base = tmp / "torchelastic_";
  EXPECT_TRUE(Contains(r.err, "worker log files: " + base)) << r.err;
  EXPECT_TRUE(Contains(r.err, "worker log files are in " + base)) << r.err;
  int dirs = 0;
  for (const auto& e : fs::directory_iterator(tmp.path())) dirs += e.path().filename().string().rfind("torchelastic_", 0) == 0;
  EXPECT_EQ(dirs, 1);

  TempDir tmp2;
  r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2"}, {"--print", "1"}), {"TMPDIR=" + tmp2.path()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::is_empty(tmp2.path())) << "an unlisted directory was left in " << tmp2.path();

  // A failed run that left an error file keeps it, and names it: the summary points there.
  TempDir tmp3;
  r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2"}, {"--only-rank", "1", "--exit", "3", "--error-file", "boom"}),
                 {"TMPDIR=" + tmp3.path()});
  ASSERT_EQ(r.exit_code, 3) << r.err;
  EXPECT_TRUE(Contains(r.err, "error files of this run are in " + (tmp3 / "torchelastic_"))) << r.err;
  EXPECT_FALSE(fs::is_empty(tmp3.path()));

  // A failed run that wrote no error file keeps it too (its attempts show what ran), and says so
  // without claiming error files that do not exist.
  TempDir tmp4;
  r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2"}, {"--only-rank", "1", "--exit", "3"}),
                 {"TMPDIR=" + tmp4.path()});
  ASSERT_EQ(r.exit_code, 3) << r.err;
  EXPECT_FALSE(Contains(r.err, "error files of this run are in")) << r.err;
  EXPECT_TRUE(Contains(r.err, "no worker wrote an error file; this run's log directory is kept: " +
                                  (tmp4 / "torchelastic_")))
      << r.err;
  EXPECT_FALSE(fs::is_empty(tmp4.path()));
}

// --- compatibility details -----------------------------------------------------------------------

TEST(FirstMinuteE2E, SummaryHasTorchrunsLayoutWithStoppedRanksInTheirOwnSection) {
  const RunResult r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2"},
                                       {"--only-rank", "1", "--exit", "4", "--else-hang"}));
  EXPECT_EQ(r.exit_code, 4) << r.err;
  const std::string& e = r.err;
  const size_t failures = e.find("Failures:\n  <NO_OTHER_FAILURES>\n");
  const size_t root = e.find("Root Cause (first observed failure):\n[0]:\n");
  const size_t stopped = e.find("Stopped by ctrun (not failures of their own):\n[1]:\n");
  ASSERT_NE(failures, std::string::npos) << e;
  ASSERT_NE(root, std::string::npos) << e;
  ASSERT_NE(stopped, std::string::npos) << e;
  EXPECT_LT(failures, root);
  EXPECT_LT(root, stopped);
  EXPECT_TRUE(Contains(e.substr(root, stopped - root), "rank      : 1 (local_rank: 1)")) << e;
  EXPECT_TRUE(Contains(e.substr(stopped), "rank      : 0 (local_rank: 0)")) << e;
  // torchrun's host field is Python's socket.getfqdn().
  const RunResult fqdn = RunCommand({"/usr/bin/python3", "-c", "import socket; print(socket.getfqdn())"});
  if (fqdn.exit_code == 0) {
    EXPECT_TRUE(Contains(e, "  host      : " + SplitLines(fqdn.out)[0] + "\n")) << e;
  }
}

TEST(FirstMinuteE2E, DurationsPrintWithoutTrailingZeros) {
  TempDir d;
  BackgroundProcess p(Ctrun({"--standalone"}, {"--pid-file", d / "pids", "--hang"}), {}, d / "out", d / "err");
  ASSERT_TRUE(WaitFor([&] { return !ReadPids(d / "pids").empty(); }, 10s));
  p.Signal(SIGTERM);
  EXPECT_EQ(p.Wait(10s), 128 + SIGTERM);
  EXPECT_TRUE(Contains(ReadFileOr(d / "err"), "then SIGKILL after 30 s\n")) << ReadFileOr(d / "err");
}

TEST(FirstMinuteE2E, TeeMapPrefixesOnlyTheRanksItTees) {
  TempDir d;
  const RunResult r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2", "--tee=1:1", "--log_dir", d.path()},
                                       {"--print", "1"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<std::string> lines = SplitLines(r.out);
  EXPECT_NE(std::find(lines.begin(), lines.end(), "rank 0 line 0"), lines.end()) << r.out;
  EXPECT_NE(std::find(lines.begin(), lines.end(), "[default1]:rank 1 line 0"), lines.end()) << r.out;
  const RunResult none = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2", "--tee=3:3", "--log_dir", d.path()},
                                          {"--print", "1"}));
  ASSERT_EQ(none.exit_code, 0) << none.err;
  for (const auto& l : SplitLines(none.out)) EXPECT_EQ(l.rfind("rank ", 0), 0u) << none.out;
}

}  // namespace
}  // namespace ctrun::testing
