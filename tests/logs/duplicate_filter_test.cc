#include "logs/duplicate_filter.h"

#include <fcntl.h>
#include <gtest/gtest.h>

#include "helpers/test_util.h"
#include "logs/output_plan.h"

namespace ctrun::logs {
namespace {

using ctrun::testing::ReadFileOr;
using ctrun::testing::TempDir;

std::shared_ptr<DuplicateFile> Open(const std::string& path, std::vector<std::string> filters) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  return std::make_shared<DuplicateFile>(std::move(fd), std::move(filters), path);
}

// What one stream fed with `reads` (then ended) leaves in a filtered file.
std::string Filtered(std::vector<std::string> filters, const std::vector<std::string>& reads,
                     const std::string& prefix = "", size_t max_line = 1024) {
  TempDir d;
  DuplicateTap tap(Open(d / "filtered", std::move(filters)), prefix, max_line);
  for (const auto& r : reads) tap.Feed(r);
  tap.Finish();
  return ReadFileOr(d / "filtered");
}

TEST(DuplicateFilter, CopiesMatchingWholeLinesWithThePrefix) {
  // "acc" split across reads
  EXPECT_EQ(Filtered({"loss", "acc"}, {"step 1 loss=3\nstep 1 lr=0.1\nstep 2 ac", "c=0.5\nnothing\n"}, "[r0] "),
            "[r0] step 1 loss=3\n[r0] step 2 acc=0.5\n");
}

TEST(DuplicateFilter, RanksShareOneFileLineByLine) {
  TempDir d;
  auto f = Open(d / "filtered", {"x"});
  DuplicateTap a(f, "[r0] ", 1024), b(f, "[r1] ", 1024);
  a.Feed("x from 0, part");
  b.Feed("x from 1\n");
  a.Feed(" two\n");
  a.Finish();
  b.Finish();
  EXPECT_EQ(ReadFileOr(d / "filtered"), "[r1] x from 1\n[r0] x from 0, part two\n");
}

TEST(DuplicateFilter, CarriageReturnEndsALineAndThePartialLastLineCountsAtTheEnd) {
  EXPECT_EQ(Filtered({"it/s"}, {"\r 10% 5it/s\r 20% 6it/s\r\nCUDA error it/s"}),
            " 10% 5it/s\n 20% 6it/s\nCUDA error it/s\n");
}

TEST(DuplicateFilter, LongPartialLinesAreTestedInPieces) {
  EXPECT_EQ(Filtered({"needle"}, {"aaaaaaaaneedle"}, "", 8), "needle\n");  // 8 'a', then the needle
}

TEST(DuplicateFilter, CommaEscapedFilterMatchesLiterally) {
  EXPECT_EQ(Filtered({"a,b"}, {"a,b\na b\n"}), "a,b\n");
}

TEST(DuplicateFilter, OpenDuplicateFilesOnlyForStreamsWithFilters) {
  TempDir d;
  OutputFlags flags;
  flags.duplicate_stderr = {"warn"};
  AttemptPaths paths;
  paths.dir = d.path();
  paths.filtered_stdout = d / "filtered_stdout.log";
  paths.filtered_stderr = d / "filtered_stderr.log";
  auto files = OpenDuplicateFiles(flags, paths);
  ASSERT_TRUE(files.ok()) << files.message();
  EXPECT_EQ(files->out, nullptr);
  ASSERT_NE(files->err, nullptr);
  EXPECT_TRUE(::access((d / "filtered_stderr.log").c_str(), F_OK) == 0);
  EXPECT_FALSE(::access((d / "filtered_stdout.log").c_str(), F_OK) == 0);
  paths.dir = kDevNull;  // files off
  auto none = OpenDuplicateFiles(flags, paths);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->err, nullptr);
}

}  // namespace
}  // namespace ctrun::logs
