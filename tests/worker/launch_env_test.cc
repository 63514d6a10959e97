// LaunchEnv parsing: the torchrun/ctrun worker variables, defaults, and clear errors.
#include <unistd.h>

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "ctrun/launch_env.h"
#include "helpers/test_util.h"

namespace ctrun::worker {
namespace {

using Env = std::map<std::string, std::string>;

LaunchEnv::Lookup From(const Env& env) {
  return [env](const std::string& k) -> std::optional<std::string> {
    auto it = env.find(k);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}

Env Full() {
  return {{"RANK", "3"},
          {"LOCAL_RANK", "1"},
          {"WORLD_SIZE", "4"},
          {"LOCAL_WORLD_SIZE", "2"},
          {"GROUP_RANK", "1"},
          {"MASTER_ADDR", "node0.example"},
          {"MASTER_PORT", "29500"},
          {"TORCHELASTIC_RESTART_COUNT", "2"},
          {"TORCHELASTIC_MAX_RESTARTS", "3"},
          {"TORCHELASTIC_RUN_ID", "job-1"},
          {"TORCHELASTIC_USE_AGENT_STORE", "True"},
          {"TORCHELASTIC_ERROR_FILE", "/tmp/x/error.json"}};
}

TEST(LaunchEnv, ParsesEveryVariable) {
  std::string err;
  auto e = LaunchEnv::parse(From(Full()), &err);
  ASSERT_TRUE(e) << err;
  EXPECT_EQ(e->rank, 3);
  EXPECT_EQ(e->local_rank, 1);
  EXPECT_EQ(e->world_size, 4);
  EXPECT_EQ(e->local_world_size, 2);
  EXPECT_EQ(e->group_rank, 1);
  EXPECT_EQ(e->master_addr, "node0.example");
  EXPECT_EQ(e->master_port, 29500);
  EXPECT_EQ(e->restart_count, 2);
  EXPECT_EQ(e->max_restarts, 3);
  EXPECT_EQ(e->run_id, "job-1");
  EXPECT_TRUE(e->use_agent_store);
  EXPECT_TRUE(e->is_elastic());
  EXPECT_FALSE(e->hosts_store());
  EXPECT_EQ(e->attempt_prefix(), "/worker/attempt_2");
  EXPECT_EQ(e->error_file, "/tmp/x/error.json");
}

TEST(LaunchEnv, DefaultsForOptionalVariables) {
  Env env{{"RANK", "0"}, {"LOCAL_RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}};
  std::string err;
  auto e = LaunchEnv::parse(From(env), &err);
  ASSERT_TRUE(e) << err;
  EXPECT_EQ(e->local_world_size, 2);
  EXPECT_EQ(e->restart_count, 0);
  EXPECT_FALSE(e->use_agent_store);
  EXPECT_FALSE(e->is_elastic());
  EXPECT_TRUE(e->hosts_store());  // worker-hosted store: rank 0 serves
  EXPECT_EQ(e->error_file, "");
}

TEST(LaunchEnv, AgentStoreOnlyForExactPythonTrue) {
  for (const char* v : {"true", "1", "False", "TRUE", ""}) {
    Env env = Full();
    env["TORCHELASTIC_USE_AGENT_STORE"] = v;
    std::string err;
    auto e = LaunchEnv::parse(From(env), &err);
    ASSERT_TRUE(e) << err;
    EXPECT_FALSE(e->use_agent_store) << v;
  }
}

TEST(LaunchEnv, MissingVariablesNameTheVariableAndHowToLaunch) {
  for (const char* var : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) {
    Env env = Full();
    env.erase(var);
    std::string err;
    EXPECT_FALSE(LaunchEnv::parse(From(env), &err));
    EXPECT_NE(err.find(var), std::string::npos) << err;
    EXPECT_NE(err.find("ctrun --standalone --nproc_per_node"), std::string::npos) << err;
  }
}

TEST(LaunchEnv, RejectsMalformedAndInconsistentValues) {
  const std::vector<std::pair<std::string, std::string>> bad{
      {"RANK", "x"},          {"RANK", "-1"},          {"RANK", "1.5"},      {"RANK", " 1"},
      {"RANK", "4"},          {"WORLD_SIZE", "0"},     {"MASTER_PORT", "0"}, {"MASTER_PORT", "65536"},
      {"LOCAL_RANK", "2"},    {"LOCAL_WORLD_SIZE", "5"}, {"TORCHELASTIC_RESTART_COUNT", "-2"},
      {"RANK", "99999999999999999999"}};
  for (const auto& [k, v] : bad) {
    Env env = Full();
    env[k] = v;
    std::string err;
    EXPECT_FALSE(LaunchEnv::parse(From(env), &err)) << k << "=" << v;
    EXPECT_FALSE(err.empty());
  }
}

TEST(LaunchEnv, FromEnvThrowsEnvErrorWhenNotLaunched) {
  ::unsetenv("RANK");
  try {
    (void)LaunchEnv::from_env();
    FAIL() << "expected EnvError";
  } catch (const EnvError& e) {
    EXPECT_NE(std::string(e.what()).find("RANK is not set"), std::string::npos);
  }
}

// CTRUN_WAIT_FOR_DEBUGGER_RANK takes "all" or a rank of the job, parsed strictly: "yes" or
// " 0" is not rank 0 (std::atoi made them 0, and rank 0 waited 600 s for a debugger). Such a
// value stops no rank and says so in one line; the helper must end well before its deadline.
TEST(LaunchEnv, WaitForDebuggerRankTakesOnlyARankOrAll) {
  const std::vector<std::string> launched = {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "MASTER_ADDR=localhost",
                                             "MASTER_PORT=29500"};
  auto run = [&](const std::string& value, const std::vector<std::string>& prefix = {}) {
    std::vector<std::string> env = launched;
    env.push_back("CTRUN_WAIT_FOR_DEBUGGER_RANK=" + value);
    std::vector<std::string> argv = prefix;
    argv.push_back(WORKER_HELPER);
    argv.push_back("launch-env");
    return ctrun::testing::RunCommand(argv, env, std::chrono::seconds(30));
  };
  for (const std::string bad : {"yes", "true", " 0", "0 ", "+0", "0x1", "-1", "2", "99999999999999999999"}) {
    const auto r = run(bad);
    ASSERT_EQ(r.exit_code, 0) << "'" << bad << "': waited (-1) or failed: " << r.err;
    EXPECT_EQ(r.out, "rank 0\n");
    EXPECT_EQ(r.err, "ctrun::worker: CTRUN_WAIT_FOR_DEBUGGER_RANK='" + bad +
                         "' is neither a rank in [0, 1] nor \"all\"; not waiting for a debugger\n");
  }
  const auto other = run("1");  // another rank's
  ASSERT_EQ(other.exit_code, 0) << other.err;
  EXPECT_EQ(other.out, "rank 0\n");
  EXPECT_EQ(other.err, "");
  // This rank, or all: it waits for a tracer. Under strace one is attached from the start, so
  // the wait announces itself and ends at once.
  if (::access("/usr/bin/strace", X_OK) != 0) GTEST_SKIP() << "strace not installed";
  for (const std::string mine : {"0", "all"}) {
    const auto r = run(mine, {"/usr/bin/strace", "-qq", "-o", "/dev/null", "-e", "trace=none"});
    if (r.exit_code != 0 && r.err.find("ptrace") != std::string::npos) GTEST_SKIP() << "no ptrace here: " << r.err;
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, "rank 0\n");
    EXPECT_NE(r.err.find("rank 0 (pid "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("waiting up to 600 s for a debugger"), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace ctrun::worker
