// ctrun(1), generated from the option table (src/cli, the one behind parsing and --help) and from
// the sections of README.md on exit codes, environment and signals, which README.md keeps as their
// one source. Pure function, no I/O; docgen_main.cc writes the page at build time.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "cli/cli.h"

namespace ctrun::docgen {

// A man page section whose text is a README section ("## Exit codes" -> EXIT STATUS).
struct ReadmeSection {
  std::string_view readme_title;
  std::string_view man_title;
};
inline constexpr std::array<ReadmeSection, 3> kReadmeSections = {{
    {"Exit codes", "EXIT STATUS"},
    {"Environment", "ENVIRONMENT"},
    {"Signals", "SIGNALS"},
}};

struct ManPageInput {
  std::string version;                  // "0.1.0"
  std::vector<OptionInfo> options;      // OptionTable()
  std::vector<std::string> paragraphs;  // HelpParagraphs(): the DESCRIPTION
  std::string readme;                   // the text of README.md
};

// The page in man(7) roff; an error names a README section that is missing.
StatusOr<std::string> ManPage(const ManPageInput& in);

}  // namespace ctrun::docgen
