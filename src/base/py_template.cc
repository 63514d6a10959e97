#include "base/py_template.h"

namespace ctrun {
namespace {

bool IsIdentStart(char c) { return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsIdentChar(char c) { return IsIdentStart(c) || (c >= '0' && c <= '9'); }

// One '$' at text[at]: its placeholder's name (empty for "$$" and for an invalid '$') and the
// length of what it spans ("$$" 2, an invalid '$' 1).
struct Placeholder {
  std::string_view name;
  size_t length = 1;
  bool escaped = false;
};

Placeholder Parse(std::string_view text, size_t at) {
  Placeholder p;
  const size_t i = at + 1;
  if (i < text.size() && text[i] == '$') {
    p.escaped = true;
    p.length = 2;
  } else if (i < text.size() && IsIdentStart(text[i])) {
    size_t end = i + 1;
    while (end < text.size() && IsIdentChar(text[end])) ++end;
    p.name = text.substr(i, end - i);
    p.length = end - at;
  } else if (i < text.size() && text[i] == '{' && i + 1 < text.size() && IsIdentStart(text[i + 1])) {
    size_t end = i + 2;
    while (end < text.size() && IsIdentChar(text[end])) ++end;
    if (end < text.size() && text[end] == '}') {
      p.name = text.substr(i + 1, end - i - 1);
      p.length = end + 1 - at;
    }
  }
  return p;
}

// The one walk behind both: `strict` makes the first unknown name or invalid '$' an error.
StatusOr<std::string> Walk(std::string_view text, const TemplateLookup& lookup, bool strict) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const size_t dollar = text.find('$', i);
    if (dollar == std::string_view::npos) break;
    out.append(text, i, dollar - i);
    const Placeholder p = Parse(text, dollar);
    if (p.escaped) {
      out.push_back('$');
    } else if (p.name.empty()) {
      if (strict) return Status::Error("invalid placeholder at '" + std::string(text.substr(dollar)) + "'");
      out.push_back('$');
    } else if (std::optional<std::string> value = lookup(p.name)) {
      out += *value;
    } else {
      if (strict) return Status::Error("unknown placeholder '$" + std::string(p.name) + "'");
      out.append(text, dollar, p.length);
    }
    i = dollar + p.length;
  }
  out.append(text, i, std::string_view::npos);
  return out;
}

}  // namespace

std::string SafeSubstitute(std::string_view text, const TemplateLookup& lookup) {
  return std::move(Walk(text, lookup, /*strict=*/false).value());
}

StatusOr<std::string> Substitute(std::string_view text, const TemplateLookup& lookup) {
  return Walk(text, lookup, /*strict=*/true);
}

}  // namespace ctrun
