// GitHub Actions workflow commands: under Actions (GITHUB_ACTIONS=true in ctrun's environment) the
// root cause of a failed run is also printed to stdout as
//   ::error title=<title>::<message>
// which the runner turns into an annotation on the job and the pull request. Escaping follows the
// runner's rules: in the message '%', '\r', '\n' become %25, %0D, %0A; in a property (the title)
// also ':' and ',' become %3A and %2C. Nothing else is changed.
#pragma once

#include <string>
#include <string_view>

#include "base/environment.h"

namespace ctrun {

std::string EscapeAnnotationData(std::string_view text);
std::string EscapeAnnotationProperty(std::string_view text);
// One line, '\n' included.
std::string GithubErrorAnnotation(std::string_view title, std::string_view message);
// GITHUB_ACTIONS is exactly "true", as the runner sets it.
bool UnderGithubActions(const Environment& env);

}  // namespace ctrun
