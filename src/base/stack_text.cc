#include "base/stack_text.h"

#include <algorithm>
#include <cctype>
#include <charconv>

namespace ctrun {
namespace {

bool IsFrame(std::string_view line) {
  return line.size() > 1 && line[0] == '#' && std::isdigit(static_cast<unsigned char>(line[1]));
}

// The positive number right after `marker` in `s` when digits follow it and `close` ends them; 0
// otherwise (a sign, an overflow, no number).
pid_t NumberAfter(std::string_view s, std::string_view marker, char close, size_t* end = nullptr) {
  for (size_t at = s.find(marker); at != std::string_view::npos; at = s.find(marker, at + 1)) {
    const char* first = s.data() + at + marker.size();
    const char* last = s.data() + s.size();
    if (first == last || !std::isdigit(static_cast<unsigned char>(*first))) continue;  // no sign
    pid_t n = 0;
    auto [p, ec] = std::from_chars(first, last, n);
    if (ec != std::errc() || p == last || *p != close || n == 0) continue;
    if (end) *end = static_cast<size_t>(p - s.data()) + 1;
    return n;
  }
  return 0;
}

StackThread ReadHeader(std::string_view line) {
  StackThread t;
  t.header = line;
  if (line.starts_with("TID ")) {
    t.tid = NumberAfter(line, "TID ", ':');
    return t;
  }
  size_t end = 0;
  t.tid = NumberAfter(line, "(LWP ", ')', &end);
  if (t.tid == 0) t.tid = NumberAfter(line, "(process ", ')', &end);
  // gdb: `... (LWP 18575) "python3"):`
  if (t.tid != 0 && line.substr(end, 2) == " \"") {
    const size_t close = line.find('"', end + 2);
    if (close != std::string_view::npos) t.name = line.substr(end + 2, close - end - 2);
  }
  return t;
}

// `text` less what nests between `open` and `close` (template and argument lists).
std::string DropNested(std::string_view text, char open, char close) {
  std::string out;
  int depth = 0;
  for (char ch : text) {
    if (ch == open) ++depth;
    else if (ch == close && depth > 0) --depth;
    else if (depth == 0) out += ch;
  }
  return out;
}

}  // namespace

std::vector<StackThread> ReadStackThreads(std::string_view text) {
  std::vector<StackThread> threads;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    const std::string_view line = text.substr(pos, nl == std::string_view::npos ? std::string_view::npos : nl - pos);
    pos = nl == std::string_view::npos ? text.size() : nl + 1;
    if (line.starts_with("Thread ") || line.starts_with("TID ")) {
      threads.push_back(ReadHeader(line));
    } else if (IsFrame(line)) {
      if (threads.empty()) threads.emplace_back();
      threads.back().frames.push_back(line);
    }
  }
  return threads;
}

std::string FrameFunction(std::string_view line) {
  std::string_view rest = line.substr(std::min(line.size(), line.find(' ')));
  rest.remove_prefix(std::min(rest.size(), rest.find_first_not_of(' ')));
  if (rest.starts_with("0x")) {
    const size_t sp = rest.find(' ');
    rest = sp == std::string_view::npos ? std::string_view() : rest.substr(sp + 1);
    if (rest.starts_with("in ")) rest.remove_prefix(3);
  }
  std::string_view lib;
  if (const size_t from = rest.rfind(" from "); from != std::string_view::npos) {
    lib = rest.substr(from + 6);
    if (const size_t slash = lib.rfind('/'); slash != std::string_view::npos) lib.remove_prefix(slash + 1);
  }
  std::string name = DropNested(DropNested(rest.substr(0, rest.find(" (")), '<', '>'), '(', ')');
  if (name.empty()) name = "??";
  if (name == "??" && !lib.empty()) name += " (" + std::string(lib) + ")";
  return name;
}

}  // namespace ctrun
