#include "health/native_stack.h"

#include <string>

namespace ctrun::health {
namespace {

bool StartsThreadBlock(std::string_view line) {
  return line.rfind("Thread ", 0) == 0 || line.rfind("TID ", 0) == 0;
}

bool IsMainThreadHeader(std::string_view line, pid_t pid) {
  const std::string id = std::to_string(pid);
  if (line == "TID " + id + ":") return true;
  // gdb: "(LWP N)" for a threaded inferior, "(process N)" where it found no thread library.
  return line.rfind("Thread ", 0) == 0 && (line.find("(LWP " + id + ")") != std::string_view::npos ||
                                           line.find("(process " + id + ")") != std::string_view::npos);
}

}  // namespace

MainThreadWait ClassifyMainThread(std::string_view text, pid_t pid) {
  bool in_main = false;
  int frames = 0;
  bool collective = false;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = text.find('\n', pos);
    std::string_view line = text.substr(pos, end == std::string_view::npos ? std::string_view::npos : end - pos);
    pos = end == std::string_view::npos ? text.size() : end + 1;
    if (StartsThreadBlock(line)) {
      if (in_main) break;  // the main thread's block ended
      in_main = IsMainThreadHeader(line, pid);
      continue;
    }
    if (!in_main || line.rfind("#", 0) != 0) continue;
    ++frames;
    for (std::string_view marker : {"c10d::", "gloo::", "nccl"})
      collective = collective || line.find(marker) != std::string_view::npos;
  }
  if (frames == 0) return MainThreadWait::kUnknown;
  return collective ? MainThreadWait::kInCollective : MainThreadWait::kElsewhere;
}

}  // namespace ctrun::health
