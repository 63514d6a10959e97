// End to end: CPU binding applied before exec, --report-bindings, --gpus and
// --virtual-local-rank with a simulated CUDA_VISIBLE_DEVICES, --debug-rank under gdbserver (and
// stopped before exec without it), bad values refused with one line. No GPU needed.
#include <sched.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "helpers/ctrun_command.h"
#include "helpers/test_util.h"

namespace ctrun::testing {
namespace {

using namespace std::chrono_literals;

std::vector<int> OwnCpus() {
  std::vector<int> out;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

std::string EnvValue(const std::string& env_dump, const std::string& key) {
  for (const auto& l : SplitLines(env_dump))
    if (l.rfind(key + "=", 0) == 0) return l.substr(key.size() + 1);
  return "<unset>";
}

std::vector<std::string> SplitCommas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

// The program's path through PATH, "" when it is not installed.
std::string OnPath(const std::string& name) {
  RunResult r = RunCommand({"/bin/sh", "-c", "command -v " + name});
  return r.exit_code == 0 && !r.out.empty() ? SplitLines(r.out)[0] : "";
}

// The first number after `marker` in `text`, -1 when absent.
long NumberAfter(const std::string& text, const std::string& marker) {
  std::smatch m;
  if (!std::regex_search(text, m, std::regex(marker + "([0-9]+)"))) return -1;
  return std::stol(m[1]);
}

// The pid of the rank ctrun's stderr (in `err_file`) says is stopped before exec, -1 when it does
// not say so within 20 s.
long StoppedBeforeExecPid(const std::filesystem::path& err_file) {
  long pid = -1;
  WaitFor(
      [&] {
        pid = NumberAfter(ReadFileOr(err_file), "stopped before exec, pid ");
        return pid > 0;
      },
      20s);
  return pid;
}

TEST(PlacementE2E, CpuBindingCoreGivesEachWorkerItsOwnCore) {
  const std::vector<int> cpus = OwnCpus();
  if (cpus.size() < 2) GTEST_SKIP() << "needs 2 CPUs";
  TempDir d;
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2", "--cpu-binding=core", "--report-bindings"},
                            {"--affinity-file", d / "aff"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string a0 = ReadFileOr(d / "aff.0"), a1 = ReadFileOr(d / "aff.1");
  ASSERT_FALSE(a0.empty());
  ASSERT_FALSE(a1.empty());
  // Disjoint, non-empty shares of the CPUs ctrun may use.
  std::set<std::string> seen;
  for (const std::string* a : {&a0, &a1})
    for (const auto& c : SplitCommas(SplitLines(*a)[0])) {
      EXPECT_TRUE(seen.insert(c).second) << "cpu " << c << " given twice";
      EXPECT_NE(std::find(cpus.begin(), cpus.end(), std::stoi(c)), cpus.end()) << c;
    }
  // One report line per rank, before it starts: its cpus, NUMA node and (no) GPU.
  EXPECT_NE(r.err.find("binding: rank 0 (local_rank 0): cpus " + SplitLines(a0)[0] + " (core) | numa 0 | gpu none"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("binding: rank 1 (local_rank 1): cpus " + SplitLines(a1)[0]), std::string::npos) << r.err;
}

TEST(PlacementE2E, WithoutBindingWorkersKeepCtrunsAffinity) {
  TempDir d;
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=1", "--report-bindings"}, {"--affinity-file", d / "aff"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string own;
  for (int c : OwnCpus()) own += (own.empty() ? "" : ",") + std::to_string(c);
  EXPECT_EQ(SplitLines(ReadFileOr(d / "aff.0"))[0], own);
  EXPECT_NE(r.err.find("binding: rank 0 (local_rank 0): cpus not bound | gpu none"), std::string::npos) << r.err;
}

TEST(PlacementE2E, GpusSelectAndVirtualLocalRankNarrows) {
  TempDir d;
  // No GPU here: the CUDA_VISIBLE_DEVICES entries are taken as written (a simulated machine).
  auto r = RunCommand(Ctrun({"--standalone", "--nproc_per_node=gpu", "--gpus=1,3", "--virtual-local-rank",
                             "--report-bindings"},
                            {"--env-file", d / "env"}),
                      {"CUDA_VISIBLE_DEVICES=4,5,6,7"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("starting 2 workers"), std::string::npos) << r.err;
  const std::string e0 = ReadFileOr(d / "env.0"), e1 = ReadFileOr(d / "env.1");
  EXPECT_EQ(EnvValue(e0, "CUDA_VISIBLE_DEVICES"), "5");
  EXPECT_EQ(EnvValue(e1, "CUDA_VISIBLE_DEVICES"), "7");
  EXPECT_EQ(EnvValue(e0, "LOCAL_RANK"), "0");
  EXPECT_EQ(EnvValue(e1, "LOCAL_RANK"), "0");
  EXPECT_EQ(EnvValue(e1, "RANK"), "1");
  EXPECT_NE(r.err.find("binding: rank 1 (local_rank 1): cpus not bound | gpu 7"), std::string::npos) << r.err;
  // The count came from the variable alone: said once (a CPU-only host that inherited it would
  // otherwise start that many workers silently).
  EXPECT_EQ(CountOf(r.err, "--nproc_per_node=gpu: no GPU was found on this machine (NVML, /proc/driver/nvidia, sysfs), "
                           "so the GPUs are the entries of CUDA_VISIBLE_DEVICES as written: 2"),
            1)
      << r.err;

  auto plain = RunCommand(Ctrun({"--standalone", "--nproc_per_node=2", "--gpus=3,0"}, {"--env-file", d / "plain"}),
                          {"CUDA_VISIBLE_DEVICES=GPU-aa,GPU-bb,GPU-cc,GPU-dd"});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(EnvValue(ReadFileOr(d / "plain.1"), "CUDA_VISIBLE_DEVICES"), "GPU-dd,GPU-aa");
  EXPECT_EQ(EnvValue(ReadFileOr(d / "plain.1"), "LOCAL_RANK"), "1");
}

TEST(PlacementE2E, BadValuesAreOneLineAndNothingStarts) {
  TempDir d;
  const std::vector<std::tuple<std::vector<std::string>, std::string, std::string>> cases = {
      {{"--gpus=7"}, "CUDA_VISIBLE_DEVICES=0,1",
       "ctrun: error: invalid value '7' for --gpus: GPU 7 does not exist: 2 visible (0-1, from CUDA_VISIBLE_DEVICES)"},
      {{"--gpus=0-x"}, "CUDA_VISIBLE_DEVICES=0,1",
       "ctrun: error: invalid value '0-x' for --gpus: '0-x' is not an index or a range like 0-3"},
      {{"--numa-binding=node"}, "CUDA_VISIBLE_DEVICES=",
       "ctrun: error: --numa-binding=node: local rank 0 has no GPU (or its PCI address is unknown); use "
       "--cpu-binding for jobs without GPUs"},
      {{"--cpu-binding=cache"}, "X=1",
       "ctrun: error: invalid value 'cache' for --cpu-binding: expected numa, socket, core or none"},
      {{"--nproc_per_node=2", "--debug-rank=2"}, "X=1",
       "ctrun: error: invalid value '2' for --debug-rank: the job has 2 ranks (0-1)"},
      {{"--nproc_per_node=3", "--virtual-local-rank"}, "CUDA_VISIBLE_DEVICES=0,1",
       "ctrun: error: --virtual-local-rank: local rank 2 has no GPU: CUDA_VISIBLE_DEVICES=0,1 lists 2 for 3 workers"},
  };
  for (const auto& [flags, env, message] : cases) {
    auto r = RunCommand(Ctrun(flags, {"--env-file", d / "started"}), {env});
    EXPECT_EQ(r.exit_code, 2) << flags[0] << ": " << r.err;
    EXPECT_EQ(r.err, message + "\n");
    EXPECT_FALSE(std::filesystem::exists(d / "started.0")) << flags[0];
  }
}

// Rank 1 waits in gdbserver on the printed port while rank 0 runs and finishes; a debugger that
// attaches and continues lets it finish too.
TEST(PlacementE2E, DebugRankWaitsForADebuggerOnThePrintedPort) {
  const std::string gdb_path = OnPath("gdb");
  if (OnPath("gdbserver").empty() || gdb_path.empty()) GTEST_SKIP() << "needs gdb and gdbserver";
  TempDir d;
  BackgroundProcess p(Ctrun({"--standalone", "--nproc_per_node=2", "--debug-rank=1"}, {"--env-file", d / "env"}), {},
                      d / "out", d / "err");
  long port = -1;
  ASSERT_TRUE(WaitFor(
      [&] {
        const std::string err = ReadFileOr(d / "err");
        port = NumberAfter(err, "waiting for a debugger on port ");
        return port > 0 && err.find("Listening on port " + std::to_string(port)) != std::string::npos;
      },
      20s))
      << ReadFileOr(d / "err");
  ASSERT_TRUE(WaitFor([&] { return std::filesystem::exists(d / "env.0"); }, 20s));  // rank 0 ran
  EXPECT_FALSE(std::filesystem::exists(d / "env.1"));                               // rank 1 waits
  auto gdb = RunCommand({gdb_path, "-batch", "-nx", "-ex", "target remote 127.0.0.1:" + std::to_string(port), "-ex",
                         "continue"},
                        {}, 60s);
  EXPECT_EQ(gdb.exit_code, 0) << gdb.out << gdb.err;
  EXPECT_EQ(p.Wait(30s), 0) << ReadFileOr(d / "err");
  EXPECT_EQ(EnvValue(ReadFileOr(d / "env.1"), "RANK"), "1");
}

// Whether `pid` is stopped ('T'), waited for.
bool WaitStopped(long pid) {
  return WaitFor(
      [&] { return ReadFileOr("/proc/" + std::to_string(pid) + "/stat").find(") T ") != std::string::npos; }, 10s);
}

TEST(PlacementE2E, DebugRankWithoutGdbserverStopsBeforeExec) {
  TempDir d;
  BackgroundProcess p(Ctrun({"--standalone", "--nproc_per_node=2", "--debug-rank=0"}, {"--env-file", d / "env"}),
                      {"PATH=" + d.path()}, d / "out", d / "err");
  const long pid = StoppedBeforeExecPid(d / "err");
  ASSERT_GT(pid, 0) << ReadFileOr(d / "err");
  // Stopped ('T') before exec: it has not run the worker; rank 1 has.
  ASSERT_TRUE(WaitStopped(pid));
  ASSERT_TRUE(WaitFor([&] { return std::filesystem::exists(d / "env.1"); }, 20s));
  EXPECT_FALSE(std::filesystem::exists(d / "env.0"));
  ::kill(static_cast<pid_t>(pid), SIGCONT);  // what a debugger's continue does
  EXPECT_EQ(p.Wait(30s), 0) << ReadFileOr(d / "err");
  EXPECT_EQ(EnvValue(ReadFileOr(d / "env.0"), "RANK"), "0");
}

// The debugged rank's program is gone when the debugger continues it (rebuilt meanwhile, or the
// wrong path): its exec fails long after ctrun stopped waiting for it. ctrun says why, as for an
// exec that fails at once, instead of a bare "exited with code 127".
TEST(PlacementE2E, ADebuggedRankWhoseExecFailsLaterIsToldWhy) {
  TempDir d;
  const std::string worker = d / "worker";
  std::filesystem::copy_file(FAKE_WORKER, worker);
  std::filesystem::permissions(worker, std::filesystem::perms::owner_all);
  BackgroundProcess p({CTRUN_BINARY, "--standalone", "--nproc_per_node=2", "--debug-rank=0", worker, "--env-file",
                       d / "env"},
                      {"PATH=" + d.path()}, d / "out", d / "err");
  const long pid = StoppedBeforeExecPid(d / "err");
  ASSERT_GT(pid, 0) << ReadFileOr(d / "err");
  ASSERT_TRUE(WaitFor([&] { return std::filesystem::exists(d / "env.1"); }, 20s));  // rank 1 ran
  // The line comes when the fork returns; a SIGCONT before the child's SIGSTOP would be lost.
  ASSERT_TRUE(WaitStopped(pid));
  std::filesystem::remove(worker);
  ::kill(static_cast<pid_t>(pid), SIGCONT);
  EXPECT_NE(p.Wait(30s), 0);
  const std::string err = ReadFileOr(d / "err");
  const std::string why = "never started: cannot execute " + worker + ": No such file or directory";
  EXPECT_NE(err.find("worker rank 0 (local_rank 0, pid " + std::to_string(pid) + ") " + why), std::string::npos)
      << err;
  EXPECT_NE(err.find("cause     : " + why), std::string::npos) << err;
}

// GPU and binding support is loaded at run time: the binary needs neither NVML, CUDA nor hwloc
// (nor hwloc's libudev).
TEST(PlacementE2E, CtrunLinksNoGpuOrHwlocLibrary) {
  auto r = RunCommand({"/usr/bin/readelf", "-d", CTRUN_BINARY});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* lib : {"hwloc", "udev", "nvidia-ml", "cuda", "nccl"}) {
    for (const auto& line : SplitLines(r.out)) {
      if (line.find("(NEEDED)") == std::string::npos) continue;
      EXPECT_EQ(line.find(lib), std::string::npos) << line;
    }
  }
}

}  // namespace
}  // namespace ctrun::testing
