// Helpers of the installation tests (tests/install): finding the Debian tools they need (a missing
// one skips the test with the package to install), and running an installed ctrun with the source
// and build directories hidden, to prove it never looks back into them.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "helpers/test_util.h"

namespace ctrun::testing {

// The full path of `tool` on PATH, or "" when it is not there.
std::string FindTool(const std::string& tool);

// Skips the current test with "<tool> not found: install the Debian package <package> (listed in
// scripts/debian-packages.txt)" when `tool` is missing; else sets `path` to it.
#define CTRUN_REQUIRE_TOOL(path, tool, package)                                                      \
  std::string path = ::ctrun::testing::FindTool(tool);                                              \
  if (path.empty())                                                                                 \
  GTEST_SKIP() << tool << " not found: install the Debian package " << package                     \
               << " (listed in scripts/debian-packages.txt)"

// Runs `sh -c script` (no PATH lookup: /bin/sh). With `hide_trees`, in a private mount namespace
// with empty tmpfs over CTRUN_SOURCE_DIR and CTRUN_BUILD_DIR when the system allows it (unshare -m,
// root); `*hidden` says whether they were hidden.
RunResult RunShell(const std::string& script, bool hide_trees, bool* hidden = nullptr,
                   std::chrono::milliseconds timeout = std::chrono::seconds(60));

// Single-quoted for sh.
std::string ShellQuote(const std::string& s);

// Every regular file and symlink under `root`, as paths relative to it, sorted; none when `root` is
// missing.
std::vector<std::string> ListTree(const std::string& root);

}  // namespace ctrun::testing
