// Unit tests for src/cli/cluster_env: Slurm hostlist expansion, which options count as chosen by the
// user, what a Slurm step fills in (and when it must not), and ParseCommandLine under the exact
// environments Kubeflow's operators give a PyTorchJob / TrainJob pod.
#include <map>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cli/cli.h"
#include "helpers/map_env.h"
#include "cli/cluster_env.h"

namespace ctrun {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

using testing::Env;
using testing::MapEnv;

std::vector<std::string> Hosts(std::string_view text) {
  StatusOr<std::vector<std::string>> h = ExpandHostlist(text);
  EXPECT_TRUE(h.ok()) << text << ": " << h.message();
  return h.ok() ? *h : std::vector<std::string>{};
}

std::string HostlistError(std::string_view text) {
  StatusOr<std::vector<std::string>> h = ExpandHostlist(text);
  EXPECT_FALSE(h.ok()) << text << " expanded to " << (h.ok() ? h->size() : 0) << " hosts";
  return h.ok() ? "" : h.message();
}

// --- ExpandHostlist ------------------------------------------------------------------------------

TEST(Hostlist, PlainNames) {
  EXPECT_THAT(Hosts("node1"), ElementsAre("node1"));
  EXPECT_THAT(Hosts("a,b,c"), ElementsAre("a", "b", "c"));
  EXPECT_THAT(Hosts("gpu-a.example.org"), ElementsAre("gpu-a.example.org"));
}

TEST(Hostlist, RangesAndSinglesInOneGroup) {
  EXPECT_THAT(Hosts("node[01-04,07]"), ElementsAre("node01", "node02", "node03", "node04", "node07"));
  EXPECT_THAT(Hosts("node[1-3,5]"), ElementsAre("node1", "node2", "node3", "node5"));
  EXPECT_THAT(Hosts("n[7]"), ElementsAre("n7"));
}

TEST(Hostlist, PaddingFollowsTheDigitsOfLo) {
  EXPECT_THAT(Hosts("node[8-10]"), ElementsAre("node8", "node9", "node10"));
  EXPECT_THAT(Hosts("node[08-10]"), ElementsAre("node08", "node09", "node10"));
  EXPECT_THAT(Hosts("n[001-3]"), ElementsAre("n001", "n002", "n003"));
  EXPECT_THAT(Hosts("n[098-101]"), ElementsAre("n098", "n099", "n100", "n101"));
  EXPECT_THAT(Hosts("n[0-1]"), ElementsAre("n0", "n1"));
}

TEST(Hostlist, TextAroundTheGroup) {
  EXPECT_THAT(Hosts("node[1-2]-ib"), ElementsAre("node1-ib", "node2-ib"));
  EXPECT_THAT(Hosts("gpu[1-2].cluster,login"), ElementsAre("gpu1.cluster", "gpu2.cluster", "login"));
  EXPECT_THAT(Hosts("[1-3]"), ElementsAre("1", "2", "3"));
}

TEST(Hostlist, SeveralEntriesKeepTheirOrder) {
  EXPECT_THAT(Hosts("node[1-3,5],login[01-02]"),
              ElementsAre("node1", "node2", "node3", "node5", "login01", "login02"));
  EXPECT_THAT(Hosts("z1,a[1-2]"), ElementsAre("z1", "a1", "a2"));
  EXPECT_THAT(Hosts("a,a"), ElementsAre("a", "a"));  // Slurm keeps duplicates too
}

TEST(Hostlist, TwoGroupsLastVariesFastest) {
  EXPECT_THAT(Hosts("rack[1-2]-node[1-3]"), ElementsAre("rack1-node1", "rack1-node2", "rack1-node3",
                                                        "rack2-node1", "rack2-node2", "rack2-node3"));
}

TEST(Hostlist, ThreeGroupsInSlurmsOrder) {
  // Last group fastest, then the first, then the middle one.
  EXPECT_THAT(Hosts("a[1-2]b[1-2]c[1-2]"),
              ElementsAre("a1b1c1", "a1b1c2", "a2b1c1", "a2b1c2", "a1b2c1", "a1b2c2", "a2b2c1", "a2b2c2"));
  std::vector<std::string> four = Hosts("a[1-2]b[1-2]c[1-2]d[1-2]");
  ASSERT_EQ(four.size(), 16u);
  EXPECT_EQ(four[0], "a1b1c1d1");
  EXPECT_EQ(four[1], "a1b1c1d2");
  EXPECT_EQ(four[2], "a2b1c1d1");
  EXPECT_EQ(four[4], "a1b2c1d1");
  EXPECT_EQ(four[8], "a1b1c2d1");
  EXPECT_EQ(four[15], "a2b2c2d2");
}

TEST(Hostlist, BlanksAndEmptyEntriesSeparate) {
  EXPECT_THAT(Hosts("a,,b c\td\n"), ElementsAre("a", "b", "c", "d"));
  EXPECT_THAT(Hosts(" n[1-2] "), ElementsAre("n1", "n2"));
}

TEST(Hostlist, UpToTheLimit) {
  std::vector<std::string> h = Hosts("n[1-65536]");
  ASSERT_EQ(h.size(), kMaxHostlistHosts);
  EXPECT_EQ(h.back(), "n65536");
  EXPECT_EQ(Hosts("a[1-256]b[1-256]").size(), 65536u);
}

TEST(Hostlist, TooManyHosts) {
  EXPECT_THAT(HostlistError("n[1-65537]"), HasSubstr("more than 65536 hosts"));
  EXPECT_THAT(HostlistError("n[0-999999999999999999]"), HasSubstr("more than 65536"));
  EXPECT_THAT(HostlistError("a[1-300]b[1-300]"), HasSubstr("more than 65536"));
  EXPECT_THAT(HostlistError("a[1-40000],b[1-40000]"), HasSubstr("more than 65536"));
  EXPECT_THAT(HostlistError("a[1-1000]b[1-1000]c[1-1000]d[1-1000]"), HasSubstr("more than 65536"));
}

TEST(Hostlist, Malformed) {
  EXPECT_THAT(HostlistError("node[1-3"), HasSubstr("'[' at offset 4 is never closed"));
  EXPECT_THAT(HostlistError("node1-3]"), HasSubstr("']' at offset 7 has no matching '['"));
  EXPECT_THAT(HostlistError("n[1[2]]"), HasSubstr("inside another bracket group"));
  EXPECT_THAT(HostlistError("n[]"), HasSubstr("empty element"));
  EXPECT_THAT(HostlistError("n[1,]"), HasSubstr("empty element"));
  EXPECT_THAT(HostlistError("n[a-b]"), HasSubstr("'a-b' in a bracket group is not a number"));
  EXPECT_THAT(HostlistError("n[-1]"), HasSubstr("not a number"));
  EXPECT_THAT(HostlistError("n[1-]"), HasSubstr("not a number"));
  EXPECT_THAT(HostlistError("n[1-2-3]"), HasSubstr("not a number"));
  EXPECT_THAT(HostlistError("n[ 1]"), HasSubstr("not a number"));
  EXPECT_THAT(HostlistError("n[3-1]"), HasSubstr("reversed range '3-1'"));
  EXPECT_THAT(HostlistError("n[1234567890123456789]"), HasSubstr("more than 18 digits"));
  EXPECT_THAT(HostlistError(""), HasSubstr("no host names"));
  EXPECT_THAT(HostlistError(" , "), HasSubstr("no host names"));
}

// --- DetectExplicitFlags ----------------------------------------------------------------------------

ExplicitFlags Detect(std::vector<std::string> args, Env env = {}) {
  args.insert(args.begin(), "ctrun");
  return DetectExplicitFlags(args, MapEnv(std::move(env)));
}

TEST(ExplicitFlags, NoneForAPlainCommand) {
  EXPECT_THAT(Detect({"./train", "--nnodes", "2"}).dests, IsEmpty());
  EXPECT_THAT(Detect({}).dests, IsEmpty());
}

struct SpellingCase {
  std::vector<std::string> args;
  std::string dest;
};

class ExplicitSpellingTest : public ::testing::TestWithParam<SpellingCase> {};

TEST_P(ExplicitSpellingTest, Recognized) {
  std::vector<std::string> args = GetParam().args;
  args.push_back("./train");
  ExplicitFlags f = Detect(args);
  EXPECT_THAT(f.dests, ElementsAre(GetParam().dest));
  EXPECT_TRUE(f.Has(GetParam().dest));
}

INSTANTIATE_TEST_SUITE_P(
    AllForms, ExplicitSpellingTest,
    ::testing::Values(
        SpellingCase{{"--nnodes", "2"}, "nnodes"}, SpellingCase{{"--nnodes=2"}, "nnodes"},
        SpellingCase{{"--nnode=2"}, "nnodes"},  // a unique prefix, as argparse allows
        SpellingCase{{"--node-rank", "1"}, "node_rank"}, SpellingCase{{"--node_rank=1"}, "node_rank"},
        SpellingCase{{"--master-addr", "h"}, "master_addr"}, SpellingCase{{"--master_addr=h"}, "master_addr"},
        SpellingCase{{"--master_port", "1234"}, "master_port"},
        SpellingCase{{"--master-port=1234"}, "master_port"},
        SpellingCase{{"--rdzv-endpoint", "h:1"}, "rdzv_endpoint"},
        SpellingCase{{"--rdzv_endpoint=h:1"}, "rdzv_endpoint"},
        SpellingCase{{"--rdzv_backend", "c10d"}, "rdzv_backend"},
        SpellingCase{{"--rdzv-backend=static"}, "rdzv_backend"}, SpellingCase{{"--standalone"}, "standalone"},
        SpellingCase{{"--run-id", "x"}, "rdzv_id"}, SpellingCase{{"-r", "3"}, "redirects"},
        SpellingCase{{"-r3"}, "redirects"}));

TEST(ExplicitFlags, SeveralOptions) {
  EXPECT_THAT(Detect({"--nproc_per_node=8", "--max-restarts", "3", "--standalone", "train.py"}).dests,
              ElementsAre("max_restarts", "nproc_per_node", "standalone"));
}

TEST(ExplicitFlags, StopsAtTheEntrypoint) {
  // "3" is --max_restarts' value, "./train" the entrypoint; the rest belongs to the worker.
  EXPECT_THAT(Detect({"--max_restarts", "3", "./train", "--nnodes", "2", "--standalone"}).dests,
              ElementsAre("max_restarts"));
  // -m is a flag: "pkg" is the module, not its value.
  EXPECT_THAT(Detect({"-m", "pkg", "--nnodes=2"}).dests, ElementsAre("module"));
}

TEST(ExplicitFlags, StopsAtDoubleDash) {
  EXPECT_THAT(Detect({"--", "--nnodes", "2", "./train"}).dests, IsEmpty());
  EXPECT_THAT(Detect({"--node_rank", "1", "--", "./train", "--standalone"}).dests, ElementsAre("node_rank"));
}

TEST(ExplicitFlags, ValueOptionConsumesTheNextArgument) {
  // Without '=' the next argument is the value, even when it names a file: the entrypoint is "x".
  EXPECT_THAT(Detect({"--master_addr", "train.py", "x", "--nnodes=2"}).dests, ElementsAre("master_addr"));
}

TEST(ExplicitFlags, MalformedArgumentsAreSkipped) {
  EXPECT_THAT(Detect({"--bogus", "--nnodes=2"}).dests, ElementsAre("nnodes"));
  EXPECT_THAT(Detect({"--nnodes"}).dests, IsEmpty());  // no value: ParseCommandLine reports it
}

TEST(ExplicitFlags, PetVariables) {
  EXPECT_THAT(Detect({"./t"}, {{"PET_NNODES", "2"}}).dests, ElementsAre("nnodes"));
  EXPECT_THAT(Detect({"./t"}, {{"PET_NODE_RANK", "0"}}).dests, ElementsAre("node_rank"));
  EXPECT_THAT(Detect({"./t"}, {{"PET_MASTER_ADDR", ""}}).dests, ElementsAre("master_addr"));  // set counts
  EXPECT_THAT(Detect({"./t"}, {{"PET_RDZV_ENDPOINT", "h:1"}, {"PET_RDZV_BACKEND", "c10d"}}).dests,
              ElementsAre("rdzv_backend", "rdzv_endpoint"));
  EXPECT_THAT(Detect({"./t"}, {{"CTRUN_LOG_LEVEL", "debug"}}).dests, ElementsAre("log_level"));
  EXPECT_THAT(Detect({"./t"}, {{"MASTER_ADDR", "h"}, {"WORLD_SIZE", "4"}, {"RANK", "1"}}).dests, IsEmpty());
}

TEST(ExplicitFlags, OnOffPetVariableCountsUnlessZero) {
  EXPECT_THAT(Detect({"./t"}, {{"PET_STANDALONE", "1"}}).dests, ElementsAre("standalone"));
  EXPECT_THAT(Detect({"./t"}, {{"PET_STANDALONE", "0"}}).dests, IsEmpty());
  EXPECT_THAT(Detect({"./t"}, {{"PET_STANDALONE", ""}}).dests, ElementsAre("standalone"));  // not 0
}

// --- ApplyClusterEnv: Slurm -------------------------------------------------------------------------

// A srun task's environment on node `node_id` of a step over node[01-04], one task per node.
Env SlurmStep(const std::string& node_id, const std::string& nodelist = "node[01-04]", int nodes = 4) {
  return {{"SLURM_JOB_ID", "1234"},
          {"SLURM_JOBID", "1234"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_JOB_NODELIST", nodelist},
          {"SLURM_NODELIST", nodelist},
          {"SLURM_STEP_NODELIST", nodelist},
          {"SLURM_NNODES", std::to_string(nodes)},
          {"SLURM_JOB_NUM_NODES", std::to_string(nodes)},
          {"SLURM_STEP_NUM_NODES", std::to_string(nodes)},
          {"SLURM_STEP_NUM_TASKS", std::to_string(nodes)},
          {"SLURM_STEP_TASKS_PER_NODE", "1(x" + std::to_string(nodes) + ")"},
          {"SLURM_NTASKS", std::to_string(nodes)},
          {"SLURM_NODEID", node_id},
          {"SLURM_PROCID", node_id},
          {"SLURM_LOCALID", "0"}};
}

struct Applied {
  Status status;
  LaunchConfig config;
  std::string notice;
};

// What main() does: parse, then apply the cluster environment.
Applied Launch(std::vector<std::string> args, const Env& env) {
  args.insert(args.begin(), "ctrun");
  EnvLookup lookup = MapEnv(env);
  CliOutcome o = ParseCommandLine(args, lookup);
  EXPECT_EQ(o.action, CliOutcome::Action::kRun) << o.error;
  Applied a;
  a.config = o.config;
  a.notice = "(not cleared)";
  a.status = ApplyClusterEnv(&a.config, lookup, DetectExplicitFlags(args, lookup), &a.notice);
  return a;
}

void ExpectUntouched(const LaunchConfig& c) {
  EXPECT_EQ(c.min_nodes, 1);
  EXPECT_EQ(c.max_nodes, 1);
  EXPECT_EQ(c.node_rank, 0);
  EXPECT_EQ(c.master_addr, "127.0.0.1");
  EXPECT_FALSE(c.master_port.has_value());
  EXPECT_EQ(c.rdzv_backend, "static");
}

TEST(SlurmEnv, FillsInTheNodesOfTheStep) {
  Applied a = Launch({"--nproc_per_node=8", "train.py", "--lr", "1"}, SlurmStep("2"));
  ASSERT_TRUE(a.status.ok()) << a.status.message();
  EXPECT_EQ(a.config.min_nodes, 4);
  EXPECT_EQ(a.config.max_nodes, 4);
  EXPECT_EQ(a.config.node_rank, 2);
  EXPECT_EQ(a.config.master_addr, "node01");
  EXPECT_EQ(a.config.master_port, 29500);
  EXPECT_EQ(a.config.rdzv_backend, "static");
  EXPECT_EQ(a.config.rdzv_endpoint, "");
  EXPECT_EQ(a.config.run_id, "none");
  EXPECT_EQ(a.config.nproc.count, 8);
  EXPECT_EQ(a.config.entrypoint, "train.py");
  EXPECT_EQ(a.notice, "slurm: 4 nodes (node[01-04]), node rank 2, master node01:29500");
}

TEST(SlurmEnv, NodeZeroIsTheMaster) {
  Applied a = Launch({"./train"}, SlurmStep("0"));
  ASSERT_TRUE(a.status.ok());
  EXPECT_EQ(a.config.node_rank, 0);
  EXPECT_EQ(a.config.master_addr, "node01");
}

TEST(SlurmEnv, GivenMasterPortIsKept) {
  Applied flag = Launch({"--master_port", "4321", "./train"}, SlurmStep("3"));
  ASSERT_TRUE(flag.status.ok());
  EXPECT_EQ(flag.config.master_port, 4321);
  EXPECT_EQ(flag.config.min_nodes, 4);
  EXPECT_EQ(flag.notice, "slurm: 4 nodes (node[01-04]), node rank 3, master node01:4321");

  Env env = SlurmStep("1");
  env["PET_MASTER_PORT"] = "5555";
  Applied pet = Launch({"./train"}, env);
  ASSERT_TRUE(pet.status.ok());
  EXPECT_EQ(pet.config.master_port, 5555);
  EXPECT_EQ(pet.config.node_rank, 1);
}

TEST(SlurmEnv, MasterComesFromTheStepNotTheJob) {
  Env env = SlurmStep("1", "gpu[05-06]", 2);
  env["SLURM_JOB_NODELIST"] = "gpu[01-08]";
  env["SLURM_JOB_NUM_NODES"] = "8";
  Applied a = Launch({"./train"}, env);
  ASSERT_TRUE(a.status.ok()) << a.status.message();
  EXPECT_EQ(a.config.min_nodes, 2);
  EXPECT_EQ(a.config.node_rank, 1);
  EXPECT_EQ(a.config.master_addr, "gpu05");
}

TEST(SlurmEnv, PreservedJobNodeCountIsIgnored) {
  // srun --preserve-env keeps the job's SLURM_NNODES; the step's own lists decide.
  Env env = SlurmStep("0", "n[1-2]", 2);
  env["SLURM_NNODES"] = "6";
  env.erase("SLURM_STEP_NUM_NODES");
  env.erase("SLURM_STEP_NUM_TASKS");
  Applied a = Launch({"./train"}, env);
  ASSERT_TRUE(a.status.ok()) << a.status.message();
  EXPECT_EQ(a.config.min_nodes, 2);
  EXPECT_EQ(a.config.max_nodes, 2);
}

TEST(SlurmEnv, ListOfSeveralEntries) {
  Applied a = Launch({"./train"}, SlurmStep("2", "gpu-a[1-2],gpu-b7", 3));
  ASSERT_TRUE(a.status.ok());
  EXPECT_EQ(a.config.min_nodes, 3);
  EXPECT_EQ(a.config.node_rank, 2);
  EXPECT_EQ(a.config.master_addr, "gpu-a1");
  EXPECT_EQ(a.notice, "slurm: 3 nodes (gpu-a[1-2],gpu-b7), node rank 2, master gpu-a1:29500");
}

TEST(SlurmEnv, OneNodeLeavesEverythingAlone) {
  Applied a = Launch({"./train"}, SlurmStep("0", "node07", 1));
  ASSERT_TRUE(a.status.ok());
  ExpectUntouched(a.config);
  EXPECT_EQ(a.notice, "");
}

TEST(SlurmEnv, NotUnderSlurm) {
  Applied a = Launch({"./train"}, {});
  ASSERT_TRUE(a.status.ok());
  ExpectUntouched(a.config);
  EXPECT_EQ(a.notice, "");
  Env no_job = SlurmStep("1");
  no_job.erase("SLURM_JOB_ID");
  Applied b = Launch({"./train"}, no_job);
  ExpectUntouched(b.config);
  EXPECT_EQ(b.notice, "");
}

TEST(SlurmEnv, BatchScriptRunsOnOneNodeWithAHint) {
  // What a batch script sees on the first node of a 4-node job: no SLURM_STEP_* variables.
  Env batch = {
      {"SLURM_JOB_ID", "1234"}, {"SLURM_JOB_NODELIST", "node[01-04]"}, {"SLURM_NODELIST", "node[01-04]"},
      {"SLURM_NNODES", "4"},    {"SLURM_JOB_NUM_NODES", "4"},          {"SLURM_NODEID", "0"},
      {"SLURM_PROCID", "0"},    {"SLURM_TASKS_PER_NODE", "1(x4)"}};
  Applied a = Launch({"./train"}, batch);
  ASSERT_TRUE(a.status.ok());
  ExpectUntouched(a.config);
  EXPECT_THAT(a.notice, HasSubstr("slurm: job 1234 has 4 nodes, but srun did not start ctrun"));
  EXPECT_THAT(a.notice, HasSubstr("srun --ntasks-per-node=1"));
  EXPECT_EQ(a.notice.find('\n'), std::string::npos);

  // No hint for a one-node job, or when the user chose the nodes.
  batch["SLURM_JOB_NUM_NODES"] = "1";
  batch["SLURM_NNODES"] = "1";
  EXPECT_EQ(Launch({"./train"}, batch).notice, "");
  batch["SLURM_JOB_NUM_NODES"] = "4";
  EXPECT_EQ(Launch({"--nnodes=1", "./train"}, batch).notice, "");
}

TEST(SlurmEnv, StepWithoutNodeIdIsLeftAlone) {
  Env env = SlurmStep("0");
  env.erase("SLURM_NODEID");
  Applied a = Launch({"./train"}, env);
  ASSERT_TRUE(a.status.ok());
  ExpectUntouched(a.config);
  EXPECT_EQ(a.notice, "");
}

TEST(SlurmEnv, OtherOptionsDoNotStopIt) {
  Applied a = Launch(
      {"--rdzv_id", "job7", "--max_restarts=2", "--rdzv_conf", "timeout=60", "--local_addr", "me", "./train"},
      SlurmStep("1"));
  ASSERT_TRUE(a.status.ok());
  EXPECT_EQ(a.config.min_nodes, 4);
  EXPECT_EQ(a.config.run_id, "job7");
  EXPECT_EQ(a.config.local_addr, "me");
}

// Every way of choosing the nodes yourself turns the derivation off.
struct ChosenCase {
  std::string name;
  std::vector<std::string> args;
  Env env;
};

class SlurmChosenTest : public ::testing::TestWithParam<ChosenCase> {};

TEST_P(SlurmChosenTest, NothingDerived) {
  Env env = SlurmStep("2");
  for (const auto& [k, v] : GetParam().env) env[k] = v;
  std::vector<std::string> args = GetParam().args;
  args.push_back("./train");
  Applied a = Launch(args, env);
  ASSERT_TRUE(a.status.ok()) << a.status.message();
  EXPECT_EQ(a.notice, "");
  EXPECT_NE(a.config.master_addr, "node01");
  EXPECT_NE(a.config.node_rank, 2);
}

INSTANTIATE_TEST_SUITE_P(
    AllNodeOptions, SlurmChosenTest,
    ::testing::Values(ChosenCase{"nnodes", {"--nnodes", "1"}, {}},
                      ChosenCase{"nnodes_eq", {"--nnodes=1"}, {}},
                      ChosenCase{"node_rank_dash", {"--node-rank", "0"}, {}},
                      ChosenCase{"node_rank_under", {"--node_rank=0"}, {}},
                      ChosenCase{"master_addr_dash", {"--master-addr", "h"}, {}},
                      ChosenCase{"master_addr_under", {"--master_addr=h"}, {}},
                      ChosenCase{"rdzv_endpoint", {"--rdzv-endpoint", "h:1"}, {}},
                      ChosenCase{"rdzv_backend", {"--rdzv_backend=static"}, {}},
                      ChosenCase{"standalone", {"--standalone"}, {}},
                      ChosenCase{"pet_nnodes", {}, {{"PET_NNODES", "1"}}},
                      ChosenCase{"pet_node_rank", {}, {{"PET_NODE_RANK", "0"}}},
                      ChosenCase{"pet_master_addr", {}, {{"PET_MASTER_ADDR", "h"}}},
                      ChosenCase{"pet_rdzv_endpoint", {}, {{"PET_RDZV_ENDPOINT", "h:1"}}},
                      ChosenCase{"pet_rdzv_backend", {}, {{"PET_RDZV_BACKEND", "static"}}},
                      ChosenCase{"pet_standalone", {}, {{"PET_STANDALONE", "1"}}}),
    [](const ::testing::TestParamInfo<ChosenCase>& p) { return p.param.name; });

TEST(SlurmEnv, PetStandaloneZeroIsNotAChoice) {
  Env env = SlurmStep("2");
  env["PET_STANDALONE"] = "0";
  Applied a = Launch({"./train"}, env);
  ASSERT_TRUE(a.status.ok());
  EXPECT_EQ(a.config.min_nodes, 4);
  EXPECT_FALSE(a.config.standalone);
}

TEST(SlurmEnv, ChosenNodesSkipValidationOfUnusedSlurmValues) {
  Env env = SlurmStep("x", "node[1-");
  Applied a = Launch({"--nnodes=1", "./train"}, env);
  EXPECT_TRUE(a.status.ok()) << a.status.message();
}

// Malformed Slurm values: an error naming the variable and the value; the config is unchanged.
struct BadSlurmCase {
  std::string name;
  Env overrides;
  std::vector<std::string> expected;  // substrings of the message
};

class SlurmBadTest : public ::testing::TestWithParam<BadSlurmCase> {};

TEST_P(SlurmBadTest, ErrorNamesVariableAndValue) {
  Env env = SlurmStep("2");
  for (const auto& [k, v] : GetParam().overrides) env[k] = v;
  Applied a = Launch({"./train"}, env);
  ASSERT_FALSE(a.status.ok());
  for (const std::string& s : GetParam().expected) EXPECT_THAT(a.status.message(), HasSubstr(s));
  EXPECT_EQ(a.status.message().find('\n'), std::string::npos);
  ExpectUntouched(a.config);
  EXPECT_EQ(a.notice, "");
}

INSTANTIATE_TEST_SUITE_P(
    All, SlurmBadTest,
    ::testing::Values(
        BadSlurmCase{"unclosed",
                     {{"SLURM_STEP_NODELIST", "node[01-04"}},
                     {"invalid value 'node[01-04' for SLURM_STEP_NODELIST", "never closed"}},
        BadSlurmCase{"reversed", {{"SLURM_STEP_NODELIST", "node[4-1]"}}, {"SLURM_STEP_NODELIST", "reversed"}},
        BadSlurmCase{"huge", {{"SLURM_STEP_NODELIST", "n[1-70000]"}}, {"SLURM_STEP_NODELIST", "65536"}},
        BadSlurmCase{"empty_list", {{"SLURM_STEP_NODELIST", ""}}, {"SLURM_STEP_NODELIST", "no host"}},
        BadSlurmCase{
            "nodeid_text", {{"SLURM_NODEID", "two"}}, {"invalid value 'two' for SLURM_NODEID", "0 to 3"}},
        BadSlurmCase{"nodeid_negative", {{"SLURM_NODEID", "-1"}}, {"'-1' for SLURM_NODEID"}},
        BadSlurmCase{"nodeid_too_big", {{"SLURM_NODEID", "4"}}, {"'4' for SLURM_NODEID", "names 4 hosts"}},
        BadSlurmCase{"nodeid_empty", {{"SLURM_NODEID", ""}}, {"'' for SLURM_NODEID"}},
        BadSlurmCase{"step_nodes_mismatch",
                     {{"SLURM_STEP_NUM_NODES", "3"}},
                     {"invalid value '3' for SLURM_STEP_NUM_NODES", "'node[01-04]' names 4 hosts"}},
        BadSlurmCase{
            "step_nodes_text", {{"SLURM_STEP_NUM_NODES", "four"}}, {"'four' for SLURM_STEP_NUM_NODES"}},
        BadSlurmCase{"several_tasks_per_node",
                     {{"SLURM_STEP_NUM_TASKS", "32"}},
                     {"invalid value '32' for SLURM_STEP_NUM_TASKS", "one ctrun per node",
                      "srun --ntasks-per-node=1", "32 tasks on 4 nodes"}},
        BadSlurmCase{"tasks_text", {{"SLURM_STEP_NUM_TASKS", "x"}}, {"'x' for SLURM_STEP_NUM_TASKS"}}),
    [](const ::testing::TestParamInfo<BadSlurmCase>& p) { return p.param.name; });

TEST(SlurmEnv, NoticeIsClearedWhenNothingIsDerived) {
  LaunchConfig c;
  std::string notice = "stale";
  ASSERT_TRUE(ApplyClusterEnv(&c, MapEnv({}), ExplicitFlags{}, &notice).ok());
  EXPECT_EQ(notice, "");
}

// --- Kubeflow ---------------------------------------------------------------------------------------
//
// The environments below are exactly what Kubeflow sets in the training container; ctrun reads them
// through ParseCommandLine's PET_ fallbacks, and ApplyClusterEnv must leave the result alone.
//
// training-operator v1.8/v1.9, PyTorchJob without elasticPolicy, with a Master replica: every pod
// gets PYTHONUNBUFFERED=1; MASTER_PORT and PET_MASTER_PORT (the "pytorchjob-port" container port,
// default 23456); MASTER_ADDR and PET_MASTER_ADDR (<job>-master-0); WORLD_SIZE (replicas x
// nprocPerNode, counted as 1 when that is not a number); RANK and PET_NODE_RANK (0 for the master,
// worker index + 1 for workers); PET_NPROC_PER_NODE (spec.nprocPerNode, defaulted to "auto");
// PET_NNODES (total replicas).
Env KubeflowPod(const std::string& rank, const std::string& nproc = "auto", int replicas = 4) {
  int per_node = nproc == "auto" || nproc == "cpu" || nproc == "gpu" ? 1 : std::stoi(nproc);
  return {{"PYTHONUNBUFFERED", "1"},
          {"MASTER_PORT", "23456"},
          {"PET_MASTER_PORT", "23456"},
          {"MASTER_ADDR", "mnist-master-0"},
          {"PET_MASTER_ADDR", "mnist-master-0"},
          {"WORLD_SIZE", std::to_string(replicas * per_node)},
          {"RANK", rank},
          {"PET_NODE_RANK", rank},
          {"PET_NPROC_PER_NODE", nproc},
          {"PET_NNODES", std::to_string(replicas)}};
}

TEST(Kubeflow, WorkerPodOfAStaticJob) {
  Applied a = Launch({"train.py"}, KubeflowPod("2"));
  ASSERT_TRUE(a.status.ok());
  EXPECT_EQ(a.config.min_nodes, 4);
  EXPECT_EQ(a.config.max_nodes, 4);
  EXPECT_EQ(a.config.node_rank, 2);
  EXPECT_EQ(a.config.master_addr, "mnist-master-0");
  EXPECT_EQ(a.config.master_port, 23456);
  EXPECT_EQ(a.config.rdzv_backend, "static");
  EXPECT_EQ(a.config.rdzv_endpoint, "");
  EXPECT_EQ(a.config.run_id, "none");
  EXPECT_EQ(a.config.nproc.kind, NprocSpec::Kind::kAuto);
  EXPECT_EQ(a.config.max_restarts, 0);
  EXPECT_FALSE(a.config.standalone);
  EXPECT_EQ(a.notice, "");
}

TEST(Kubeflow, MasterPodOfAStaticJob) {
  Applied a = Launch({"train.py"}, KubeflowPod("0"));
  ASSERT_TRUE(a.status.ok());
  EXPECT_EQ(a.config.node_rank, 0);
  EXPECT_EQ(a.config.min_nodes, 4);
  EXPECT_EQ(a.config.master_addr, "mnist-master-0");
}

TEST(Kubeflow, NprocPerNodeValues) {
  Applied count = Launch({"train.py"}, KubeflowPod("1", "8", 2));
  EXPECT_EQ(count.config.nproc.kind, NprocSpec::Kind::kCount);
  EXPECT_EQ(count.config.nproc_per_node, 8);
  EXPECT_EQ(Launch({"train.py"}, KubeflowPod("1", "gpu", 2)).config.nproc.kind, NprocSpec::Kind::kGpu);
  EXPECT_EQ(Launch({"train.py"}, KubeflowPod("1", "cpu", 2)).config.nproc.kind, NprocSpec::Kind::kCpu);
}

TEST(Kubeflow, FlagsInTheContainerCommandWin) {
  Applied a = Launch({"--nproc_per_node=2", "--master_port=29400", "train.py"}, KubeflowPod("3"));
  EXPECT_EQ(a.config.nproc_per_node, 2);
  EXPECT_EQ(a.config.master_port, 29400);
  EXPECT_EQ(a.config.node_rank, 3);
}

TEST(Kubeflow, PlainMasterVariablesAreNotRead) {
  // Before training-operator v1.7 pods only had MASTER_ADDR/MASTER_PORT/WORLD_SIZE/RANK. torchrun
  // reads none of them for its own options, and neither does ctrun (they are the workers' variables,
  // which ctrun sets itself).
  Applied a = Launch({"train.py"}, {{"PYTHONUNBUFFERED", "0"},
                                    {"MASTER_PORT", "23456"},
                                    {"MASTER_ADDR", "old-master-0"},
                                    {"WORLD_SIZE", "3"},
                                    {"RANK", "1"}});
  ASSERT_TRUE(a.status.ok());
  ExpectUntouched(a.config);
}

// training-operator v1.8/v1.9, PyTorchJob with elasticPolicy (Worker replicas only, so no MASTER_*,
// RANK, WORLD_SIZE or PET_NODE_RANK): PET_RDZV_ENDPOINT (<job>-worker-0:<port>, or rdzvHost:rdzvPort),
// PET_RDZV_BACKEND (rdzvBackend, default c10d), PET_NNODES ("MIN:MAX"; the webhook defaults a missing
// bound to the other one, or both to the worker replicas), and when given PET_MAX_RESTARTS,
// PET_RDZV_ID, PET_RDZV_CONF ("k=v,k=v"), plus PET_NPROC_PER_NODE.
Env KubeflowElasticPod() {
  return {{"PYTHONUNBUFFERED", "1"},
          {"PET_NPROC_PER_NODE", "auto"},
          {"PET_RDZV_ENDPOINT", "elastic-job-worker-0:23456"},
          {"PET_RDZV_BACKEND", "c10d"},
          {"PET_NNODES", "1:3"},
          {"PET_MAX_RESTARTS", "100"},
          {"PET_RDZV_ID", "elastic-job"},
          {"PET_RDZV_CONF", "join_timeout=600,last_call_timeout=10"}};
}

TEST(Kubeflow, ElasticWorkerPod) {
  Applied a = Launch({"train.py"}, KubeflowElasticPod());
  ASSERT_TRUE(a.status.ok());
  EXPECT_EQ(a.config.min_nodes, 1);
  EXPECT_EQ(a.config.max_nodes, 3);
  EXPECT_EQ(a.config.rdzv_backend, "c10d");
  EXPECT_EQ(a.config.rdzv_endpoint, "elastic-job-worker-0:23456");
  EXPECT_EQ(a.config.run_id, "elastic-job");
  EXPECT_THAT(a.config.rdzv_conf,
              UnorderedElementsAre(Pair("join_timeout", "600"), Pair("last_call_timeout", "10")));
  EXPECT_EQ(a.config.max_restarts, 100);
  EXPECT_EQ(a.config.nproc.kind, NprocSpec::Kind::kAuto);
  EXPECT_EQ(a.config.node_rank, 0);
  EXPECT_EQ(a.config.master_addr, "127.0.0.1");
  EXPECT_EQ(a.notice, "");
}

TEST(Kubeflow, ElasticDefaultsAndOptionalVariables) {
  // No min/max replicas: both default to the worker replicas. No rdzvId, rdzvConf or maxRestarts:
  // those variables are absent. The deprecated elasticPolicy.nProcPerNode gives a plain count.
  Env env = {{"PYTHONUNBUFFERED", "1"},
             {"PET_RDZV_ENDPOINT", "job-worker-0:23456"},
             {"PET_RDZV_BACKEND", "c10d"},
             {"PET_NNODES", "3:3"},
             {"PET_NPROC_PER_NODE", "4"}};
  Applied a = Launch({"train.py"}, env);
  ASSERT_TRUE(a.status.ok());
  EXPECT_EQ(a.config.min_nodes, 3);
  EXPECT_EQ(a.config.max_nodes, 3);
  EXPECT_EQ(a.config.run_id, "none");
  EXPECT_TRUE(a.config.rdzv_conf.empty());
  EXPECT_EQ(a.config.max_restarts, 0);
  EXPECT_EQ(a.config.nproc_per_node, 4);
}

TEST(Kubeflow, ElasticStandaloneIsRefusedLikeTorchrun) {
  // elasticPolicy.standalone=true makes the operator set PET_STANDALONE to the empty string. torchrun
  // reads on/off PET_ variables as integers and fails on it (int("")); ctrun refuses it as a usage
  // error naming the variable.
  Env env = KubeflowElasticPod();
  env["PET_STANDALONE"] = "";
  std::vector<std::string> args = {"ctrun", "train.py"};
  CliOutcome o = ParseCommandLine(args, MapEnv(env));
  EXPECT_EQ(o.action, CliOutcome::Action::kExit);
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_THAT(o.error, HasSubstr("invalid value '' for PET_STANDALONE"));
}

TEST(Kubeflow, TrainerV2TorchPod) {
  // Kubeflow Trainer (TrainJob, torch runtime): PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK (the
  // pod's job completion index), PET_MASTER_ADDR (<job>-trainer-node-0-0.<job>), PET_MASTER_PORT
  // (29500). PET_NPROC_PER_NODE defaults to "auto".
  Env env = {{"PET_NNODES", "2"},
             {"PET_NPROC_PER_NODE", "auto"},
             {"PET_NODE_RANK", "1"},
             {"PET_MASTER_ADDR", "myjob-trainer-node-0-0.myjob"},
             {"PET_MASTER_PORT", "29500"}};
  Applied a = Launch({"train.py"}, env);
  ASSERT_TRUE(a.status.ok());
  EXPECT_EQ(a.config.min_nodes, 2);
  EXPECT_EQ(a.config.max_nodes, 2);
  EXPECT_EQ(a.config.node_rank, 1);
  EXPECT_EQ(a.config.master_addr, "myjob-trainer-node-0-0.myjob");
  EXPECT_EQ(a.config.master_port, 29500);
  EXPECT_EQ(a.config.rdzv_backend, "static");
  EXPECT_EQ(a.config.nproc.kind, NprocSpec::Kind::kAuto);
}

TEST(Kubeflow, PetVariablesWinOverASlurmStep) {
  // A PyTorchJob pod never has SLURM_ variables, but if both were present the PET_ ones are the
  // user's choice and nothing is derived.
  Env env = KubeflowPod("1");
  for (const auto& [k, v] : SlurmStep("3")) env[k] = v;
  Applied a = Launch({"train.py"}, env);
  ASSERT_TRUE(a.status.ok());
  EXPECT_EQ(a.config.node_rank, 1);
  EXPECT_EQ(a.config.master_addr, "mnist-master-0");
  EXPECT_EQ(a.notice, "");
}

}  // namespace
}  // namespace ctrun
