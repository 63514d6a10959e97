// Side by side with torchrun: one command line under Debian's torchrun (torch 1.13, through
// torchrun_py311.py) and under ctrun. What the workers see, what lands in --log_dir, the tee'd
// console lines and the failure summary must be the same, but for the differences the README
// states, each named where it is allowed.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "helpers/free_port.h"
#include "helpers/test_util.h"

namespace ctrun::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

const char* kPython = "/usr/bin/python3";
const std::string kRunId = "side-by-side";

bool HaveTorchrun() { return PythonCanImport("torch.distributed.run"); }

std::string Script(const std::string& name) { return std::string(COMPAT_DIR) + "/" + name; }

// `torchrun --standalone`, spelled out: a c10d rendezvous on loopback with the given run id, on a
// free port (--standalone itself takes the fixed port 29400, which another job may hold).
std::vector<std::string> Torchrun(const std::vector<std::string>& args) {
  std::vector<std::string> argv{kPython, Script("torchrun_py311.py"), "--rdzv_backend=c10d",
                                "--rdzv_endpoint=127.0.0.1:" + std::to_string(FreePort()), "--rdzv_id=" + kRunId,
                                "--nnodes=1"};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

std::vector<std::string> Ctrun(const std::vector<std::string>& args) {
  std::vector<std::string> argv{CTRUN_BINARY, "--standalone", "--rdzv_id=" + kRunId};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

// One environment for both launchers: the interpreter torchrun runs under, and one
// PET_MASTER_PORT (RunCommand would pick one per run, and the workers inherit it).
std::vector<std::string> SharedEnv() {
  static const std::string port = std::to_string(FreePort());
  return {std::string("PYTHON_EXEC=") + kPython, "PET_MASTER_PORT=" + port};
}

nlohmann::json Seen(const std::string& dir, int rank) {
  return nlohmann::json::parse(ReadFileOr(dir + "/" + std::to_string(rank) + ".json", "null"));
}

// Every file below `log_dir` by its path, with the run's directory (<run_id>_<random>) as "RUN",
// and its contents.
std::map<std::string, std::string> LogFiles(const std::string& log_dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(log_dir)) {
    if (!e.is_regular_file()) continue;
    std::string rel = fs::relative(e.path(), log_dir).string();
    const size_t slash = rel.find('/');
    if (rel.rfind(kRunId + "_", 0) == 0 && slash != std::string::npos) rel = "RUN" + rel.substr(slash);
    files[rel] = ReadFileOr(e.path().string());
  }
  return files;
}

std::vector<std::string> SortedLines(const std::string& text) {
  std::vector<std::string> lines = SplitLines(text);
  std::sort(lines.begin(), lines.end());
  return lines;
}

// The failure summary: the lines between the first two rows of '=', with the time and the pids
// (which differ from run to run) masked.
std::vector<std::string> SummaryBlock(const std::string& err) {
  const std::string rule(60, '=');
  std::vector<std::string> block;
  bool inside = false;
  for (const std::string& line : SplitLines(err)) {
    if (line == rule) {
      if (inside) break;
      inside = true;
      continue;
    }
    if (!inside) continue;
    std::string masked = std::regex_replace(line, std::regex(R"(\(pid: \d+\))"), "(pid: P)");
    if (masked.rfind("  time      : ", 0) == 0) masked = "  time      : T";
    block.push_back(masked);
  }
  return block;
}

// The first of torchrun's summary lines, but those `skip` says, that ctrun's summary lacks or has
// out of torchrun's order; nullopt when all are there in order.
std::optional<std::string> FirstLineOutOfOrder(const std::vector<std::string>& torchrun,
                                               const std::vector<std::string>& ctrun,
                                               const std::function<bool(const std::string&)>& skip) {
  auto next = ctrun.begin();
  for (const std::string& line : torchrun) {
    if (skip(line)) continue;
    next = std::find(next, ctrun.end(), line);
    if (next == ctrun.end()) return line;
  }
  return std::nullopt;
}

TEST(SideBySide, WorkersSeeTorchrunsEnvironmentArgvAndWorkingDirectory) {
  if (!HaveTorchrun()) GTEST_SKIP() << "/usr/bin/python3 cannot import torch.distributed.run (install python3-torch)";
  TempDir t, c;
  auto args = [](const std::string& dir) {
    return std::vector<std::string>{"--nproc_per_node=2", "--max_restarts=2", Script("env_dump.py"), dir, "a",
                                    "${local_rank}", "--f=x"};
  };
  const RunResult tr = RunCommand(Torchrun(args(t.path())), SharedEnv(), 180s);
  ASSERT_EQ(tr.exit_code, 0) << tr.err;
  const RunResult cr = RunCommand(Ctrun(args(c.path())), SharedEnv(), 120s);
  ASSERT_EQ(cr.exit_code, 0) << cr.err;

  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const nlohmann::json seen_t = Seen(t.path(), rank), seen_c = Seen(c.path(), rank);
    ASSERT_TRUE(seen_t.is_object() && seen_c.is_object());
    // argv[1] is the output directory, which differs; ${local_rank} is expanded alike.
    auto argv_t = seen_t["argv"].get<std::vector<std::string>>();
    auto argv_c = seen_c["argv"].get<std::vector<std::string>>();
    ASSERT_EQ(argv_t.size(), 5u);
    ASSERT_EQ(argv_c.size(), 5u);
    argv_t.erase(argv_t.begin() + 1);
    argv_c.erase(argv_c.begin() + 1);
    EXPECT_EQ(argv_c, argv_t);
    EXPECT_EQ(argv_c[2], std::to_string(rank));
    EXPECT_EQ(seen_c["cwd"], seen_t["cwd"]);

    const auto env_t = seen_t["env"].get<std::map<std::string, std::string>>();
    const auto env_c = seen_c["env"].get<std::map<std::string, std::string>>();
    for (const auto& [name, value] : env_t) {
      SCOPED_TRACE(name + "=" + value);
      ASSERT_TRUE(env_c.count(name)) << "torchrun's workers have " << name << ", ctrun's do not";
      const std::string& mine = env_c.at(name);
      if (name == "MASTER_PORT") {
        EXPECT_GT(std::stoi(mine), 0);  // a free port in each run
      } else if (name == "MASTER_ADDR") {
        EXPECT_EQ(mine, "127.0.0.1");  // ctrun's --standalone store listens on loopback only
      } else if (name == "TORCHELASTIC_ERROR_FILE") {
        const std::string end = "/attempt_0/" + std::to_string(rank) + "/error.json";
        for (const std::string& path : {value, mine}) {
          EXPECT_TRUE(path.ends_with(end)) << path;
          EXPECT_NE(path.find("/" + kRunId + "_"), std::string::npos) << path;
        }
      } else if (name == "TORCHELASTIC_USE_AGENT_STORE") {
        EXPECT_EQ(value, "False");  // torch 1.13's c10d agent hosts no store for its workers
        EXPECT_EQ(mine, "True");    // ctrun's does, as torch 2.x's does
      } else {
        EXPECT_EQ(mine, value);
      }
    }
    for (const auto& [name, value] : env_c) {
      if (env_t.count(name)) continue;
      // torch 2.x's name for NCCL_ASYNC_ERROR_HANDLING, which both set.
      EXPECT_EQ(name, "TORCH_NCCL_ASYNC_ERROR_HANDLING") << "ctrun's workers have " << name << "=" << value
                                                         << ", torchrun's do not";
    }
  }
}

// `-m MODULE` (the module found through PYTHONPATH) and `--no_python PROGRAM`: the same argv.
TEST(SideBySide, ModuleAndNoPythonEntrypointsGetTorchrunsArgv) {
  if (!HaveTorchrun()) GTEST_SKIP() << "no torch";
  std::vector<std::string> env = SharedEnv();
  env.push_back(std::string("PYTHONPATH=") + COMPAT_DIR);
  using Entry = std::vector<std::string>;
  for (const Entry& entry : {Entry{"-m", "env_dump"}, Entry{"--no_python", kPython, Script("env_dump.py")}}) {
    SCOPED_TRACE(entry[0]);
    TempDir t, c;
    auto args = [&](const std::string& dir) {
      std::vector<std::string> a{"--nproc_per_node=1"};
      a.insert(a.end(), entry.begin(), entry.end());
      a.insert(a.end(), {dir, "b", "${local_rank}"});
      return a;
    };
    const RunResult tr = RunCommand(Torchrun(args(t.path())), env, 180s);
    ASSERT_EQ(tr.exit_code, 0) << tr.err;
    const RunResult cr = RunCommand(Ctrun(args(c.path())), env, 120s);
    ASSERT_EQ(cr.exit_code, 0) << cr.err;
    const nlohmann::json seen_t = Seen(t.path(), 0), seen_c = Seen(c.path(), 0);
    ASSERT_TRUE(seen_t.is_object() && seen_c.is_object());
    auto argv_t = seen_t["argv"].get<std::vector<std::string>>();
    auto argv_c = seen_c["argv"].get<std::vector<std::string>>();
    ASSERT_EQ(argv_t.size(), 4u);
    ASSERT_EQ(argv_c.size(), 4u);
    EXPECT_EQ(argv_t[0], Script("env_dump.py"));
    argv_t.erase(argv_t.begin() + 1);  // the output directory
    argv_c.erase(argv_c.begin() + 1);
    EXPECT_EQ(argv_c, argv_t);
  }
}

TEST(SideBySide, LogDirectoryAndTeedLinesAreTorchruns) {
  if (!HaveTorchrun()) GTEST_SKIP() << "no torch";
  TempDir t, c, sync_t, sync_c;
  // Rank 1 exits 3 in attempt 0; attempt 1 succeeds. Both streams go to files, stdout is also
  // tee'd to the console.
  auto args = [](const std::string& log_dir, const std::string& sync_dir) {
    return std::vector<std::string>{"--nproc_per_node=2", "--max_restarts=1", "--log_dir", log_dir, "--redirects",
                                    "3", "--tee", "1", Script("say_and_fail.py"), "1", sync_dir};
  };
  const RunResult tr = RunCommand(Torchrun(args(t.path(), sync_t.path())), SharedEnv(), 180s);
  ASSERT_EQ(tr.exit_code, 0) << tr.err;
  const RunResult cr = RunCommand(Ctrun(args(c.path(), sync_c.path())), SharedEnv(), 120s);
  ASSERT_EQ(cr.exit_code, 0) << cr.err;

  const auto files_t = LogFiles(t.path()), files_c = LogFiles(c.path());
  EXPECT_EQ(files_t.size(), 8u);  // attempt_{0,1}/{0,1}/std{out,err}.log
  EXPECT_EQ(files_c, files_t);
  // The tee'd lines carry torchrun's [<role><local_rank>]: prefix; the order across ranks is the
  // scheduler's.
  EXPECT_EQ(SortedLines(cr.out), SortedLines(tr.out));
  EXPECT_EQ(CountOf(tr.out, "[default1]:out rank 1 attempt 1"), 1) << tr.out;
  for (const std::string* err : {&tr.err, &cr.err}) EXPECT_EQ(CountOf(*err, "err rank"), 0) << *err;
}

TEST(SideBySide, FailureSummaryHasTorchrunsLines) {
  if (!HaveTorchrun()) GTEST_SKIP() << "no torch";
  TempDir sync_t, sync_c;
  auto args = [](const std::string& sync_dir) {
    return std::vector<std::string>{"--nproc_per_node=2", Script("say_and_fail.py"), "1", sync_dir};
  };
  const RunResult tr = RunCommand(Torchrun(args(sync_t.path())), SharedEnv(), 180s);
  EXPECT_EQ(tr.exit_code, 1) << tr.err;  // torchrun exits 1 on every failure
  const RunResult cr = RunCommand(Ctrun(args(sync_c.path())), SharedEnv(), 120s);
  EXPECT_EQ(cr.exit_code, 3) << cr.err;  // ctrun passes the root cause's code on

  // ctrun's summary is torchrun's with lines of its own added (cause, hint) and a traceback line
  // of its own (the worker's last line of stderr when there is no error file): every other line of
  // torchrun's is there, in torchrun's order.
  const std::vector<std::string> block_t = SummaryBlock(tr.err), block_c = SummaryBlock(cr.err);
  ASSERT_GT(block_t.size(), 5u) << tr.err;
  EXPECT_NE(std::find(block_t.begin(), block_t.end(), "  rank      : 1 (local_rank: 1)"), block_t.end()) << tr.err;
  const auto missing =
      FirstLineOutOfOrder(block_t, block_c, [](const std::string& line) { return line.rfind("  traceback : ", 0) == 0; });
  ASSERT_FALSE(missing) << "torchrun's summary line \"" << *missing << "\" is not in ctrun's, or not in order:\n"
                        << cr.err;
}

// --run_path: torchrun runs the script through runpy.run_path in a worker function under @record.
// The same argv, __name__, __file__ and environment; a raise lands in the error file (the script
// has no @record) and the summary has torchrun's lines, the error file's path aside.
TEST(SideBySide, RunPathGetsTorchrunsArgvErrorFileAndSummary) {
  if (!HaveTorchrun()) GTEST_SKIP() << "no torch";
  TempDir t, c;
  auto args = [](const std::string& dir) {
    return std::vector<std::string>{"--nproc_per_node=2", "--run_path", Script("run_path_dump.py"), dir, "1",
                                    "${local_rank}"};
  };
  const RunResult tr = RunCommand(Torchrun(args(t.path())), SharedEnv(), 180s);
  EXPECT_EQ(tr.exit_code, 1) << tr.err;
  const RunResult cr = RunCommand(Ctrun(args(c.path())), SharedEnv(), 120s);
  EXPECT_EQ(cr.exit_code, 1) << cr.err;

  // Rank 1 raised; rank 0 may have been stopped before it wrote its file.
  const nlohmann::json seen_t = Seen(t.path(), 1), seen_c = Seen(c.path(), 1);
  ASSERT_TRUE(seen_t.is_object() && seen_c.is_object()) << tr.err << cr.err;
  auto argv_t = seen_t["argv"].get<std::vector<std::string>>();
  auto argv_c = seen_c["argv"].get<std::vector<std::string>>();
  ASSERT_EQ(argv_t.size(), 4u);
  ASSERT_EQ(argv_c.size(), 4u);
  EXPECT_EQ(argv_t[0], Script("run_path_dump.py"));
  EXPECT_EQ(argv_t[3], "1");
  argv_t.erase(argv_t.begin() + 1);  // the output directory
  argv_c.erase(argv_c.begin() + 1);
  EXPECT_EQ(argv_c, argv_t);
  for (const char* key : {"name", "file", "cwd"}) EXPECT_EQ(seen_c[key], seen_t[key]) << key;
  EXPECT_EQ(seen_c["name"], "__main__");
  for (const char* name : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "ROLE_NAME", "OMP_NUM_THREADS"})
    EXPECT_EQ(seen_c["env"][name], seen_t["env"][name]) << name;

  const std::string message = "ValueError: corrupt sample 7 on rank 1";
  for (const nlohmann::json* seen : {&seen_t, &seen_c}) {
    const auto error = nlohmann::json::parse(ReadFileOr((*seen)["env"]["TORCHELASTIC_ERROR_FILE"].get<std::string>()),
                                             nullptr, false);
    ASSERT_TRUE(error.is_object()) << (*seen)["env"]["TORCHELASTIC_ERROR_FILE"];
    EXPECT_EQ(error["message"]["message"], message);
    const std::string stack = error["message"]["extraInfo"]["py_callstack"].get<std::string>();
    EXPECT_NE(stack.find("in load_batch"), std::string::npos) << stack;
    EXPECT_TRUE(error["message"]["extraInfo"]["timestamp"].is_string());
  }

  // Every line of torchrun's summary but the traceback's and the error file's path is in ctrun's,
  // in order; both tracebacks end with the exception.
  auto masked = [](std::vector<std::string> block) {
    for (std::string& line : block)
      if (line.rfind("  error_file: /", 0) == 0) line = "  error_file: PATH";
    return block;
  };
  const std::vector<std::string> block_t = masked(SummaryBlock(tr.err)), block_c = masked(SummaryBlock(cr.err));
  ASSERT_GT(block_t.size(), 5u) << tr.err;
  EXPECT_EQ(block_t.front(), "run_script_path FAILED");
  const auto missing = FirstLineOutOfOrder(block_t, block_c, [&](const std::string& line) {
    return line.rfind("  traceback : ", 0) == 0 || line.rfind("    ", 0) == 0 || line.rfind("  " + message, 0) == 0 ||
           line == "  ";
  });
  ASSERT_FALSE(missing) << "torchrun's summary line \"" << *missing << "\" is not in ctrun's, or not in order:\n"
                        << cr.err << "\ntorchrun's:\n" << tr.err;
  for (const auto* block : {&block_t, &block_c})
    EXPECT_NE(std::find(block->begin(), block->end(), "  " + message), block->end());
}

}  // namespace
}  // namespace ctrun::testing
