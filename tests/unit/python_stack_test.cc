// Reading faulthandler's dump on a rank's stderr: the innermost frame of the dumped thread, and
// whether the rank waits inside torch.distributed.
#include "health/python_stack.h"

#include <gtest/gtest.h>

namespace ctrun::health {
namespace {

const char* kInAllReduce =
    "step 4\n"
    "Thread 0x00007f1bb0ff9640 (most recent call first):\n"
    "  File \"/usr/lib/python3.11/threading.py\", line 327 in wait\n"
    "\n"
    "Current thread 0x00007f1bc02bb040 (most recent call first):\n"
    "  File \"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py\", line 1541 in all_reduce\n"
    "  File \"/work/train.py\", line 20 in <module>\n";

const char* kSleeping =
    "Current thread 0x00007f0000000001 (most recent call first):\n"
    "  File \"/work/train.py\", line 18 in <module>\n";

TEST(PythonStack, TheInnermostFrameOfTheDumpedThread) {
  EXPECT_EQ(InnermostFrame(kInAllReduce),
            "File \"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py\", line 1541 in all_reduce");
  EXPECT_EQ(InnermostFrame(kSleeping), "File \"/work/train.py\", line 18 in <module>");
}

TEST(PythonStack, OnlyADumpInsideTorchDistributedWaitsInACollective) {
  EXPECT_TRUE(WaitsInACollective(kInAllReduce));
  EXPECT_FALSE(WaitsInACollective(kSleeping));
  EXPECT_FALSE(WaitsInACollective("Traceback (most recent call last):\n  File \"/x/torch/distributed/a.py\"\n"));
  EXPECT_FALSE(WaitsInACollective(""));
  EXPECT_FALSE(WaitsInACollective("Current thread 0x1 (most recent call first):\n<no Python frame>\n"));
  // Two dumps (a second capture): the last one counts.
  EXPECT_FALSE(WaitsInACollective(std::string(kInAllReduce) + kSleeping));
}

}  // namespace
}  // namespace ctrun::health
