// The rules that send a worker cold under --warm (warm/warm_rules.h): every rule has its reason.
#include "warm/warm_rules.h"

#include <gtest/gtest.h>

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
  EXPECT_EQ(p->interpreter, "/usr/bin/python3");
  EXPECT_EQ(p->flags, std::vector<std::string>{"-u"});
  EXPECT_FALSE(p->module);
  EXPECT_EQ(p->target, "train.py");
  auto m = ParsePythonLaunch(Spec({"/usr/bin/python3", "-u", "-m", "pkg.train", "x"}));
  ASSERT_TRUE(m);
  EXPECT_TRUE(m->module);
  EXPECT_EQ(m->target, "pkg.train");
  EXPECT_FALSE(ParsePythonLaunch(Spec({"./train", "--lr", "1"})));
  EXPECT_FALSE(ParsePythonLaunch(Spec({"/usr/bin/python3", "-c", "print(1)"})));
  EXPECT_FALSE(ParsePythonLaunch(Spec({"/usr/bin/python3", "-u", "-m"})));
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
}

}  // namespace
}  // namespace ctrun::warm
