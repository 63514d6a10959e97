// argv for "ctrun --standalone --nproc_per_node=N --max_restarts=R <flags> <cmd...>", shared by the
// --warm e2e tests (needs CTRUN_BINARY from tests/CMakeLists.txt).
#pragma once

#include <string>
#include <vector>

namespace ctrun::testing {

inline std::vector<std::string> StandaloneCtrun(int nproc, int max_restarts, const std::vector<std::string>& flags,
                                                const std::vector<std::string>& cmd) {
  std::vector<std::string> argv{CTRUN_BINARY, "--standalone", "--nproc_per_node=" + std::to_string(nproc),
                                "--max_restarts=" + std::to_string(max_restarts)};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.insert(argv.end(), cmd.begin(), cmd.end());
  return argv;
}

// The log line of a C++ warm server that started (CTRUN_MAIN).
inline bool StartedNativeWarm(const std::string& ctrun_stderr) {
  return ctrun_stderr.find("CTRUN_MAIN) loaded in") != std::string::npos;
}

}  // namespace ctrun::testing
