// ctrun(1) renders without a warning: groff -ww on the generated page, and man -l (man-db, as a user
// reads it) on the page as installed, gzip-compressed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include "helpers/test_util.h"
#include "install/install_util.h"

namespace ctrun::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::string kPage = std::string(CTRUN_GENERATED_DIR) + "/man/ctrun.1";

TEST(ManPage, GroffRendersItWithoutWarnings) {
  CTRUN_REQUIRE_TOOL(groff, "groff", "groff-base");
  for (const char* device : {"-Tutf8", "-Tascii"}) {
    RunResult r = RunCommand({groff, "-ww", "-man", device, "-z", kPage});
    EXPECT_EQ(r.exit_code, 0) << device << r.err;
    EXPECT_EQ(r.err, "") << device;  // every warning, e.g. "can't break line", fails the test
  }
}

TEST(ManPage, ManShowsEverySection) {
  CTRUN_REQUIRE_TOOL(man, "man", "man-db");
  const std::string installed = access((kPage + ".gz").c_str(), R_OK) == 0 ? kPage + ".gz" : kPage;
  for (const char* locale : {"C.UTF-8", "C"}) {  // -Tutf8 and -Tascii
    RunResult r = RunCommand({man, "-l", installed}, {"MANROFFOPT=-ww", "MANWIDTH=80", "MANPAGER=cat", "PAGER=cat",
                                                     "LC_ALL=" + std::string(locale)});
    ASSERT_EQ(r.exit_code, 0) << locale << r.err;
    EXPECT_EQ(r.err, "") << locale;
    EXPECT_THAT(r.out, Not(HasSubstr("\b"))) << "formatting left in a pipe";
    std::string flat;  // lines joined, runs of blanks (justification) as one
    for (char c : r.out) {
      if (c == '\n') c = ' ';
      if (c != ' ' || flat.empty() || flat.back() != ' ') flat += c;
    }
    for (const char* s : {"NAME", "ctrun - elastic launcher", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "EXIT STATUS",
                          "ENVIRONMENT", "SIGNALS", "Nodes & rendezvous", "--nproc-per-node",
                          "static|c10d|etcd|etcd-v2", "PET_NPROC_PER_NODE", "TORCHELASTIC_RESTART_COUNT",
                          "usage error", "SIGUSR1", "torchrun"})
      EXPECT_THAT(flat, HasSubstr(s)) << locale;
  }
}

}  // namespace
}  // namespace ctrun::testing
