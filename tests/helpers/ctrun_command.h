// argv for "ctrun <flags> ctrun_fake_worker <worker args>", shared by the e2e tests (needs the
// CTRUN_BINARY and FAKE_WORKER definitions that tests/CMakeLists.txt gives test targets).
#pragma once

#include <string>
#include <vector>

namespace ctrun::testing {

inline std::vector<std::string> Ctrun(const std::vector<std::string>& flags,
                                      const std::vector<std::string>& worker_args) {
  std::vector<std::string> argv{CTRUN_BINARY};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back(FAKE_WORKER);
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  return argv;
}

}  // namespace ctrun::testing
