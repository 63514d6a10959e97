// The downstream-project check shared by the worker library's install test and the ctrun-dev
// package test: tests/worker/consumer (find_package(ctrun), ctrun::worker) configured against an
// installed prefix, built and run. Needs CMAKE_COMMAND_PATH and CTRUN_SOURCE_DIR defined.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "helpers/test_util.h"

namespace ctrun::testing {

// Builds the consumer in `dir`/build against `prefix` (LibTorch left out) and runs it with `dir`/snaps;
// each step is a gtest assertion, so the caller's test fails at the first that does. In a sanitizer
// build the installed static library is instrumented, so the consumer is built the same way.
inline void BuildAndRunConsumer(const std::string& prefix, const TempDir& dir) {
  using namespace std::chrono_literals;
  std::vector<std::string> conf_cmd{CMAKE_COMMAND_PATH, "-S", std::string(CTRUN_SOURCE_DIR) + "/tests/worker/consumer",
                                    "-B", dir / "build", "-DCMAKE_PREFIX_PATH=" + prefix, "-DCMAKE_BUILD_TYPE=Release",
                                    "-DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON"};
#if defined(__SANITIZE_ADDRESS__)
  conf_cmd.push_back("-DCMAKE_CXX_FLAGS=-fsanitize=address,undefined");
  conf_cmd.push_back("-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address,undefined");
#endif
  auto conf = RunCommand(conf_cmd, {}, 120s);
  ASSERT_EQ(conf.exit_code, 0) << conf.out << conf.err;
  auto build = RunCommand({CMAKE_COMMAND_PATH, "--build", dir / "build"}, {}, 180s);
  ASSERT_EQ(build.exit_code, 0) << build.out << build.err;
  auto run = RunCommand({dir / "build/consumer", dir / "snaps"}, {}, 30s);
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("consumer ok"), std::string::npos) << run.out;
}

}  // namespace ctrun::testing
