#include "report/github_annotation.h"

namespace ctrun {
namespace {

std::string Escape(std::string_view text, bool property) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '%': out += "%25"; break;
      case '\r': out += "%0D"; break;
      case '\n': out += "%0A"; break;
      case ':': out += property ? "%3A" : ":"; break;
      case ',': out += property ? "%2C" : ","; break;
      default: out += c;
    }
  }
  return out;
}

}  // namespace

std::string EscapeAnnotationData(std::string_view text) { return Escape(text, false); }
std::string EscapeAnnotationProperty(std::string_view text) { return Escape(text, true); }

std::string GithubErrorAnnotation(std::string_view title, std::string_view message) {
  return "::error title=" + EscapeAnnotationProperty(title) + "::" + EscapeAnnotationData(message) + "\n";
}

bool UnderGithubActions(const Environment& env) {
  const std::string* v = env.Get("GITHUB_ACTIONS");
  return v && *v == "true";
}

}  // namespace ctrun
