// The watchdog's group set: no limit on how many groups it covers (it once stopped at 4096).
#include <vector>

#include <gtest/gtest.h>

#include "process/watchdog.h"

namespace ctrun {
namespace {

TEST(PgidSet, HoldsEveryPossibleGroupWithoutALimit) {
  static PgidSet set;  // 512 KiB: not on the stack
  std::vector<pid_t> want;
  for (pid_t p = 1; p <= 10000; ++p) want.push_back(p);
  want.push_back(static_cast<pid_t>(PgidSet::kPidLimit - 1));
  for (pid_t p : want) set.Add(p);
  set.Add(0);                                           // not a group
  set.Add(-5);                                          // not a group
  set.Add(static_cast<pid_t>(PgidSet::kPidLimit));      // beyond any pid
  std::vector<pid_t> got;
  set.ForEach([&](pid_t p) { got.push_back(p); });
  EXPECT_EQ(got, want);

  for (pid_t p = 2; p <= 10000; p += 2) set.Remove(p);
  set.Remove(static_cast<pid_t>(PgidSet::kPidLimit - 1));
  set.Add(1);  // twice: still once
  got.clear();
  set.ForEach([&](pid_t p) { got.push_back(p); });
  ASSERT_EQ(got.size(), 5000u);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], static_cast<pid_t>(2 * i + 1));
}

}  // namespace
}  // namespace ctrun
