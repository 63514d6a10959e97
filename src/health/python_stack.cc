#include "health/python_stack.h"

namespace ctrun::health {

std::string InnermostFrame(std::string_view text) {
  const size_t block = text.rfind("Current thread 0x");
  if (block == std::string_view::npos) return "";
  size_t line = text.find('\n', block);
  while (line != std::string_view::npos) {
    const size_t begin = line + 1;
    const size_t end = text.find('\n', begin);
    std::string_view l = text.substr(begin, end == std::string_view::npos ? std::string_view::npos : end - begin);
    const size_t first = l.find_first_not_of(' ');
    if (first != std::string_view::npos && l.substr(first).rfind("File \"", 0) == 0) return std::string(l.substr(first));
    if (first == 0 || first == std::string_view::npos) return "";  // the block ended without a frame
    line = end;
  }
  return "";
}

bool WaitsInACollective(std::string_view text) {
  const std::string frame = InnermostFrame(text);
  return frame.find("/torch/distributed/") != std::string::npos;
}

}  // namespace ctrun::health
