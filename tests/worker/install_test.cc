// The worker library installs (component "worker") and a downstream CMake project builds against
// it with find_package(ctrun) and runs.
#include <gtest/gtest.h>

#include "helpers/test_util.h"

namespace ctrun::worker {
namespace {

using ctrun::testing::RunCommand;
using ctrun::testing::TempDir;
using namespace std::chrono_literals;

TEST(Install, FindPackageCtrunWorksForAConsumer) {
  TempDir dir;
  const std::string prefix = dir / "prefix";
  auto inst = RunCommand({CMAKE_COMMAND_PATH, "--install", CTRUN_BUILD_DIR, "--component", "worker", "--prefix", prefix},
                  {}, 60s);
  ASSERT_EQ(inst.exit_code, 0) << inst.out << inst.err;
  auto conf = RunCommand({CMAKE_COMMAND_PATH, "-S", std::string(CTRUN_SOURCE_DIR) + "/tests/worker/consumer", "-B",
                   dir / "build", "-DCMAKE_PREFIX_PATH=" + prefix, "-DCMAKE_BUILD_TYPE=Release",
                   "-DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON"},
                  {}, 90s);
  ASSERT_EQ(conf.exit_code, 0) << conf.out << conf.err;
  auto build = RunCommand({CMAKE_COMMAND_PATH, "--build", dir / "build"}, {}, 120s);
  ASSERT_EQ(build.exit_code, 0) << build.out << build.err;
  auto run = RunCommand({dir / "build/consumer", dir / "snaps"}, {}, 30s);
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_NE(run.out.find("consumer ok"), std::string::npos) << run.out;
}

}  // namespace
}  // namespace ctrun::worker
