#include "base/py_template.h"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

namespace ctrun {
namespace {

std::optional<std::string> LocalRankIs2(std::string_view name) {
  if (name == "local_rank") return "2";
  return std::nullopt;
}

// Every expected value is what Python 3.11's string.Template(text).safe_substitute(local_rank="2")
// returns (checked with /usr/bin/python3): torchrun renders worker arguments that way.
TEST(PyTemplate, SafeSubstituteMatchesPython) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--local_rank=${local_rank}", "--local_rank=2"},
      {"--local_rank=$local_rank", "--local_rank=2"},
      {"a$$b", "a$b"},
      {"$$", "$"},
      {"$${local_rank}", "${local_rank}"},
      {"$$${local_rank}", "$2"},
      {"$$$local_rank", "$2"},
      {"${local_rank}${local_rank}", "22"},
      {"$local_rankX", "$local_rankX"},  // the longest name, unknown: as written
      {"$LOCAL_RANK", "$LOCAL_RANK"},    // names are case-sensitive
      {"${local_rank", "${local_rank"},
      {"${ local_rank}", "${ local_rank}"},
      {"trainer.world=${world_size}", "trainer.world=${world_size}"},
      {"$1", "$1"},
      {"$", "$"},
      {"x$", "x$"},
      {"100%$ done", "100%$ done"},
      {"no placeholder", "no placeholder"},
      {"", ""},
  };
  for (const auto& [text, want] : cases) EXPECT_EQ(SafeSubstitute(text, LocalRankIs2), want) << text;
}

TEST(PyTemplate, SubstituteNamesTheFirstBadPlaceholder) {
  EXPECT_EQ(*Substitute("[${local_rank}] $$", LocalRankIs2), "[2] $");
  auto unknown = Substitute("a ${rank} b", LocalRankIs2);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.message(), "unknown placeholder '$rank'");
  for (const char* bad : {"${local_rank", "$ x", "$", "cost: $1"}) {
    auto r = Substitute(bad, LocalRankIs2);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.message().find("invalid placeholder at '$"), std::string::npos) << r.message();
  }
}

TEST(PyTemplate, AValueIsNeverExpandedAgain) {
  auto lookup = [](std::string_view name) -> std::optional<std::string> {
    if (name == "a") return "${b}";
    if (name == "b") return "B";
    return std::nullopt;
  };
  EXPECT_EQ(SafeSubstitute("$a ${b}", lookup), "${b} B");
}

}  // namespace
}  // namespace ctrun
