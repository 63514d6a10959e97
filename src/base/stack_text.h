// Native stack dumps read as thread blocks: gdb's `thread apply all bt` and `eu-stack -p PID`.
// The one reader of that text, for hang detection (health/native_stack.h: where a hung rank's main
// thread waits) and for the test harness's dump of a hung command. Pure: text in, values out.
//
//   gdb:       Thread 1 (Thread 0x7f7b286fa040 (LWP 18575) "python3"):
//              #5  0x00007f7b242c2843 in c10d::Work::wait(...) () from .../libtorch_cpu.so.1.13
//              Thread 1 (process 77):            (no thread library found: the process's pid)
//   eu-stack:  TID 18575:
//              #5  0x00007f7b242c2843 c10d::Work::wait(...)
//   bt of a single thread: frame lines without a header.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>
#include <vector>

namespace ctrun {

struct StackThread {
  std::string_view header;  // the "Thread ..." or "TID ...:" line; empty for frames before any header
  pid_t tid = 0;            // from the header's (LWP N), (process N) or TID N; 0 when it names none
  std::string_view name;    // gdb's quoted thread name ("python3"); empty where none
  std::vector<std::string_view> frames;  // the "#N ..." lines, innermost first
};

// Every thread block of `text`, in order; views into `text`. Lines that are neither a header nor
// a frame ("[New LWP 7]", "PID 9 - process") are skipped.
std::vector<StackThread> ReadStackThreads(std::string_view text);

// The function of one frame line, without its argument and template lists: gdb's
// "#3  0x7f.. in NAME (args) at f.c:1", "#0  NAME (args) at ...", eu-stack's "#0  0x7f.. NAME".
// An unnamed frame is "??", followed by its library's file name where the line has one:
// "#13 0x7f.. in ?? () from /lib/libx.so.6" -> "?? (libx.so.6)".
std::string FrameFunction(std::string_view frame_line);

}  // namespace ctrun
