// CompactStacks: a hung test's stack dump folded to a line a thread (tests/helpers/test_util.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include "helpers/test_util.h"

namespace ctrun::testing {
namespace {

TEST(CompactStacks, FoldsGdbThreadsToOneLineOfFunctionNamesEach) {
  const std::string gdb = R"(0x00007fad48d26f36 in epoll_wait (epfd=5, events=0x7ffe030b8ae0, maxevents=64, timeout=-1) at ../sysdeps/unix/sysv/linux/epoll_wait.c:30
30	../sysdeps/unix/sysv/linux/epoll_wait.c: No such file or directory.

Thread 3 (Thread 0x7fad465ff6c0 (LWP 20917) "ctrun"):
#0  __futex_abstimed_wait_common64 (private=0, cancel=true, abstime=0x0, op=393, expected=0, futex_word=0x611000005814) at ./nptl/futex-internal.c:57
#1  __futex_abstimed_wait_common (futex_word=futex_word@entry=0x611000005814) at ./nptl/futex-internal.c:87
#5  0x00005560eae4a06d in std::condition_variable::wait<ctrun::logs::LogDir::Releaser::Run()::{lambda()#1}>(std::unique_lock<std::mutex>&, ctrun::logs::LogDir::Releaser::Run()::{lambda()#1}) () at /usr/include/c++/12/condition_variable:102
#6  ctrun::logs::LogDir::Releaser::Run () at /check/work/main/src/logs/log_dir.cc:168
#13 0x00007fad48ad44a3 in ?? () from /lib/x86_64-linux-gnu/libstdc++.so.6

Thread 1 (Thread 0x7fad48b1c940 (LWP 20844) "ctrun"):
#0  0x00007fad48d26f36 in epoll_wait (epfd=5, events=0x7ffe030b8ae0, maxevents=64, timeout=-1) at ../sysdeps/unix/sysv/linux/epoll_wait.c:30
#1  0x000000000052f9c1 in _PyEval_EvalFrameDefault ()
#2  0x000000000052f9c1 in _PyEval_EvalFrameDefault ()
#3  0x000000000052f9c1 in _PyEval_EvalFrameDefault ()
)";
  EXPECT_EQ(CompactStacks(gdb),
            "  LWP 20917 \"ctrun\": __futex_abstimed_wait_common64 < __futex_abstimed_wait_common < "
            "std::condition_variable::wait < ctrun::logs::LogDir::Releaser::Run < ?? (libstdc++.so.6)\n"
            "  LWP 20844 \"ctrun\": epoll_wait < _PyEval_EvalFrameDefault x3\n");
}

TEST(CompactStacks, ThreadsWithTheSameStackShareALine) {
  const std::string gdb = "Thread 3 (Thread 0x1 (LWP 7) \"pt_main\"):\n#0  0x1 in poll ()\n"
                          "Thread 2 (Thread 0x2 (LWP 6) \"gloo\"):\n#0  0x1 in read ()\n"
                          "Thread 1 (Thread 0x3 (LWP 5) \"python3\"):\n#0  0x1 in poll ()\n";
  EXPECT_EQ(CompactStacks(gdb), "  2 threads (LWP 7 \"pt_main\", LWP 5 \"python3\"): poll\n  LWP 6 \"gloo\": read\n");
}

TEST(CompactStacks, ReadsEuStackAndASingleThreadedBacktrace) {
  EXPECT_EQ(CompactStacks("PID 9 - process\nTID 9:\n#0  0x00007f0000001000 __GI___poll\n#1  0x0000000000401000 main\n"),
            "  LWP 9: __GI___poll < main\n");
  EXPECT_EQ(CompactStacks("#0  0x00007f in waitpid () from /lib/libc.so.6\n#1  main () at m.c:3\n"),
            "  the only thread: waitpid < main\n");
  EXPECT_EQ(CompactStacks("Thread 1 (process 77):\n#0  0x00007f in pause () from /lib/libc.so.6\n"),
            "  LWP 77: pause\n");
  EXPECT_EQ(CompactStacks("no frames at all\n"), "");
}

TEST(CompactStacks, AHungCommandsDumpNamesItsProcessAndWhereItWaits) {
  using namespace std::chrono_literals;
  RunResult r = RunCommand({"/bin/sleep", "30"}, {}, 1s);
  EXPECT_EQ(r.exit_code, -1);
  EXPECT_NE(r.err.find("--- timed out; the processes below pid "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" state S wchan "), std::string::npos) << r.err;  // the name is the kernel's
  EXPECT_NE(r.err.find(": /bin/sleep 30 \n"), std::string::npos) << r.err;
  if (access("/usr/bin/eu-stack", X_OK) != 0 && access("/usr/bin/gdb", X_OK) != 0) GTEST_SKIP() << "no eu-stack or gdb";
  EXPECT_NE(r.err.find("nanosleep <"), std::string::npos) << r.err;  // a frame line, folded
}

}  // namespace
}  // namespace ctrun::testing
