#include "base/shebang.h"

#include <vector>

namespace ctrun {
namespace {

constexpr std::string_view kBlanks = " \t";

std::vector<std::string> Words(std::string_view s) {
  std::vector<std::string> out;
  size_t i = 0;
  while ((i = s.find_first_not_of(kBlanks, i)) != std::string_view::npos) {
    const size_t end = s.find_first_of(kBlanks, i);
    out.emplace_back(s.substr(i, end == std::string_view::npos ? std::string_view::npos : end - i));
    i = end;
  }
  return out;
}

std::string_view Basename(std::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

}  // namespace

std::optional<Shebang> ParseShebang(std::string_view head) {
  if (head.substr(0, 2) != "#!") return std::nullopt;
  std::string_view line = head.substr(2, head.find('\n') == std::string_view::npos ? std::string_view::npos
                                                                                   : head.find('\n') - 2);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  const size_t begin = line.find_first_not_of(kBlanks);
  if (begin == std::string_view::npos) return std::nullopt;
  const size_t end = line.find_first_of(kBlanks, begin);
  Shebang s;
  s.interpreter = std::string(line.substr(begin, end == std::string_view::npos ? std::string_view::npos : end - begin));
  if (end != std::string_view::npos) {
    std::string_view rest = line.substr(end);
    const size_t a = rest.find_first_not_of(kBlanks);
    const size_t b = rest.find_last_not_of(kBlanks);
    if (a != std::string_view::npos) s.arg = std::string(rest.substr(a, b - a + 1));
  }
  return s;
}

std::string ShebangProgram(const Shebang& s) {
  if (Basename(s.interpreter) != "env") return s.interpreter;
  for (const std::string& w : Words(s.arg)) {
    if (w.empty() || w[0] == '-' || w.find('=') != std::string::npos) continue;  // options, assignments
    return w;
  }
  return s.interpreter;
}

bool IsPythonProgram(std::string_view path) {
  const size_t slash = path.rfind('/');
  const std::string_view base = slash == std::string_view::npos ? path : path.substr(slash + 1);
  return base.substr(0, 6) == "python" && base.find_first_not_of("0123456789.", 6) == std::string_view::npos;
}

}  // namespace ctrun
