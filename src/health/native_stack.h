// Reading a native stack file of a hung rank (stack_capture.h: `eu-stack -p PID` or gdb's
// `thread apply all bt`, read as base/stack_text.h reads them) for one fact: where the process's
// main thread (tid == pid) waits. Pure: text in, answer out.
#pragma once

#include <sys/types.h>

#include <string_view>

namespace ctrun::health {

enum class MainThreadWait {
  kUnknown,       // no main-thread block with frames (capture cut, tool failed, file missing)
  kInCollective,  // a frame of the communication libraries (c10d::, gloo::, nccl): waits for its peers
  kElsewhere,     // frames, none of them the communication libraries': the rank's own code
};

MainThreadWait ClassifyMainThread(std::string_view native_stacks, pid_t pid);

}  // namespace ctrun::health
