// Where the main thread of a hung rank waits, read from gdb's and eu-stack's output.
#include "health/native_stack.h"

#include <gtest/gtest.h>

namespace ctrun::health {
namespace {

const char* kGdbInCollective =
    "[New LWP 18583]\n"
    "Thread 3 (Thread 0x7f7b1f7fe6c0 (LWP 18589) \"python3\"):\n"
    "#0  0x00007f7b287f1c06 in epoll_wait () from /lib/x86_64-linux-gnu/libc.so.6\n"
    "#1  0x00007f7b2445b2a0 in gloo::transport::tcp::Loop::run() () from libtorch_cpu.so.1.13\n"
    "Thread 1 (Thread 0x7f7b286fa040 (LWP 18575) \"python3\"):\n"
    "#0  __futex_abstimed_wait_common64 (private=0) at ./nptl/futex-internal.c:57\n"
    "#5  0x00007f7b242c2843 in c10d::Work::wait(std::chrono::duration<long, std::ratio<1l, 1000l> >) () from "
    "/lib/x86_64-linux-gnu/libtorch_cpu.so.1.13\n"
    "#8  0x0000000000547b96 in ?? ()\n"
    "[Inferior 1 (process 18575) detached]\n";

// The sleeping rank: its gloo thread has gloo:: frames, its main thread none.
const char* kGdbSleeping =
    "Thread 2 (Thread 0x7f97e67fc6c0 (LWP 18593) \"python3\"):\n"
    "#1  0x00007f97eb45b2a0 in gloo::transport::tcp::Loop::run() () from libtorch_cpu.so.1.13\n"
    "Thread 1 (Thread 0x7f97ef942040 (LWP 18577) \"python3\"):\n"
    "#0  0x00007f97efa12545 in __GI___clock_nanosleep (clock_id=1) at clock_nanosleep.c:48\n"
    "#2  0x000000000052c21a in _PyEval_EvalFrameDefault ()\n";

TEST(NativeStack, TheMainThreadsFramesDecide) {
  EXPECT_EQ(ClassifyMainThread(kGdbInCollective, 18575), MainThreadWait::kInCollective);
  EXPECT_EQ(ClassifyMainThread(kGdbSleeping, 18577), MainThreadWait::kElsewhere);
}

TEST(NativeStack, EuStacksFormat) {
  const char* text =
      "PID 4242 - process\n"
      "TID 4242:\n"
      "#0  0x00007f0000000001 __GI___clock_nanosleep\n"
      "TID 4243:\n"
      "#0  0x00007f0000000002 c10d::ProcessGroupGloo::runLoop(int)\n";
  EXPECT_EQ(ClassifyMainThread(text, 4242), MainThreadWait::kElsewhere);
  EXPECT_EQ(ClassifyMainThread(text, 4243), MainThreadWait::kInCollective);
}

TEST(NativeStack, GdbWithoutAThreadLibraryNamesTheProcess) {
  EXPECT_EQ(ClassifyMainThread("Thread 1 (process 77):\n#0  0x1 in nanosleep ()\n", 77), MainThreadWait::kElsewhere);
}

TEST(NativeStack, NoMainThreadFramesIsUnknown) {
  EXPECT_EQ(ClassifyMainThread("", 1), MainThreadWait::kUnknown);
  EXPECT_EQ(ClassifyMainThread("[New LWP 18583]\n[New LWP 18584]\n", 18575), MainThreadWait::kUnknown);  // cut
  EXPECT_EQ(ClassifyMainThread(kGdbSleeping, 99999), MainThreadWait::kUnknown);  // another process's file
  EXPECT_EQ(ClassifyMainThread("Thread 1 (Thread 0x1 (LWP 7) \"x\"):\n", 7), MainThreadWait::kUnknown);
}

}  // namespace
}  // namespace ctrun::health
