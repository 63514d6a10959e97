// base/stack_text.h: gdb's and eu-stack's stack dumps read as thread blocks.
#include "base/stack_text.h"

#include <gtest/gtest.h>

namespace ctrun {
namespace {

TEST(StackText, GdbBlocksCarryTheirThreadIdNameAndFrames) {
  const char* text =
      "[New LWP 18583]\n"
      "Thread 2 (Thread 0x7f7b1f7fe6c0 (LWP 18589) \"pt_main_thread\"):\n"
      "#0  0x00007f7b287f1c06 in epoll_wait () from /lib/x86_64-linux-gnu/libc.so.6\n"
      "Thread 1 (Thread 0x7f7b286fa040 (LWP 18575) \"python3\"):\n"
      "#0  __futex_abstimed_wait_common64 (private=0) at ./nptl/futex-internal.c:57\n"
      "#1  0x00007f7b242c2843 in c10d::Work::wait(std::chrono::duration<long>) () from libtorch_cpu.so\n"
      "[Inferior 1 (process 18575) detached]\n";
  const std::vector<StackThread> threads = ReadStackThreads(text);
  ASSERT_EQ(threads.size(), 2u);
  EXPECT_EQ(threads[0].tid, 18589);
  EXPECT_EQ(threads[0].name, "pt_main_thread");
  ASSERT_EQ(threads[0].frames.size(), 1u);
  EXPECT_EQ(threads[0].frames[0].substr(0, 4), "#0  ");
  EXPECT_EQ(threads[1].tid, 18575);
  EXPECT_EQ(threads[1].name, "python3");
  EXPECT_EQ(threads[1].frames.size(), 2u);  // the "[Inferior ...]" line is no frame and no header
}

TEST(StackText, GdbWithoutAThreadLibraryEuStackAndAHeaderlessBacktrace) {
  const auto gdb = ReadStackThreads("Thread 1 (process 77):\n#0  0x1 in nanosleep ()\n");
  ASSERT_EQ(gdb.size(), 1u);
  EXPECT_EQ(gdb[0].tid, 77);
  EXPECT_EQ(gdb[0].name, "");
  const auto eu = ReadStackThreads("PID 9 - process\nTID 9:\n#0  0x7f01 __GI___poll\nTID 10:\n#0  0x7f02 read\n");
  ASSERT_EQ(eu.size(), 2u);
  EXPECT_EQ(eu[0].tid, 9);
  EXPECT_EQ(eu[1].tid, 10);
  EXPECT_EQ(eu[1].header, "TID 10:");
  const auto bare = ReadStackThreads("#0  0x7f in waitpid () from /lib/libc.so.6\n#1  main () at m.c:3");
  ASSERT_EQ(bare.size(), 1u);
  EXPECT_EQ(bare[0].header, "");
  EXPECT_EQ(bare[0].tid, 0);
  EXPECT_EQ(bare[0].frames.size(), 2u);  // the last line without its newline too
}

TEST(StackText, AHeaderThatNamesNoThreadKeepsItsTextAndTidZero) {
  const auto t = ReadStackThreads("Thread 3 (LWP abc):\n#0  x ()\nTID :\nThread 4 (LWP -5):\nTID 99999999999:\n");
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t[2].tid, 0);  // no sign
  EXPECT_EQ(t[3].tid, 0);  // past pid_t
  EXPECT_EQ(t[0].tid, 0);
  EXPECT_EQ(t[0].header, "Thread 3 (LWP abc):");
  EXPECT_EQ(t[1].tid, 0);
  EXPECT_TRUE(ReadStackThreads("").empty());
  EXPECT_TRUE(ReadStackThreads("#\n# comment\nno frames here\n").empty());
}

TEST(StackText, FrameFunctionDropsAddressesArgumentsTemplatesAndPlaces) {
  EXPECT_EQ(FrameFunction("#3  0x00007f in c10d::Work::wait(std::chrono::duration<long, std::ratio<1l, 1000l> >) () "
                          "from /lib/libtorch_cpu.so.1.13"),
            "c10d::Work::wait");
  EXPECT_EQ(FrameFunction("#0  __futex_abstimed_wait_common64 (private=0, cancel=true) at ./nptl/futex-internal.c:57"),
            "__futex_abstimed_wait_common64");
  EXPECT_EQ(FrameFunction("#5  0x00007f std::vector<int, std::allocator<int> >::push_back(int const&) ()"),
            "std::vector::push_back");
  EXPECT_EQ(FrameFunction("#0  0x00007f0000001000 __GI___poll"), "__GI___poll");  // eu-stack
  EXPECT_EQ(FrameFunction("#13 0x00007f in ?? () from /lib/x86_64-linux-gnu/libnccl.so.2"), "?? (libnccl.so.2)");
  EXPECT_EQ(FrameFunction("#8  0x0000000000547b96 in ?? ()"), "??");
  EXPECT_EQ(FrameFunction("#1"), "??");
}

}  // namespace
}  // namespace ctrun
