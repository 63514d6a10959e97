// libFuzzer target for the command line parser (src/cli/cli.cc): argv and the environment are
// untrusted input. The input is split at '\n' into lines: lines "ENV:NAME=VALUE" go to the
// environment lookup (PET_* fallbacks and the others the CLI reads), every other line is one argv
// entry. Checked properties (a violation traps):
//  - parsing never crashes, throws, leaks or reads out of bounds (ASan/UBSan);
//  - an exit outcome is 0 (help, version) or 2 (usage error), and a usage error is exactly one line
//    "ctrun: error: ...\n" on stderr with nothing on stdout;
//  - a run outcome has a valid configuration (at least one worker, MIN <= MAX nodes, a non-empty
//    entrypoint, no negative restart count).
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cli/cli.h"

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> argv{"ctrun"};
  std::map<std::string, std::string> env;
  size_t pos = 0;
  while (pos <= in.size() && argv.size() < 64) {
    size_t end = in.find('\n', pos);
    if (end == std::string::npos) end = in.size();
    std::string line = in.substr(pos, end - pos);
    if (line.rfind("ENV:", 0) == 0 && line.find('=') != std::string::npos) {
      env[line.substr(4, line.find('=') - 4)] = line.substr(line.find('=') + 1);
    } else if (!(end == in.size() && line.empty())) {
      argv.push_back(line);
    }
    pos = end + 1;
  }
  const ctrun::EnvLookup lookup = [&](const std::string& k) -> std::optional<std::string> {
    auto it = env.find(k);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  ctrun::CliOutcome out = ctrun::ParseCommandLine(argv, lookup);
  if (argv.size() == 1) {  // a bare "ctrun": the usage lines, exit 2 (not an error line)
    Check(out.action == ctrun::CliOutcome::Action::kExit && out.exit_code == 2);
    Check(out.error.rfind("Usage: ctrun", 0) == 0);
    return 0;
  }
  if (out.action == ctrun::CliOutcome::Action::kExit) {
    Check(out.exit_code == 0 || out.exit_code == 2);
    if (out.exit_code == 2) {
      Check(out.output.empty());
      Check(out.error.rfind("ctrun: error: ", 0) == 0);
      Check(!out.error.empty() && out.error.back() == '\n');
      Check(out.error.find('\n') == out.error.size() - 1);
    }
  } else {
    const ctrun::LaunchConfig& c = out.config;
    Check(c.min_nodes >= 1 && c.min_nodes <= c.max_nodes);
    Check(c.max_restarts >= 0);
    Check(!c.entrypoint.empty() || c.module);
    Check(c.nproc.kind != ctrun::NprocSpec::Kind::kCount || c.nproc.count >= 1);
  }
  return 0;
}
