// libFuzzer target for the reader of native stack dumps (src/base/stack_text.cc) and the hung-rank
// classification on top of it (src/health/native_stack.cc): their input is whatever gdb or
// eu-stack printed about a process that may be anything, cut anywhere by the capture's bound.
// Checked properties (a violation traps):
//  - nothing crashes, throws, leaks or reads out of bounds (ASan/UBSan);
//  - every header and frame is a whole line of the input, in order, and a frame starts "#<digit>";
//  - a thread's tid is the number its header names, never negative;
//  - a frame's function is never empty;
//  - the classification is kUnknown for a pid that no thread block names.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/stack_text.h"
#include "health/native_stack.h"

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

// `part` is a view into `text` that starts a line and ends at a newline or the text's end.
void CheckWholeLine(std::string_view text, std::string_view part, const char** last) {
  Check(part.data() >= text.data() && part.data() + part.size() <= text.data() + text.size());
  Check(part.data() >= *last);
  Check(part.data() == text.data() || part.data()[-1] == '\n');
  const char* end = part.data() + part.size();
  Check(end == text.data() + text.size() || *end == '\n');
  Check(part.find('\n') == std::string_view::npos);
  *last = end;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const char* last = text.data();
  bool tid_named = false;
  for (const ctrun::StackThread& t : ctrun::ReadStackThreads(text)) {
    Check(t.tid >= 0);
    if (!t.header.empty()) CheckWholeLine(text, t.header, &last);
    tid_named = tid_named || t.tid == 1;
    for (std::string_view frame : t.frames) {
      CheckWholeLine(text, frame, &last);
      Check(frame.size() > 1 && frame[0] == '#' && frame[1] >= '0' && frame[1] <= '9');
      Check(!ctrun::FrameFunction(frame).empty());
    }
  }
  const auto wait = ctrun::health::ClassifyMainThread(text, 1);
  if (!tid_named) Check(wait == ctrun::health::MainThreadWait::kUnknown);
  return 0;
}
