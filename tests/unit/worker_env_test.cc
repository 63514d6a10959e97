#include "agent/worker_env.h"

#include <sys/stat.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>

#include "agent/run_path.h"
#include "health/health_monitor.h"
#include "sys/event_loop.h"

namespace ctrun {
namespace {

std::string Get(const Environment& env, const std::string& k) {
  const std::string* v = env.Get(k);
  return v ? *v : "<unset>";
}

Environment Env(const std::vector<std::string>& entries) { return Environment::FromEntries(entries); }

struct EnvFixture : ::testing::Test {
  EnvFixture() {
    config.nproc_per_node = 4;
    config.max_restarts = 3;
    config.run_id = "job42";
    config.role = "trainer";
    config.entrypoint = "train.py";
    rank = {2, 6, 6, 1, 2, 8, 8, 4};
    attempt.restart_count = 1;
    attempt.master_addr = "10.1.2.3";
    attempt.master_port = 29511;
    attempt.use_agent_store = true;
    attempt.error_files = {"/e/0", "/e/1", "/e/2", "/e/3"};
  }
  LaunchConfig config;
  RankInfo rank;
  AttemptInfo attempt;
};

TEST_F(EnvFixture, SetsEveryTorchrunVariable) {
  auto env = BuildWorkerEnv(config, Env({"HOME=/root", "TEST_SENTINEL_PARENT=x"}), rank, attempt);
  EXPECT_EQ(Get(env, "LOCAL_RANK"), "2");
  EXPECT_EQ(Get(env, "RANK"), "6");
  EXPECT_EQ(Get(env, "GROUP_RANK"), "1");
  EXPECT_EQ(Get(env, "ROLE_RANK"), "6");
  EXPECT_EQ(Get(env, "ROLE_NAME"), "trainer");
  EXPECT_EQ(Get(env, "LOCAL_WORLD_SIZE"), "4");
  EXPECT_EQ(Get(env, "WORLD_SIZE"), "8");
  EXPECT_EQ(Get(env, "GROUP_WORLD_SIZE"), "2");
  EXPECT_EQ(Get(env, "ROLE_WORLD_SIZE"), "8");
  EXPECT_EQ(Get(env, "MASTER_ADDR"), "10.1.2.3");
  EXPECT_EQ(Get(env, "MASTER_PORT"), "29511");
  EXPECT_EQ(Get(env, "TORCHELASTIC_RESTART_COUNT"), "1");
  EXPECT_EQ(Get(env, "TORCHELASTIC_MAX_RESTARTS"), "3");
  EXPECT_EQ(Get(env, "TORCHELASTIC_RUN_ID"), "job42");
  EXPECT_EQ(Get(env, "TORCHELASTIC_USE_AGENT_STORE"), "True");
  EXPECT_EQ(Get(env, "TORCHELASTIC_ERROR_FILE"), "/e/2");
  EXPECT_EQ(Get(env, "TORCH_NCCL_ASYNC_ERROR_HANDLING"), "1");
  EXPECT_EQ(Get(env, "NCCL_ASYNC_ERROR_HANDLING"), "1");
  EXPECT_EQ(Get(env, "OMP_NUM_THREADS"), "1");
  EXPECT_EQ(Get(env, "TEST_SENTINEL_PARENT"), "x");
  EXPECT_EQ(Get(env, "HOME"), "/root");
}

// ctrun run under ctrun: the outer one's heartbeat variables name no fd of this job's workers
// (the health monitor sets them again for a worker it gives a channel).
TEST_F(EnvFixture, ALaunchersHeartbeatChannelIsNotPassedOn) {
  auto env = BuildWorkerEnv(config, Env({"CTRUN_HEARTBEAT_FD=3", "CTRUN_HEARTBEAT_ID=1:2", "A=1"}), rank, attempt);
  EXPECT_FALSE(env.Has("CTRUN_HEARTBEAT_FD"));
  EXPECT_FALSE(env.Has("CTRUN_HEARTBEAT_ID"));
  EXPECT_EQ(Get(env, "A"), "1");
}

// With a channel, the worker gets the identity of its own socket, not the outer launcher's.
TEST_F(EnvFixture, AnInheritedHeartbeatIdIsReplacedByTheChannelsOwn) {
  EventLoop loop;
  health::HangWatchOptions o;
  o.heartbeat = Seconds(60);
  o.first_heartbeat = Seconds(60);
  health::HealthMonitor monitor(loop, o, health::StackTools{}, Seconds(1), nullptr);
  SpawnSpec spec;
  spec.env = BuildWorkerEnv(config, Env({"CTRUN_HEARTBEAT_FD=3", "CTRUN_HEARTBEAT_ID=1:2"}), rank, attempt).Entries();
  monitor.PrepareWorker(0, 0, &spec);
  ASSERT_GE(spec.extra_fd, 0);
  struct stat st {};
  ASSERT_EQ(::fstat(spec.extra_fd, &st), 0);
  const Environment env = Environment::FromEntries(spec.env);
  EXPECT_EQ(Get(env, "CTRUN_HEARTBEAT_FD"), "3");
  EXPECT_EQ(Get(env, "CTRUN_HEARTBEAT_ID"), std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino));
  EXPECT_EQ(std::count_if(spec.env.begin(), spec.env.end(),
                          [](const std::string& e) { return e.rfind("CTRUN_HEARTBEAT_ID=", 0) == 0; }),
            1);
}

// torchrun's file timer server is not ctrun's: asking for it gets a warning, not silence.
TEST_F(EnvFixture, AskingForTheFileTimerIsWarnedAbout) {
  EXPECT_EQ(FileTimerWarning(Env({})), "");
  EXPECT_EQ(FileTimerWarning(Env({"TORCHELASTIC_ENABLE_FILE_TIMER=0"})), "");
  EXPECT_NE(FileTimerWarning(Env({"TORCHELASTIC_ENABLE_FILE_TIMER=1"})).find("no TORCHELASTIC_TIMER_FILE"),
            std::string::npos);
}

TEST_F(EnvFixture, InheritedValuesAreKeptOrOverridden) {
  auto env = BuildWorkerEnv(config, Env({"OMP_NUM_THREADS=7", "TORCH_NCCL_ASYNC_ERROR_HANDLING=3", "RANK=99"}), rank,
                            attempt);
  EXPECT_EQ(Get(env, "OMP_NUM_THREADS"), "7");
  EXPECT_EQ(Get(env, "TORCH_NCCL_ASYNC_ERROR_HANDLING"), "3");
  // Set under the new name only: the old one (which torch >= 2.2 warns about) is not added.
  EXPECT_FALSE(env.Has("NCCL_ASYNC_ERROR_HANDLING"));
  EXPECT_EQ(Get(env, "RANK"), "6");
  size_t ranks = 0;
  for (const auto& kv : env.Entries()) ranks += kv.rfind("RANK=", 0) == 0;
  EXPECT_EQ(ranks, 1u);
}

TEST_F(EnvFixture, OmpRuleOnlyForMultipleWorkers) {
  config.nproc_per_node = 1;
  auto env = BuildWorkerEnv(config, {}, rank, attempt);
  EXPECT_EQ(Get(env, "OMP_NUM_THREADS"), "<unset>");
  EXPECT_EQ(OmpNotice(config, {}), "");
  config.nproc_per_node = 2;
  EXPECT_NE(OmpNotice(config, {}), "");
  EXPECT_EQ(OmpNotice(config, Env({"OMP_NUM_THREADS=4"})), "");
}

TEST_F(EnvFixture, VirtualLocalRankNarrowsDevices) {
  config.virtual_local_rank = true;
  auto env = BuildWorkerEnv(config, Env({"CUDA_VISIBLE_DEVICES=4,5,6,7"}), rank, attempt);
  EXPECT_EQ(Get(env, "LOCAL_RANK"), "0");
  EXPECT_EQ(Get(env, "CUDA_VISIBLE_DEVICES"), "6");
  env = BuildWorkerEnv(config, {}, rank, attempt);
  EXPECT_EQ(Get(env, "CUDA_VISIBLE_DEVICES"), "2");
  // Spaces after the commas are no part of an entry (torchrun strips them).
  env = BuildWorkerEnv(config, Env({"CUDA_VISIBLE_DEVICES=4, 5, 6 ,7"}), rank, attempt);
  EXPECT_EQ(Get(env, "CUDA_VISIBLE_DEVICES"), "6");
}

// The environment is read once, with getenv's rule for a name given twice: the first entry wins.
TEST(Environment, ReadOnceFirstEntryWinsOrderKept) {
  Environment env = Environment::FromEntries({"A=1", "B=x=y", "A=2", "NOEQUALS", "C=", "=empty"});
  EXPECT_EQ(*env.Get("A"), "1");
  EXPECT_EQ(*env.Get("B"), "x=y");  // split at the first '='
  EXPECT_EQ(*env.Get("C"), "");
  EXPECT_FALSE(env.Has("NOEQUALS"));
  EXPECT_FALSE(env.Has("D"));
  env.Set("B", "z");  // in place
  env.Set("D", "4");  // appended
  EXPECT_EQ(env.Entries(), (std::vector<std::string>{"A=1", "B=z", "C=", "=empty", "D=4"}));
}

TEST(Environment, EraseEntriesRemovesEveryEntryOfTheWholeNameOnly) {
  std::vector<std::string> entries{"A=1", "AB=2", "A=3", "A", "B=A=4", "A="};
  EraseEntries(&entries, "A");
  EXPECT_EQ(entries, (std::vector<std::string>{"AB=2", "A", "B=A=4"}));
}

TEST(Environment, UnsetKeepsTheOthersInOrderAndNamesMatchWhole) {
  Environment env = Environment::FromEntries({"AB=1", "A=2", "ABC=3", "B=4"});
  EXPECT_EQ(*env.Get("A"), "2");
  EXPECT_FALSE(env.Has("AB="));
  EXPECT_FALSE(env.Has("ABCD"));
  env.Unset("A");
  env.Unset("missing");
  EXPECT_FALSE(env.Has("A"));
  EXPECT_EQ(*env.Get("ABC"), "3");
  env.Set("A", "5");  // a name set again after its removal goes last
  EXPECT_EQ(env.Entries(), (std::vector<std::string>{"AB=1", "ABC=3", "B=4", "A=5"}));
  EXPECT_EQ(env.size(), 4u);
  const Environment copy = env;  // copies are independent
  env.Set("B", "6");
  EXPECT_EQ(*copy.Get("B"), "4");
}

TEST(Environment, FromProcessMatchesGetenv) {
  Environment env = Environment::FromProcess();
  ASSERT_NE(::getenv("PATH"), nullptr);
  EXPECT_EQ(*env.Get("PATH"), ::getenv("PATH"));
}

TEST_F(EnvFixture, PythonArgvForScriptsAndModules) {
  config.args = {"--lr", "0.1"};
  EXPECT_EQ(BuildWorkerArgv(config, "/usr/bin/python3", rank, attempt),
            (std::vector<std::string>{"/usr/bin/python3", "-u", "train.py", "--lr", "0.1"}));
  config.module = true;
  config.entrypoint = "pkg.train";
  EXPECT_EQ(BuildWorkerArgv(config, "py", rank, attempt),
            (std::vector<std::string>{"py", "-u", "-m", "pkg.train", "--lr", "0.1"}));
}

// torchrun's --run_path: runpy.run_path in a fresh interpreter, under Python even with
// --no_python; the script and its arguments follow the bootstrap, substituted as for a script.
TEST_F(EnvFixture, RunPathRunsTheBootstrapWithTheScriptAndArgs) {
  config.run_path = true;
  config.no_python = true;
  config.entrypoint = "train";
  config.args = {"--rank=${local_rank}"};
  EXPECT_TRUE(UsesPython(config));
  EXPECT_EQ(BuildWorkerArgv(config, "/usr/bin/python3", rank, attempt),
            (std::vector<std::string>{"/usr/bin/python3", "-u", "-c", kRunPathBootstrap, "train", "--rank=2"}));
}

TEST_F(EnvFixture, ExecutablesRunDirectly) {
  config.entrypoint = "./train";
  EXPECT_EQ(BuildWorkerArgv(config, "py", rank, attempt), std::vector<std::string>{"./train"});
  config.entrypoint = "script.py";
  config.no_python = true;
  EXPECT_EQ(BuildWorkerArgv(config, "py", rank, attempt), std::vector<std::string>{"script.py"});
}

// torchrun: Template(arg).safe_substitute(local_rank=...); expected values checked with Python.
TEST_F(EnvFixture, OnlyLocalRankIsReplacedByDefaultLikeTorchrun) {
  config.entrypoint = "./bin";
  config.args = {"--local_rank=${local_rank}", "trainer.world=${world_size}", "${rank}", "$${local_rank}",
                 "--lr=$local_rank", "a$$b", "cost: $5"};
  EXPECT_EQ(BuildWorkerArgv(config, "py", rank, attempt),
            (std::vector<std::string>{"./bin", "--local_rank=2", "trainer.world=${world_size}", "${rank}",
                                      "${local_rank}", "--lr=2", "a$b", "cost: $5"}));
}

TEST_F(EnvFixture, ExpandPlaceholdersReplacesTheRestAndHasAnEscape) {
  config.entrypoint = "./bin";
  config.expand_placeholders = true;
  config.args = {"--local_rank=${local_rank}", "--rank", "${rank}", "${world_size}", "${master_addr}:${master_port}",
                 "${unknown}", "key=$${world_size}", "$$${rank}", "${rank"};
  EXPECT_EQ(BuildWorkerArgv(config, "py", rank, attempt),
            (std::vector<std::string>{"./bin", "--local_rank=2", "--rank", "6", "8", "10.1.2.3:29511", "${unknown}",
                                      "key=${world_size}", "$6", "${rank"}));
}

// torchrun substitutes every argument of the interpreter, the script's path included; a program
// run directly is its entrypoint, which torchrun does not substitute.
TEST_F(EnvFixture, APythonScriptPathIsSubstitutedLikeItsArguments) {
  config.entrypoint = "w${local_rank}.py";
  EXPECT_EQ(BuildWorkerArgv(config, "py", rank, attempt), (std::vector<std::string>{"py", "-u", "w2.py"}));
  config.entrypoint = "mod_$local_rank";
  config.module = true;
  EXPECT_EQ(BuildWorkerArgv(config, "py", rank, attempt), (std::vector<std::string>{"py", "-u", "-m", "mod_2"}));
  config = LaunchConfig{};
  config.entrypoint = "./bin${local_rank}";
  EXPECT_EQ(BuildWorkerArgv(config, "py", rank, attempt), (std::vector<std::string>{"./bin${local_rank}"}));
}

// torchrun runs `python -u script`; a script exec'd by its python #! line is unbuffered through
// the variable instead, unless the user chose a value.
TEST_F(EnvFixture, AScriptRunByItsPythonShebangIsUnbufferedUnlessTheUserSaysOtherwise) {
  Environment base = Env({"HOME=/root"});
  config.entrypoint = "./train";
  EXPECT_FALSE(BuildWorkerEnv(config, base, rank, attempt).Has("PYTHONUNBUFFERED"));
  config.python_shebang_entrypoint = true;
  EXPECT_EQ(*BuildWorkerEnv(config, base, rank, attempt).Get("PYTHONUNBUFFERED"), "1");
  base.Set("PYTHONUNBUFFERED", "");
  EXPECT_EQ(*BuildWorkerEnv(config, base, rank, attempt).Get("PYTHONUNBUFFERED"), "1");
  base.Set("PYTHONUNBUFFERED", "0");  // any non-empty value already means unbuffered to Python
  EXPECT_EQ(*BuildWorkerEnv(config, base, rank, attempt).Get("PYTHONUNBUFFERED"), "0");
}

TEST_F(EnvFixture, ANonExecutablePythonTextFileRunsUnderPython) {
  config.entrypoint = "./train";
  config.python_text_entrypoint = true;
  EXPECT_EQ(BuildWorkerArgv(config, "/usr/bin/python3", rank, attempt),
            (std::vector<std::string>{"/usr/bin/python3", "-u", "./train"}));
}

}  // namespace
}  // namespace ctrun
