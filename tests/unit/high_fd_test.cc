// sys/high_fd.h: descriptors re-homed above the line keep their file and are CLOEXEC; what cannot
// or need not move stays.
#include "sys/high_fd.h"

#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

namespace ctrun {
namespace {

TEST(HighFd, MoveHighKeepsTheFileClosesTheOldNumberAndSetsCloexec) {
  if (!ReserveHighFds()) GTEST_SKIP() << "no room above fd " << kHighFdLine << " or no close_range here";
  EXPECT_TRUE(HighFdsReserved());
  int p[2];
  ASSERT_EQ(::pipe(p), 0);  // not CLOEXEC
  UniqueFd read_end(p[0]), write_end(p[1]);
  const int old = read_end.get();
  MoveHigh(&read_end);
  ASSERT_GE(read_end.get(), kHighFdLine);
  EXPECT_EQ(::fcntl(read_end.get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  errno = 0;
  EXPECT_EQ(::fcntl(old, F_GETFD), -1);
  EXPECT_EQ(errno, EBADF);
  ASSERT_EQ(::write(write_end.get(), "x", 1), 1);
  char c = 0;
  ASSERT_EQ(::read(read_end.get(), &c, 1), 1);
  EXPECT_EQ(c, 'x');

  const int high = read_end.get();
  MoveHigh(&read_end);  // already above the line: stays
  EXPECT_EQ(read_end.get(), high);
  UniqueFd none;
  MoveHigh(&none);
  EXPECT_FALSE(none.valid());
  EXPECT_EQ(MoveHigh(-1), -1);
  EXPECT_TRUE(ReserveHighFds());  // idempotent
}

}  // namespace
}  // namespace ctrun
