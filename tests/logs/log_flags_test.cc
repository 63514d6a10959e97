#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "logs/logging.h"
#include "logs/prefix.h"
#include "logs/std_spec.h"

namespace ctrun::logs {
namespace {

TEST(StdSpec, SingleValues) {
  for (int v = 0; v <= 3; ++v) {
    auto s = StdSpec::Parse(std::to_string(v));
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(s->ForRank(0), static_cast<Std>(v));
    EXPECT_EQ(s->ForRank(123), static_cast<Std>(v));
  }
}

TEST(StdSpec, PerRankMapsWithMultiDigitRanks) {
  auto s = StdSpec::Parse("0:3,1:0,12:1, 7 : 2");
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(s->ForRank(0), Std::kAll);
  EXPECT_EQ(s->ForRank(1), Std::kNone);
  EXPECT_EQ(s->ForRank(12), Std::kOut);
  EXPECT_EQ(s->ForRank(7), Std::kErr);
  EXPECT_EQ(s->ForRank(2), Std::kNone);  // missing ranks: none, like torchrun
  EXPECT_TRUE(s->AnySet());
  EXPECT_FALSE(StdSpec::Parse("0")->AnySet());
  EXPECT_FALSE(StdSpec::Parse("0:0,1:0")->AnySet());
}

TEST(StdSpec, BadSpecsNameTheFlag) {
  for (const char* bad : {"", "4", "a", "0:4", "0:3,", ",0:3", "0:3,,1:1", "x:1", "-1:1", "0:3,0:1", "0:", ":3", "03"}) {
    auto s = StdSpec::Parse(bad, "--tee");
    EXPECT_FALSE(s.ok()) << "'" << bad << "' accepted";
    if (!s.ok()) {
      EXPECT_NE(s.message().find("--tee"), std::string::npos) << s.message();
      EXPECT_NE(s.message().find(std::string("'") + bad + "'"), std::string::npos) << s.message();
    }
  }
}

// A lone bad value is told the whole grammar, not the map's alone.
TEST(StdSpec, ALoneBadValueIsToldBothForms) {
  EXPECT_NE(StdSpec::Parse("4", "-r").message().find("(expected 0-3 or a map like 0:3,1:0)"), std::string::npos);
  EXPECT_NE(StdSpec::Parse("0:1,x", "-r").message().find("(expected LOCAL_RANK:0-3 in a map)"), std::string::npos);
}

TEST(StdSpec, CoveredByComparesEveryRank) {
  auto covered = [](const char* a, const char* b) { return StdSpec::Parse(a)->CoveredBy(*StdSpec::Parse(b)); };
  EXPECT_TRUE(covered("0", "0"));
  EXPECT_TRUE(covered("3", "3"));
  EXPECT_TRUE(covered("1", "3"));
  EXPECT_FALSE(covered("3", "1"));
  EXPECT_FALSE(covered("1", "0:3"));  // rank 1 and up are not covered
  EXPECT_TRUE(covered("0:1,1:2", "3"));
  EXPECT_TRUE(covered("0:1,1:2", "0:1,1:2,2:3"));
  EXPECT_FALSE(covered("0:1,1:2", "0:1,1:1"));
  EXPECT_FALSE(covered("0:1", "0:2"));
}

TEST(StdSpec, TeeIsOredIntoRedirects) {
  auto r = *StdSpec::Parse("0:1,2:2");
  auto t = *StdSpec::Parse("0:2,1:1");
  auto both = r.Or(t);
  EXPECT_EQ(both.ForRank(0), Std::kAll);
  EXPECT_EQ(both.ForRank(1), Std::kOut);
  EXPECT_EQ(both.ForRank(2), Std::kErr);
  EXPECT_EQ(r.Or(*StdSpec::Parse("3")).ForRank(5), Std::kAll);
}

TEST(RankFilter, ListsAndRanges) {
  auto all = RankFilter::Parse("", "--ranks-filter");
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->AllowsAll());
  auto f = RankFilter::Parse("0, 3,10-12", "--ranks-filter");
  ASSERT_TRUE(f.ok()) << f.message();
  EXPECT_TRUE(f->Allows(0));
  EXPECT_FALSE(f->Allows(1));
  EXPECT_TRUE(f->Allows(3));
  EXPECT_TRUE(f->Allows(11));
  EXPECT_FALSE(f->Allows(13));
  for (const char* bad : {"a", "1,,2", "3-1", "-1", "1-"}) {
    auto b = RankFilter::Parse(bad, "--local-ranks-filter");
    EXPECT_FALSE(b.ok()) << bad;
    if (!b.ok()) {
      EXPECT_NE(b.message().find("--local-ranks-filter"), std::string::npos);
    }
  }
}

TEST(Prefix, TemplateRendering) {
  RankLabel l{"trainer", 13, 5, 16, 1, "node7", true};
  EXPECT_EQ(*RenderPrefixTemplate("[rank${rank}]: ", l), "[rank13]: ");
  EXPECT_EQ(*RenderPrefixTemplate("$role_name-$local_rank|", l), "trainer-5|");
  EXPECT_EQ(*RenderPrefixTemplate("${host}:${node_rank}/${world_size} $$", l), "node7:1/16 $");
  EXPECT_FALSE(RenderPrefixTemplate("${nope}", l).ok());
  EXPECT_FALSE(RenderPrefixTemplate("${rank", l).ok());
  EXPECT_FALSE(RenderPrefixTemplate("$ x", l).ok());
  EXPECT_FALSE(RenderPrefixTemplate("$", l).ok());
}

// torchrun renders its variable with safe_substitute: nothing in it can stop a run. ctrun does the
// same and names what stays as written in one warning.
TEST(Prefix, TorchrunsTemplateVariableIsRenderedSafelyWithAWarning) {
  RankLabel l{"trainer", 13, 5, 16, 1, "node7", true};
  auto f = PrefixFormat::Choose("", "[$foo ${rank}] 100$ ", /*any_tee=*/false);
  ASSERT_TRUE(f.ok()) << f.message();
  EXPECT_EQ(f->Render(l), "[$foo 13] 100$ ");
  EXPECT_NE(f->warning().find("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE: prefix template: unknown placeholder '$foo'"),
            std::string::npos)
      << f->warning();
  auto clean = PrefixFormat::Choose("", "[${rank}] ", false);
  ASSERT_TRUE(clean.ok());
  EXPECT_EQ(clean->warning(), "");
  EXPECT_EQ(clean->Render(l), "[13] ");
  // --log-prefix is ctrun's own: a typo there stops the run before it starts.
  EXPECT_FALSE(PrefixFormat::Choose("[$foo]", nullptr, false).ok());
}

TEST(Prefix, ChoiceAndDefaults) {
  RankLabel l{"default", 3, 3, 16, 0, "h", false};
  EXPECT_EQ(PrefixFormat::Default().Render(l), "[r03] ");
  l.world_size = 10;
  EXPECT_EQ(PrefixFormat::Default().Render(l), "[r3] ");
  l.world_size = 101;
  EXPECT_EQ(PrefixFormat::Default().Render(l), "[r003] ");
  l.world_size = 1;
  l.rank = 0;
  EXPECT_EQ(PrefixFormat::Default().Render(l), "[r0] ");
  RankLabel m{"default", 9, 1, 16, 1, "gpu-node-2", true};
  EXPECT_EQ(PrefixFormat::Default().Render(m), "[gpu-node-2 r09] ");

  EXPECT_EQ(PrefixFormat::Choose("", nullptr, false)->kind(), PrefixFormat::Kind::kDefault);
  auto tee = PrefixFormat::Choose("", nullptr, true);
  EXPECT_EQ(tee->kind(), PrefixFormat::Kind::kTorchrunTee);
  EXPECT_EQ(tee->Render(m), "[default1]:");
  auto env = PrefixFormat::Choose("", "[rank${rank}]: ", true);
  EXPECT_EQ(env->Render(m), "[rank9]: ");
  auto flag = PrefixFormat::Choose("${host}:${rank} ", "[rank${rank}]: ", true);
  EXPECT_EQ(flag->Render(m), "gpu-node-2:9 ");
  EXPECT_EQ(PrefixFormat::Choose("none", "[rank${rank}]: ", true)->Render(m), "");
  EXPECT_FALSE(PrefixFormat::Choose("${bogus}", nullptr, false).ok());
  // torchrun's variable never stops a run (safe_substitute): see the test below.
  EXPECT_EQ(PrefixFormat::Choose("", "${bogus}", false)->Render(m), "${bogus}");
}

TEST(Prefix, ColourKeepsTrailingSpacePlain) {
  EXPECT_EQ(ColorizePrefix("[r1] ", 1), "\x1b[32m[r1]\x1b[0m ");
  EXPECT_EQ(ColorizePrefix("", 1), "");
}

// The names are the CLI's (tests/unit/cli_test.cc); logging only maps the typed level.
TEST(Logging, Levels) {
  const std::vector<std::pair<LogLevel, spdlog::level::level_enum>> levels = {
      {LogLevel::kTrace, spdlog::level::trace}, {LogLevel::kDebug, spdlog::level::debug},
      {LogLevel::kInfo, spdlog::level::info},   {LogLevel::kWarning, spdlog::level::warn},
      {LogLevel::kError, spdlog::level::err},   {LogLevel::kOff, spdlog::level::off}};
  for (const auto& [level, want] : levels) {
    ASSERT_TRUE(SetupLogging(level).ok());
    EXPECT_EQ(spdlog::default_logger()->level(), want);
  }
}

}  // namespace
}  // namespace ctrun::logs
