#include "process/exit_status.h"

#include <sys/wait.h>

#include <gtest/gtest.h>

#include <csignal>

namespace ctrun {
namespace {

TEST(ExitStatus, ExitedCodes) {
  auto s = ExitStatus::Exited(3);
  EXPECT_TRUE(s.exited());
  EXPECT_FALSE(s.success());
  EXPECT_EQ(s.ShellCode(), 3);
  EXPECT_EQ(s.TorchCode(), 3);
  EXPECT_EQ(s.ToString(), "exited with code 3");
  EXPECT_TRUE(ExitStatus::Exited(0).success());
}

TEST(ExitStatus, SignaledCodesAndNames) {
  auto s = ExitStatus::Signaled(SIGKILL);
  EXPECT_TRUE(s.signaled());
  EXPECT_EQ(s.ShellCode(), 137);
  EXPECT_EQ(s.TorchCode(), -9);
  EXPECT_EQ(s.ToString(), "killed by signal 9 (SIGKILL)");
  EXPECT_EQ(ExitStatus::Signaled(SIGSEGV, true).ToString(), "killed by signal 11 (SIGSEGV) (core dumped)");
}

TEST(ExitStatus, FromWaitStatus) {
  EXPECT_EQ(ExitStatus::FromWaitStatus(7 << 8), ExitStatus::Exited(7));
  EXPECT_EQ(ExitStatus::FromWaitStatus(SIGTERM), ExitStatus::Signaled(SIGTERM));
  EXPECT_EQ(ExitStatus::FromWaitStatus(SIGABRT | 0x80), ExitStatus::Signaled(SIGABRT, true));
}

TEST(SignalNames, RoundTrip) {
  for (int s : {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, SIGKILL, SIGSEGV, SIGBUS, SIGPIPE}) {
    EXPECT_EQ(SignalFromName(SignalName(s)), s) << s;
  }
  EXPECT_EQ(SignalFromName("term"), SIGTERM);
  EXPECT_EQ(SignalFromName("15"), SIGTERM);
  EXPECT_EQ(SignalFromName("SIGNOPE"), 0);
  EXPECT_EQ(SignalFromName("0"), 0);
  EXPECT_EQ(SignalFromName("999"), 0);
  EXPECT_EQ(SignalName(SIGRTMIN + 2), "SIGRTMIN+2");
}

}  // namespace
}  // namespace ctrun
