// The worker library installs (component "worker") and a downstream CMake project builds against
// it with find_package(ctrun) and runs.
#include <gtest/gtest.h>

#include "helpers/consumer_project.h"
#include "helpers/test_util.h"

namespace ctrun::worker {
namespace {

using ctrun::testing::BuildAndRunConsumer;
using ctrun::testing::RunCommand;
using ctrun::testing::TempDir;
using namespace std::chrono_literals;

TEST(Install, FindPackageCtrunWorksForAConsumer) {
  TempDir dir;
  const std::string prefix = dir / "prefix";
  auto inst = RunCommand({CMAKE_COMMAND_PATH, "--install", CTRUN_BUILD_DIR, "--component", "worker", "--prefix", prefix},
                  {}, 60s);
  ASSERT_EQ(inst.exit_code, 0) << inst.out << inst.err;
  BuildAndRunConsumer(prefix, dir);
}

}  // namespace
}  // namespace ctrun::worker
