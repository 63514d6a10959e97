// RepeatedSignalFilter: one process's back-to-back copies of a signal are one event; the kernel's
// (a terminal's ^C) never are.
#include <signal.h>

#include <gtest/gtest.h>

#include "sys/signals.h"

namespace ctrun {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

TEST(RepeatedSignalFilter, OneSendersSecondCopyWithinTheWindowIsTheSameEvent) {
  RepeatedSignalFilter f(1s);
  const Clock::time_point t0{};
  const ReadSignal from_timeout{SIGTERM, true, 4242};
  EXPECT_FALSE(f.IsRepeat(from_timeout, t0));
  EXPECT_TRUE(f.IsRepeat(from_timeout, t0 + 1ms)) << "timeout(1): its child, then its own group";
  EXPECT_FALSE(f.IsRepeat(from_timeout, t0 + 1500ms)) << "a second later it is a second request";
  EXPECT_FALSE(f.IsRepeat({SIGTERM, true, 777}, t0 + 1501ms)) << "another sender";
  EXPECT_FALSE(f.IsRepeat({SIGINT, true, 777}, t0 + 1502ms)) << "another signal";
}

TEST(RepeatedSignalFilter, SignalsFromTheKernelAreNeverMerged) {
  RepeatedSignalFilter f(1s);
  const Clock::time_point t0{};
  const ReadSignal ctrl_c{SIGINT, false, 0};
  EXPECT_FALSE(f.IsRepeat(ctrl_c, t0));
  EXPECT_FALSE(f.IsRepeat(ctrl_c, t0 + 10ms)) << "two presses of ^C are two";
}

// A ^C at a terminal reaches ctrun from the kernel and a wrapping `timeout` (ctrun's parent),
// which forwards it: one press. Or a scheduler signals the job step and the wrapping shell's trap
// forwards it too. A second press still is a second request.
TEST(RepeatedSignalFilter, ACopyForwardedByTheParentIsTheSameEvent) {
  constexpr pid_t kParent = 100;
  RepeatedSignalFilter f(1s, kParent);
  const Clock::time_point t0{};
  const ReadSignal ctrl_c{SIGINT, false, 0}, forwarded{SIGINT, true, kParent};
  EXPECT_FALSE(f.IsRepeat(ctrl_c, t0));
  EXPECT_TRUE(f.IsRepeat(forwarded, t0 + 2ms)) << "timeout forwarding the same ^C";
  EXPECT_FALSE(f.IsRepeat(ctrl_c, t0 + 300ms)) << "a second press";
  EXPECT_TRUE(f.IsRepeat(forwarded, t0 + 302ms));
  EXPECT_FALSE(f.IsRepeat(forwarded, t0 + 2s)) << "a second later it is a second request";
  EXPECT_TRUE(f.IsRepeat({SIGINT, true, 555}, t0 + 2001ms)) << "the other copy after the parent's";
  EXPECT_TRUE(f.IsRepeat({SIGTERM, true, kParent}, t0 + 2002ms)) << "a wrapper that turns ^C into SIGTERM";
  EXPECT_FALSE(f.IsRepeat({SIGTERM, true, 555}, t0 + 3500ms)) << "a second later";
  EXPECT_FALSE(f.IsRepeat({SIGINT, true, 555}, t0 + 3501ms)) << "another signal, neither from the parent";
  RepeatedSignalFilter unknown(1s, 0);
  EXPECT_FALSE(unknown.IsRepeat({SIGINT, true, 0}, t0));
  EXPECT_FALSE(unknown.IsRepeat(ctrl_c, t0 + 1ms));
}

}  // namespace
}  // namespace ctrun
