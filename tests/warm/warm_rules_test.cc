// The rules that send a worker cold under --warm (warm/warm_rules.h): every rule has its reason.
#include "warm/warm_rules.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "ctrun/warm_main.h"
#include "helpers/test_util.h"
#include "warm/native_opt_in.h"

// This test binary carries the note CTRUN_MAIN places (CTRUN_MAIN itself would define main).
__attribute__((section(".note.ctrun.warm"), used, aligned(4))) static const ::ctrun::worker::WarmNote kNote = {
    6, 4, ::ctrun::worker::kWarmNoteType, "ctrun", ::ctrun::worker::kWarmProtocolVersion};

namespace ctrun::warm {
namespace {

SpawnSpec Spec(std::vector<std::string> argv, std::vector<std::string> env = {}) {
  SpawnSpec s;
  s.executable = argv[0];
  s.argv = std::move(argv);
  s.env = std::move(env);
  return s;
}

TEST(WarmRules, ParsesScriptAndModuleLaunches) {
  auto p = ParsePythonLaunch(Spec({"/usr/bin/python3", "-u", "train.py", "--lr", "1"}));
  ASSERT_TRUE(p);
  EXPECT_EQ(p->program, "/usr/bin/python3");
  EXPECT_EQ(p->flags, std::vector<std::string>{"-u"});
  EXPECT_FALSE(p->module);
  EXPECT_EQ(p->target, "train.py");
  auto m = ParsePythonLaunch(Spec({"/usr/bin/python3", "-u", "-m", "pkg.train", "x"}));
  ASSERT_TRUE(m);
  EXPECT_TRUE(m->module);
  EXPECT_EQ(m->target, "pkg.train");
  EXPECT_FALSE(ParsePythonLaunch(Spec({"./train", "--lr", "1"})));
  // Arguments shaped like a Python launch, to a program that is no interpreter.
  EXPECT_FALSE(ParsePythonLaunch(Spec({"./wrap.sh", "x.py"})));
  EXPECT_FALSE(ParsePythonLaunch(Spec({"./train", "--config", "cfg.py"})));
  EXPECT_FALSE(ParsePythonLaunch(Spec({"/opt/tool", "-m", "mod"})));
  EXPECT_TRUE(ParsePythonLaunch(Spec({"/venv/bin/python3.11", "x.py"})));
  EXPECT_FALSE(ParsePythonLaunch(Spec({"/usr/bin/python3", "-u", "-m"})));
}

// --run_path's workers are `python -u -c <bootstrap> SCRIPT ARGS`: the code runs in the child, and
// the script (the argument after the code) is the target @script preloading reads.
TEST(WarmRules, ParsesCodeLaunchesAndRefusesFlagsItCannotSplit) {
  auto c = ParsePythonLaunch(Spec({"/usr/bin/python3", "-u", "-c", "import sys", "/w/train", "--lr", "1"}));
  ASSERT_TRUE(c);
  EXPECT_TRUE(c->code);
  EXPECT_FALSE(c->module);
  EXPECT_EQ(c->flags, std::vector<std::string>{"-u"});
  EXPECT_EQ(c->target, "/w/train");
  auto bare = ParsePythonLaunch(Spec({"/usr/bin/python3", "-c", "print(1)"}));
  ASSERT_TRUE(bare);
  EXPECT_EQ(bare->target, "");
  EXPECT_FALSE(ParsePythonLaunch(Spec({"/usr/bin/python3", "-u", "-c"})));
  // -uc is -u -c and -uW is -u -W (their values come next), -cCODE glues the code,
  // --check-hash-based-pycs takes a value: none is a flag the server could take alone.
  for (const char* flag : {"-uc", "-um", "-uW", "-X", "-cprint(1)", "--check-hash-based-pycs", "-", "--"}) {
    EXPECT_FALSE(ParsePythonLaunch(Spec({"/usr/bin/python3", flag, "always", "train.py"}))) << flag;
    EXPECT_EQ(NotWarmEntrypoint(Spec({"/usr/bin/python3", flag, "always", "train.py"})),
              "the interpreter flag " + std::string(flag) + " is given (the warm path takes only flags without a value)");
  }
  // A value glued to -W or -X makes a whole flag (which may hold a c or an m).
  auto glued = ParsePythonLaunch(Spec({"/usr/bin/python3", "-uB", "-OO", "-Wdefault::ImportWarning", "-Xfrozen_modules=off",
                                       "train.py"}));
  ASSERT_TRUE(glued);
  EXPECT_EQ(glued->flags, (std::vector<std::string>{"-uB", "-OO", "-Wdefault::ImportWarning", "-Xfrozen_modules=off"}));
  EXPECT_EQ(glued->target, "train.py");
}

TEST(WarmRules, PinsWhatIsReadOnceAndReReadsThreadCount) {
  for (const char* name : {"PYTHONHASHSEED", "PYTHONPATH", "PYTHONOPTIMIZE", "LD_PRELOAD", "LD_LIBRARY_PATH",
                           "OMP_PROC_BIND", "KMP_AFFINITY", "MKL_NUM_THREADS", "LANG", "LC_ALL",
                           "TORCH_CPP_LOG_LEVEL"})
    EXPECT_TRUE(IsPinnedVariable(name)) << name;
  for (const char* name : {"OMP_NUM_THREADS", "RANK", "MASTER_PORT", "TORCH_DISTRIBUTED_DEBUG", "PATH"})
    EXPECT_FALSE(IsPinnedVariable(name)) << name;
}

TEST(WarmRules, CommonEnvKeepsWhatEveryWorkerShares) {
  std::vector<SpawnSpec> specs{Spec({"p", "a.py"}, {"A=1", "RANK=0", "B=2"}), Spec({"p", "a.py"}, {"A=1", "RANK=1", "B=2"})};
  EXPECT_EQ(CommonEnv(specs), (std::vector<std::string>{"A=1", "B=2"}));
}

class WarmMismatchTest : public ::testing::Test {
 protected:
  const std::vector<std::string> env_{"PATH=/bin", "PYTHONPATH=/a", "OMP_NUM_THREADS=1"};
  const SpawnSpec base_ = Spec({"/usr/bin/python3", "-u", "train.py"}, env_);
  const ServerIdentity server_ = IdentityOf(*ParsePythonLaunch(base_), env_);

  std::string With(const std::string& entry) {
    SpawnSpec s = base_;
    s.env.insert(s.env.begin(), entry);  // first entry of a name wins
    return WarmMismatch(server_, s);
  }
};

TEST_F(WarmMismatchTest, SameLaunchAndReReadVariablesMayFork) {
  EXPECT_EQ(WarmMismatch(server_, base_), "");
  EXPECT_EQ(With("OMP_NUM_THREADS=4"), "");
  EXPECT_EQ(With("RANK=3"), "");
  EXPECT_EQ(With("TORCH_DISTRIBUTED_DEBUG=DETAIL"), "");
}

TEST_F(WarmMismatchTest, EachPinnedVariableSendsTheWorkerCold) {
  for (const char* entry : {"PYTHONHASHSEED=0", "PYTHONPATH=/b", "LD_PRELOAD=/x.so", "LD_LIBRARY_PATH=/l",
                            "OMP_PROC_BIND=close", "KMP_AFFINITY=compact", "MKL_NUM_THREADS=2"}) {
    const std::string name = std::string(entry).substr(0, std::string(entry).find('='));
    const std::string why = With(entry);
    EXPECT_NE(why.find(name + " differs"), std::string::npos) << entry << ": " << why;
  }
}

TEST_F(WarmMismatchTest, InterpreterFlagsAndEntrypointKindSendTheWorkerCold) {
  EXPECT_NE(WarmMismatch(server_, Spec({"/usr/local/bin/python3", "-u", "train.py"}, env_)).find("interpreter differs"),
            std::string::npos);
  EXPECT_NE(WarmMismatch(server_, Spec({"/usr/bin/python3", "-u", "-O", "train.py"}, env_)).find("flags differ"),
            std::string::npos);
  EXPECT_NE(WarmMismatch(server_, Spec({"./train"}, env_)).find("not a Python script"), std::string::npos);
  // A flag that takes a value is named, not called "not a Python script".
  EXPECT_EQ(WarmMismatch(server_, Spec({"/usr/bin/python3", "-W", "error", "train.py"}, env_)),
            "the interpreter flag -W is given (the warm path takes only flags without a value)");
  EXPECT_NE(NotWarmEntrypoint(Spec({"./train", "-c", "x"})).find("not a Python script"), std::string::npos);
}

TEST(WarmRules, ArgumentsEnvironmentAndDirectoryMustBeUtf8) {
  EXPECT_EQ(NotUtf8(Spec({"/usr/bin/python3", "t.py", "na\u00efve"}, {"A=caf\u00e9"}), "/tmp/\u00e9t\u00e9"), "");
  EXPECT_EQ(NotUtf8(Spec({"/usr/bin/python3", "t.py", "na\xefve"}), "/tmp"),
            "an argument is not valid UTF-8 (the warm path hands it over as JSON text)");
  EXPECT_NE(NotUtf8(Spec({"/usr/bin/python3", "t.py"}, {"OK=1", "BADVAR=caf\xe9"}), "/tmp").find("the environment variable BADVAR"),
            std::string::npos);
  EXPECT_NE(NotUtf8(Spec({"/usr/bin/python3", "t.py"}, {"B\xe9=1"}), "/tmp").find("an environment variable is"),
            std::string::npos);
  EXPECT_NE(NotUtf8(Spec({"/usr/bin/python3", "t.py"}), "/tmp/dir_caf\xe9").find("the working directory's path"),
            std::string::npos);
}

TEST(WarmRules, NativeLaunchesPinLoadTimeVariablesButNotPythons) {
  for (const char* name : {"OMP_NUM_THREADS", "LD_PRELOAD", "OMP_PROC_BIND", "MKL_NUM_THREADS", "LC_ALL",
                           "TORCH_CPP_LOG_LEVEL"})
    EXPECT_TRUE(IsPinnedVariable(name, /*native=*/true)) << name;
  for (const char* name : {"PYTHONHASHSEED", "PYTHONPATH", "RANK", "PATH"})
    EXPECT_FALSE(IsPinnedVariable(name, /*native=*/true)) << name;
  const std::vector<std::string> env{"PATH=/bin", "LD_PRELOAD=", "PYTHONPATH=/a"};
  const SpawnSpec base = Spec({"/opt/train", "--lr", "1"}, env);
  const ServerIdentity server = IdentityOf(NativeLaunch(base), env);
  EXPECT_TRUE(server.launch.native);
  EXPECT_EQ(WarmMismatch(server, base), "");
  SpawnSpec other_args = Spec({"/opt/train", "--lr", "2"}, env);
  EXPECT_EQ(WarmMismatch(server, other_args), "") << "argv is the worker's own";
  SpawnSpec python = base;
  python.env.insert(python.env.begin(), "PYTHONPATH=/b");
  EXPECT_EQ(WarmMismatch(server, python), "");
  SpawnSpec preload = base;
  preload.env.insert(preload.env.begin(), "LD_PRELOAD=/x.so");
  EXPECT_NE(WarmMismatch(server, preload).find("LD_PRELOAD differs"), std::string::npos);
  EXPECT_NE(WarmMismatch(server, Spec({"/opt/other"}, env)).find("executable differs"), std::string::npos);
  SpawnSpec bound = base;
  bound.cpu_affinity = {0};
  EXPECT_NE(WarmMismatch(server, bound).find("CPU binding"), std::string::npos);
}

TEST(NativeOptIn, ReadsTheNoteFromTheFile) {
  EXPECT_TRUE(OptsIntoWarm("/proc/self/exe"));
  EXPECT_FALSE(OptsIntoWarm("/bin/sh"));
  EXPECT_FALSE(OptsIntoWarm("/no/such/file"));
  ctrun::testing::TempDir dir;
  std::ofstream(dir / "script.py") << "print(1)\n";
  EXPECT_FALSE(OptsIntoWarm(dir / "script.py"));
  // The same binary with another protocol version in its note does not opt in.
  std::ifstream in("/proc/self/exe", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  const std::string needle(reinterpret_cast<const char*>(&kNote), sizeof kNote);
  const size_t at = bytes.find(needle);
  ASSERT_NE(at, std::string::npos);
  bytes[at + offsetof(::ctrun::worker::WarmNote, version)] = 9;
  std::ofstream(dir / "patched", std::ios::binary) << bytes;
  EXPECT_FALSE(OptsIntoWarm(dir / "patched"));
}

}  // namespace
}  // namespace ctrun::warm
