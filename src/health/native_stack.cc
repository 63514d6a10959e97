#include "health/native_stack.h"

#include "base/stack_text.h"

namespace ctrun::health {

MainThreadWait ClassifyMainThread(std::string_view text, pid_t pid) {
  for (const StackThread& t : ReadStackThreads(text)) {
    if (t.tid != pid || t.header.empty()) continue;
    if (t.frames.empty()) return MainThreadWait::kUnknown;
    // Anywhere in the line: an unnamed frame of libnccl ("?? () from .../libnccl.so.2") counts.
    for (std::string_view frame : t.frames)
      for (std::string_view marker : {"c10d::", "gloo::", "nccl"})
        if (frame.find(marker) != std::string_view::npos) return MainThreadWait::kInCollective;
    return MainThreadWait::kElsewhere;
  }
  return MainThreadWait::kUnknown;
}

}  // namespace ctrun::health
