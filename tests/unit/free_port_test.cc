// sys/free_port: ports drawn below the ephemeral range, distinct, free, away from torchrun's
// defaults; the range read from its /proc file.
#include "sys/free_port.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "helpers/test_util.h"

namespace ctrun {
namespace {

TEST(FreePort, PortsAreDistinctFreeBelowTheEphemeralRangeAndAwayFromTorchrunsDefaults) {
  const int ephemeral = EphemeralPortsStart();
  const std::vector<int> ports = FindFreePorts(16);
  ASSERT_EQ(ports.size(), 16u);
  EXPECT_EQ(std::set<int>(ports.begin(), ports.end()).size(), ports.size());
  for (int p : ports) {
    EXPECT_GE(p, 10000);
    if (ephemeral > 20000) {
      EXPECT_LT(p, ephemeral) << "a port an outgoing connection could take";
    }
    EXPECT_FALSE(p >= 29000 && p < 30000) << p;
    int bound = 0;
    EXPECT_TRUE(BindLoopback(p, &bound)) << p;
    EXPECT_EQ(bound, p);
  }
}

TEST(FreePort, TheEphemeralRangeIsReadFromItsFileWithTheKernelDefaultWhenUnreadable) {
  testing::TempDir dir;
  std::ofstream(dir / "range") << "40000\t60999\n";
  EXPECT_EQ(EphemeralPortsStart(dir / "range"), 40000);
  EXPECT_EQ(EphemeralPortsStart(dir / "missing"), 32768);
  std::ofstream(dir / "junk") << "x y\n";
  EXPECT_EQ(EphemeralPortsStart(dir / "junk"), 32768);
}

}  // namespace
}  // namespace ctrun
