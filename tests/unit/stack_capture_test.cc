// StackCapture on a real loop with fake tools (shell scripts standing in for eu-stack and gdb) and
// a real process group of three (a shell's two background sleeps and the leader, a copy of sleep
// named python3): what the summary counts as saved is what the tools wrote, never that they ran.
// Every wait is bounded: the group's start by WaitFor, the capture by its own deadline.
#include "health/stack_capture.h"

#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "helpers/test_util.h"
#include "sys/event_loop.h"

namespace ctrun::health {
namespace {

namespace fs = std::filesystem;
using ctrun::testing::BackgroundProcess;
using ctrun::testing::ReadFileOr;
using ctrun::testing::TempDir;
using ctrun::testing::WaitFor;

// eu-stack -p PID: for a pid in FAIL_NATIVE, what a refused attach (Yama ptrace_scope 1: EPERM)
// gives: nothing on stdout, the reason on stderr.
constexpr const char* kFakeEuStack =
    "#!/bin/sh\n"
    "case \" $FAIL_NATIVE \" in *\" $2 \"*)\n"
    "  echo \"eu-stack: dwfl_linux_proc_attach pid $2: Operation not permitted\" >&2; exit 1;;\n"
    "esac\n"
    "echo \"PID $2 - process\"; echo \"TID $2:\"; echo '#0  0x0000000000401000 fake_frame'\n";

// gdb -batch -nx -p PID -ex CMD (only the Python dump here): PY_RESULT is the line gdb prints for
// the dumper's result, as gdb 13 does ("$1 = 0x0": it returned NULL); FAIL_PYTHON: the attach is
// refused, as gdb says it (and the call then fails).
constexpr const char* kFakeGdb =
    "#!/bin/sh\n"
    "if [ -n \"$FAIL_PYTHON\" ]; then\n"
    "  echo 'ptrace: Operation not permitted.' >&2\n"
    "  echo 'No symbol table is loaded.  Use the \"file\" command.' >&2; exit 1\n"
    "fi\n"
    "echo '[Thread debugging using libthread_db enabled]'; echo \"$PY_RESULT\"\n";

class StackCaptureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(d / "bin");
    Write(d / "bin/eu-stack", kFakeEuStack);
    Write(d / "bin/gdb", kFakeGdb);
    fs::copy_file("/usr/bin/sleep", d / "python3");
    fs::permissions(d / "python3", fs::perms::owner_all);
    const std::string py = d / "python3";
    group = std::make_unique<BackgroundProcess>(
        std::vector<std::string>{"/bin/sh", "-c", "/usr/bin/sleep 1000 & /usr/bin/sleep 1000 & exec " + py + " 1000"},
        std::vector<std::string>{}, d / "out", d / "err");
    pgid = group->pid();
    // The leader has exec'd python3 and both sleeps run: three processes in the group.
    ASSERT_TRUE(WaitFor(
        [&] {
          std::error_code ec;
          return fs::read_symlink("/proc/" + std::to_string(pgid) + "/exe", ec).string() == py &&
                 ProcessesInGroup(pgid).size() == 3;
        },
        std::chrono::seconds(10)));
    pids = ProcessesInGroup(pgid);
    ASSERT_EQ(pids[0], pgid);
  }
  void TearDown() override {
    if (pgid > 0) ::kill(-pgid, SIGKILL);  // the sleeps too, not only the leader
  }
  static void Write(const std::string& path, const std::string& text) {
    std::ofstream(path) << text;
    fs::permissions(path, fs::perms::owner_all);
  }
  // Runs one capture to its end (bounded by its 20 s deadline); its summary's text (and
  // `complete`, its flag).
  std::string Capture(std::vector<std::string> env) {
    EventLoop loop;
    StackCapture capture(loop, StackTools{d / "bin/eu-stack", d / "bin/gdb", std::move(env)}, Seconds(20));
    std::string summary;
    capture.Capture(pgid, dir, [&](const StackSummary& s) {
      summary = s.text;
      complete = s.complete;
      loop.Stop();
    });
    loop.Run();
    return summary;
  }
  std::string File(const std::string& kind, pid_t pid, const std::string& ext) const {
    return dir + "/" + kind + "." + std::to_string(pid) + ext;
  }

  TempDir d;
  const std::string dir = d / "stacks";
  std::unique_ptr<BackgroundProcess> group;
  pid_t pgid = -1;
  std::vector<pid_t> pids;  // the group's, leader (python3) first
  bool complete = false;
};

TEST_F(StackCaptureTest, EveryProcessSavedAndTheDumpWritten) {
  const std::string s = Capture({"PY_RESULT=$1 = 0x0"});
  EXPECT_EQ(s, "stacks of 3 processes saved in " + dir + " (native: eu-stack; Python: 1 process, on the rank's stderr)");
  EXPECT_TRUE(complete);
  for (pid_t p : pids) EXPECT_NE(ReadFileOr(File("native", p, ".txt")).find("#0  0x"), std::string::npos) << p;
  EXPECT_FALSE(fs::exists(File("python", pgid, ".out"))) << "gdb's output of a dump that worked says nothing";
  EXPECT_FALSE(fs::exists(File("python", pgid, ".err")));
}

// Yama ptrace_scope 1 refuses one process's native attach and the Python dump's: that process's
// native.<pid>.txt is empty (removed, not counted) and the dump is not counted; the summary
// points to the error files.
TEST_F(StackCaptureTest, AProcessTheToolCouldNotAttachToIsNotCountedAsSaved) {
  const pid_t refused = pids[2];
  const std::string s =
      Capture({"FAIL_NATIVE=" + std::to_string(refused), "FAIL_PYTHON=1", "PY_RESULT=$1 = 0x0"});
  EXPECT_EQ(s, "stacks of 2 of 3 processes saved in " + dir +
                   " (native: eu-stack; Python: 0 of 1 process, on the rank's stderr); tool errors in python." +
                   std::to_string(pgid) + ".err, native." + std::to_string(refused) + ".err");
  EXPECT_FALSE(complete) << "a partial capture";
  EXPECT_FALSE(fs::exists(File("native", refused, ".txt")));
  EXPECT_NE(ReadFileOr(File("native", refused, ".err")).find("Operation not permitted"), std::string::npos);
  EXPECT_NE(ReadFileOr(File("python", pgid, ".err")).find("Operation not permitted"), std::string::npos);
  EXPECT_FALSE(fs::exists(File("python", pgid, ".out"))) << "empty";
}

// No native stack of any process, and the dumper itself reports an error: nothing is called
// saved, and its reason is kept.
TEST_F(StackCaptureTest, NothingReadIsNotCalledSaved) {
  std::string all;
  for (pid_t p : pids) all += std::to_string(p) + " ";
  const std::string s =
      Capture({"FAIL_NATIVE=" + all, "PY_RESULT=$1 = 0x7f00deadbeef \"unable to get the interpreter state\""});
  EXPECT_EQ(s.rfind("stacks not saved in " + dir + ": no native stack of the rank's 3 processes could be read "
                    "(native: eu-stack; Python: 0 of 1 process, on the rank's stderr); tool errors in native.",
                    0),
            0u)
      << s;
  EXPECT_NE(s.find("python." + std::to_string(pgid) + ".out"), std::string::npos) << s;
  EXPECT_NE(ReadFileOr(File("python", pgid, ".out")).find("unable to get the interpreter state"), std::string::npos);
  for (pid_t p : pids) EXPECT_FALSE(fs::exists(File("native", p, ".txt"))) << p;
  EXPECT_FALSE(complete);
}

// Every native stack saved but the Python dump refused: the text still starts "stacks of 3
// processes saved", and the capture is not complete (the agent logs it as a warning).
TEST_F(StackCaptureTest, APythonDumpThatFailedMakesTheCaptureIncomplete) {
  const std::string s = Capture({"FAIL_PYTHON=1", "PY_RESULT=$1 = 0x0"});
  EXPECT_EQ(s.rfind("stacks of 3 processes saved in " + dir + " (native: eu-stack; Python: 0 of 1 process", 0), 0u) << s;
  EXPECT_FALSE(complete);
}

}  // namespace
}  // namespace ctrun::health
