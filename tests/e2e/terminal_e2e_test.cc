// ctrun at a terminal, end to end: the test is the terminal (helpers/terminal_session.h). Workers'
// stdout on a pty (a crashing C program's buffered lines are shown, isatty, window size and
// SIGWINCH), '\r' progress bars, terminal input forwarded to local rank 0, Ctrl-C on a stopped
// worker, Ctrl-Z / fg of the whole job.
#include <gtest/gtest.h>

#include <sstream>

#include "helpers/ctrun_command.h"
#include "helpers/terminal_session.h"
#include "helpers/test_util.h"

namespace ctrun::testing {
namespace {

using namespace std::chrono_literals;

// NO_COLOR: prefixes as plain text on the screen.
const std::vector<std::string> kEnv{"NO_COLOR=1", "TERM=xterm"};

std::vector<pid_t> WaitForPids(const std::string& path, size_t n) {
  std::vector<pid_t> pids;
  WaitFor([&] { return (pids = ReadPids(path)).size() >= n; }, 10s);
  return pids;
}

TEST(TerminalE2E, BufferedLinesOfACrashingWorkerAreShownOnATerminal) {
  // C stdio line-buffers a terminal: every complete line is out before abort().
  TerminalSession t(
      Ctrun({"--standalone", "--nproc_per_node=2"}, {"--buffered-crash", "5", "--only-rank", "1", "--else-hang"}),
      kEnv);
  ASSERT_TRUE(t.started());
  EXPECT_EQ(t.Wait(30s), 128 + SIGABRT) << t.screen();
  for (int i = 0; i < 5; ++i) {
    std::string line = "[r1] buffered line " + std::to_string(i) + "\r\n";  // the terminal's ONLCR
    EXPECT_NE(t.screen().find(line), std::string::npos) << line << "\n" << t.screen();
  }
}

TEST(TerminalE2E, WithTtyNeverWorkersGetPipesAsBefore) {
  // The contrast that makes the pty worth it: a pipe is block-buffered, abort() loses the lines.
  TerminalSession t(Ctrun({"--standalone", "--nproc_per_node=2", "--tty=never"},
                          {"--buffered-crash", "5", "--only-rank", "1", "--else-hang"}),
                    kEnv);
  ASSERT_TRUE(t.started());
  EXPECT_EQ(t.Wait(30s), 128 + SIGABRT) << t.screen();
  EXPECT_EQ(t.screen().find("buffered line"), std::string::npos) << t.screen();
}

TEST(TerminalE2E, WorkerSeesATerminalSizedLikeTheConsoleLessThePrefixAndFollowsResizes) {
  TempDir d;
  const std::string f = d / "winsize";
  TerminalSession t(Ctrun({"--standalone", "--nproc_per_node=2"}, {"--winsize-file", f}), kEnv, 30, 100);
  ASSERT_TRUE(t.started());
  for (int r : {0, 1}) {
    const std::string p = f + "." + std::to_string(r) + ".0";
    ASSERT_TRUE(WaitFor([&] { t.Pump(0); return !ReadFileOr(p).empty(); }, 10s)) << t.screen();
    EXPECT_EQ(ReadFileOr(p), "30 95 1\n");  // "[r0] " takes 5 of the 100 columns; isatty(1)
  }
  t.Resize(40, 120);  // the kernel sends SIGWINCH to ctrun (the foreground group), ctrun to the workers
  for (int r : {0, 1}) {
    const std::string p = f + "." + std::to_string(r) + ".1";
    ASSERT_TRUE(WaitFor([&] { t.Pump(0); return !ReadFileOr(p).empty(); }, 10s)) << t.screen();
    EXPECT_EQ(ReadFileOr(p), "40 115 1\n");
  }
  EXPECT_EQ(t.Wait(30s), 0) << t.screen();
}

// One worker inherits ctrun's terminal (no pty of its own): the kernel tells only the foreground
// group (ctrun's) of a resize, so ctrun passes the SIGWINCH on to the worker's group.
TEST(TerminalE2E, AWorkerThatInheritsTheTerminalIsToldOfResizes) {
  TempDir d;
  const std::string f = d / "winsize";
  TerminalSession t(Ctrun({"--standalone", "--nproc_per_node=1"}, {"--winsize-file", f}), kEnv, 30, 100);
  ASSERT_TRUE(t.started());
  ASSERT_TRUE(WaitFor([&] { t.Pump(0); return !ReadFileOr(f + ".0.0").empty(); }, 10s)) << t.screen();
  EXPECT_EQ(ReadFileOr(f + ".0.0"), "30 100 1\n");  // the console itself: no prefix
  t.Resize(40, 120);
  ASSERT_TRUE(WaitFor([&] { t.Pump(0); return !ReadFileOr(f + ".0.1").empty(); }, 10s)) << t.screen();
  EXPECT_EQ(ReadFileOr(f + ".0.1"), "40 120 1\n");
  EXPECT_EQ(t.Wait(30s), 0) << t.screen();
}

// --tee 0:1 tees rank 1 only; as in torchrun, only teed streams carry the prefix. Rank 1's
// console lines have none, so its pty is the console's full width, on a resize too.
TEST(TerminalE2E, AWorkerWithoutAPrefixGetsTheFullWidthOnResizes) {
  TempDir d;
  const std::string f = d / "winsize";
  TerminalSession t(Ctrun({"--standalone", "--nproc_per_node=2", "--tee", "0:1"}, {"--winsize-file", f}), kEnv, 30,
                    100);
  ASSERT_TRUE(t.started());
  const std::string first = f + ".1.0", second = f + ".1.1";
  ASSERT_TRUE(WaitFor([&] { t.Pump(0); return !ReadFileOr(first).empty(); }, 10s)) << t.screen();
  EXPECT_EQ(ReadFileOr(first), "30 100 1\n");
  t.Resize(40, 120);
  ASSERT_TRUE(WaitFor([&] { t.Pump(0); return !ReadFileOr(second).empty(); }, 10s)) << t.screen();
  EXPECT_EQ(ReadFileOr(second), "40 120 1\n");
  t.Type("\x03");  // rank 0 (stdout teed through a pipe) waits for a resize it is never told of
  EXPECT_EQ(t.Wait(10s), 128 + SIGINT) << t.screen();
}

// `ctrun ... > file`: the worker inherits only stderr from the terminal; it is told of resizes
// all the same (the kernel tells only ctrun's group).
TEST(TerminalE2E, AWorkerThatInheritsOnlyStderrFromTheTerminalIsToldOfResizes) {
  TempDir d;
  const std::string f = d / "winsize";
  std::vector<std::string> argv{"/bin/sh", "-c", "exec \"$@\" > " + std::string(d / "out"), "sh"};
  for (const std::string& a : Ctrun({"--standalone", "--nproc_per_node=1"}, {"--winsize-file", f})) argv.push_back(a);
  TerminalSession t(argv, kEnv, 30, 100);
  ASSERT_TRUE(t.started());
  ASSERT_TRUE(WaitFor([&] { t.Pump(0); return !ReadFileOr(f + ".0.0").empty(); }, 10s)) << t.screen();
  t.Resize(40, 120);
  EXPECT_TRUE(WaitFor([&] { t.Pump(0); return !ReadFileOr(f + ".0.1").empty(); }, 10s)) << t.screen();
  EXPECT_EQ(t.Wait(30s), 0) << t.screen();
}

TEST(TerminalE2E, CarriageReturnProgressUpdatesRedrawOneLine) {
  TerminalSession t(Ctrun({"--standalone", "--nproc_per_node=2", "--local-ranks-filter=0"}, {"--progress", "5"}),
                    kEnv);
  ASSERT_TRUE(t.started());
  EXPECT_EQ(t.Wait(30s), 0) << t.screen();
  const std::string& s = t.screen();
  size_t first = s.find("[r0] progress 1/5");
  size_t last = s.find("[r0] progress 5/5");
  ASSERT_NE(first, std::string::npos) << s;  // 20 ms apart: each update is drawn
  ASSERT_NE(last, std::string::npos) << s;
  // Redrawn in place: carriage returns and erase-line, never a new line between the updates.
  EXPECT_EQ(s.substr(first, last - first).find('\n'), std::string::npos) << s;
  EXPECT_NE(s.substr(first, last - first).find("\r"), std::string::npos) << s;
  EXPECT_EQ(s.find("[r1]"), std::string::npos) << s;
}

TEST(TerminalE2E, TypedLineReachesLocalRankZeroOthersReadEndOfFile) {
  TerminalSession t(Ctrun({"--standalone", "--nproc_per_node=2"}, {"--read-line"}), kEnv);
  ASSERT_TRUE(t.started());
  // The prompt has no newline: the relay draws the pending partial line.
  ASSERT_TRUE(t.WaitForText("[r0] prompt> ", 10s)) << t.screen();
  ASSERT_TRUE(t.WaitForText("[r1] prompt> got EOF", 10s)) << t.screen();  // /dev/null
  t.Type("hello rank zero\n");
  // The worker's line is its prompt and its answer (the typed text was echoed by the terminal).
  ASSERT_TRUE(t.WaitForText("[r0] prompt> got: hello rank zero", 10s)) << t.screen();
  EXPECT_EQ(t.Wait(30s), 0) << t.screen();
}

TEST(TerminalE2E, PythonInputOnRankZero) {
  if (::access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/python3";
  const std::string script =
      "import os, sys\n"
      "if os.environ['LOCAL_RANK'] == '0':\n"
      "    print('hello', input('name? '))\n"
      "else:\n"
      "    print('stdin of rank', os.environ['LOCAL_RANK'], 'is', os.readlink('/proc/self/fd/0'))\n";
  TerminalSession t({CTRUN_BINARY, "--standalone", "--nproc_per_node=2", "--no-python", "/usr/bin/python3", "-c",
                     script},
                    kEnv);
  ASSERT_TRUE(t.started());
  ASSERT_TRUE(t.WaitForText("[r0] name? ", 20s)) << t.screen();
  t.Type("world\n");
  ASSERT_TRUE(t.WaitForText("[r0] name? hello world", 10s)) << t.screen();
  EXPECT_EQ(t.Wait(30s), 0) << t.screen();
  EXPECT_NE(t.screen().find("[r1] stdin of rank 1 is /dev/null"), std::string::npos) << t.screen();
}

TEST(TerminalE2E, CtrlCOnAStoppedWorkerEndsTheJobAtOnce) {
  TempDir d;
  const std::string pids_file = d / "pids";
  TerminalSession t(Ctrun({"--standalone", "--nproc_per_node=2", "--shutdown-timeout=30"},
                          {"--pid-file", pids_file, "--hang"}),
                    kEnv);
  ASSERT_TRUE(t.started());
  auto pids = WaitForPids(pids_file, 2);
  ASSERT_EQ(pids.size(), 2u);
  ::kill(pids[0], SIGSTOP);  // like a worker stopped by a debugger or SIGTTIN
  ASSERT_TRUE(WaitFor([&] { return ProcState(pids[0]) == 'T'; }, 5s));
  const auto start = std::chrono::steady_clock::now();
  t.Type("\x03");
  EXPECT_EQ(t.Wait(10s), 128 + SIGINT) << t.screen();
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took, 1s) << "SIGINT without SIGCONT waits out the 30 s grace period";
}

// A worker that inherits the terminal runs in a background process group: with `stty tostop` its
// first write stops it (SIGTTOU). ctrun says so instead of a silent hang, and Ctrl-C ends the job.
TEST(TerminalE2E, AWorkerStoppedForUsingTheTerminalIsNamed) {
  std::vector<std::string> argv{"/bin/sh", "-c", "stty tostop && exec \"$@\"", "sh"};
  for (const std::string& a : Ctrun({"--standalone", "--nproc_per_node=1"}, {"--print", "2"})) argv.push_back(a);
  TerminalSession t(argv, kEnv);
  ASSERT_TRUE(t.started());
  ASSERT_TRUE(WaitFor([&] { t.Pump(0); return t.screen().find("is stopped by SIGTTOU") != std::string::npos; }, 10s))
      << t.screen();
  EXPECT_NE(t.screen().find("runs each worker in a process group of its own"), std::string::npos) << t.screen();
  t.Type("\x03");
  EXPECT_EQ(t.Wait(10s), 128 + SIGINT) << t.screen();
}

TEST(TerminalE2E, CtrlZSuspendsEveryWorkerAndFgResumesThem) {
  TempDir d;
  const std::string pids_file = d / "pids";
  TerminalSession t(Ctrun({"--standalone", "--nproc_per_node=2"}, {"--pid-file", pids_file, "--hang"}), kEnv);
  ASSERT_TRUE(t.started());
  auto pids = WaitForPids(pids_file, 2);
  ASSERT_EQ(pids.size(), 2u);
  t.Type("\x1a");
  auto all_stopped = [&] {
    t.Pump(0);
    return ProcState(t.pid()) == 'T' && ProcState(pids[0]) == 'T' && ProcState(pids[1]) == 'T';
  };
  ASSERT_TRUE(WaitFor(all_stopped, 10s)) << ProcState(t.pid()) << ProcState(pids[0]) << ProcState(pids[1]) << "\n"
                                         << t.screen();
  t.Continue();  // fg
  auto all_running = [&] {
    t.Pump(0);
    return ProcState(t.pid()) != 'T' && ProcState(pids[0]) != 'T' && ProcState(pids[1]) != 'T';
  };
  ASSERT_TRUE(WaitFor(all_running, 10s)) << ProcState(t.pid()) << ProcState(pids[0]) << ProcState(pids[1]);
  ASSERT_TRUE(t.WaitForText("resuming the job", 10s)) << t.screen();
  t.Type("\x03");
  EXPECT_EQ(t.Wait(10s), 128 + SIGINT) << t.screen();
}

}  // namespace
}  // namespace ctrun::testing
