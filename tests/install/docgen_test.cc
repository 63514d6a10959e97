// The generators against the option table: every option in every completion script and in the man
// page, value choices that the parser accepts (and nothing else), README sections converted to roff,
// and the generated files in the build tree equal to what the generators produce from this table.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "cli/cli.h"
#include "docgen/completion.h"
#include "docgen/man_page.h"
#include "docgen/markdown_roff.h"
#include "helpers/map_env.h"
#include "helpers/test_util.h"

namespace ctrun::docgen {
namespace {

using ::testing::ContainsRegex;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ctrun::testing::MapEnv;
using ctrun::testing::ReadFileOr;

const OptionInfo& Find(const std::string& long_name) {
  static const std::vector<OptionInfo> table = OptionTable();
  for (const OptionInfo& o : table)
    for (const std::string& n : o.long_names)
      if (n == long_name) return o;
  static const OptionInfo none;
  ADD_FAILURE() << "no option " << long_name;
  return none;
}

std::string Readme() { return ReadFileOr(std::string(CTRUN_SOURCE_DIR) + "/README.md"); }

TEST(DocgenTable, BothSpellingsAndAliases) {
  EXPECT_THAT(Find("--nproc_per_node").long_names, ElementsAre("--nproc-per-node", "--nproc_per_node"));
  EXPECT_THAT(Find("--rdzv-id").long_names, ElementsAre("--rdzv-id", "--rdzv_id", "--run-id", "--run_id"));
  EXPECT_EQ(Find("--redirects").short_name, 'r');
  EXPECT_EQ(Find("--tee").short_name, 't');
  EXPECT_EQ(Find("--module").short_name, 'm');
  EXPECT_FALSE(Find("--standalone").takes_value);
}

TEST(DocgenTable, ValueChoices) {
  EXPECT_THAT(Find("--rdzv_backend").choices, ElementsAre("static", "c10d", "etcd", "etcd-v2"));
  EXPECT_THAT(Find("--nproc_per_node").choices, ElementsAre("cpu", "gpu", "auto"));
  EXPECT_THAT(Find("--redirects").choices, ElementsAre("0", "1", "2", "3"));
  EXPECT_THAT(Find("--tee").choices, ElementsAre("0", "1", "2", "3"));
  EXPECT_THAT(Find("--log-level").choices, ElementsAre("trace", "debug", "info", "warning", "error", "off"));
  EXPECT_THAT(Find("--start_method").choices, ElementsAre("spawn", "fork", "forkserver"));
  EXPECT_TRUE(Find("--master_port").choices.empty());
}

// What completion offers is what the parser takes: every choice parses, and where the metavar has no
// placeholder, a value outside the choices is refused.
TEST(DocgenTable, ParserAcceptsExactlyTheChoices) {
  for (const OptionInfo& o : OptionTable()) {
    if (o.choices.empty()) continue;
    for (const std::string& choice : o.choices) {
      CliOutcome out = ParseCommandLine({"ctrun", o.long_names[0] + "=" + choice, "/bin/true"}, MapEnv({}));
      EXPECT_EQ(out.action, CliOutcome::Action::kRun) << o.long_names[0] << "=" << choice << ": " << out.error;
    }
    bool closed = o.metavar.find_first_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ") == std::string::npos;
    if (!closed) continue;
    CliOutcome bad = ParseCommandLine({"ctrun", o.long_names[0] + "=bogus", "/bin/true"}, MapEnv({}));
    EXPECT_EQ(bad.exit_code, 2) << o.long_names[0];
    EXPECT_THAT(bad.error, HasSubstr("expected " + o.choices[0])) << o.long_names[0];
  }
}

TEST(DocgenCompletion, EveryShellHasEverySpelling) {
  std::vector<OptionInfo> table = OptionTable();
  std::string bash = BashCompletion(table), zsh = ZshCompletion(table), fish = FishCompletion(table);
  for (const OptionInfo& o : table) {
    for (const std::string& n : o.long_names) {
      EXPECT_THAT(bash, ContainsRegex("[ ']" + n + "[ ']")) << n;
      EXPECT_THAT(zsh, HasSubstr(n)) << n;
      EXPECT_THAT(fish, HasSubstr(" -l " + n.substr(2) + " ")) << n;
    }
    if (o.short_name) {
      EXPECT_THAT(fish, HasSubstr(std::string(" -s ") + o.short_name + " "));
    }
  }
  EXPECT_THAT(bash, HasSubstr("complete -F _ctrun ctrun"));
  EXPECT_THAT(zsh, HasSubstr("#compdef ctrun\n"));
  EXPECT_THAT(zsh, HasSubstr("'(--redirects -r)'{--redirects=,-r+}"));
  EXPECT_THAT(zsh, HasSubstr(":(static c10d etcd etcd-v2)'"));
  EXPECT_THAT(zsh, HasSubstr("'1:entrypoint:_files'"));
  EXPECT_THAT(fish, HasSubstr("-l rdzv-backend -l rdzv_backend -d 'Rendezvous backend: static (fixed nodes, node rank "
                              "0 hosts the store), c10d (ctrun'\\''s own, on its TCP store; elastic), etcd or etcd-v2 "
                              "(etcd'\\''s v3 API; elastic)' -x -a 'static c10d etcd etcd-v2'"));
}

TEST(DocgenCompletion, BashValueCasesComeFromTheTable) {
  std::string bash = BashCompletion(OptionTable());
  EXPECT_THAT(bash, HasSubstr("--rdzv-backend|--rdzv_backend) COMPREPLY=($(compgen -W 'static c10d etcd etcd-v2'"));
  EXPECT_THAT(bash, HasSubstr("--redirects|-r) COMPREPLY=($(compgen -W '0 1 2 3'"));
  EXPECT_THAT(bash, HasSubstr("--log-dir|--log_dir) _ctrun_dirs ;;"));
  EXPECT_THAT(bash, HasSubstr("_ctrun_short_value_regex='^-[hm]*[rt]$'"));
}

TEST(DocgenMarkdown, SectionStopsAtTheNextHeading) {
  std::string md = "# T\n## A\ntext a\n```\n## not a heading\n```\n### sub\nmore\n## B\ntext b\n";
  StatusOr<std::string> a = MarkdownSection(md, "A");
  ASSERT_TRUE(a.ok()) << a.message();
  EXPECT_EQ(*a, "text a\n```\n## not a heading\n```\n### sub\nmore\n");
  EXPECT_EQ(*MarkdownSection(md, "B"), "text b\n");
  EXPECT_THAT(MarkdownSection(md, "C").message(), HasSubstr("'## C'"));
}

TEST(DocgenMarkdown, BlocksAndInlineMarkup) {
  std::string roff = MarkdownToRoff(
      "| code | meaning |\n|---|---|\n| 0 | all **good** |\n| `--tee` \\| x | a [link](#x) → b |\n\n"
      "A paragraph\nover two lines, --nnodes=2 and non-zero.\n\n"
      "- item one\n  continued\n- .dot start\n\n```\n$ ctrun --version\n```\n");
  EXPECT_EQ(roff,
            ".TP\n0\nall \\fBgood\\fR\n"
            ".TP\n\\fB\\%\\-\\-tee\\fR | x\na link \\(-> b\n"
            ".PP\nA paragraph over two lines, \\%\\-\\-nnodes=2 and non-zero.\n"
            ".IP \\(bu 2\nitem one continued\n"
            ".IP \\(bu 2\n\\&.dot start\n"
            ".PP\n.EX\n$ ctrun \\-\\-version\n.EE\n");
}

TEST(DocgenManPage, OptionsDescriptionAndReadmeSections) {
  StatusOr<std::string> page = ManPage({"9.8.7", OptionTable(), HelpParagraphs(), Readme()});
  ASSERT_TRUE(page.ok()) << page.message();
  for (const char* s : {".TH CTRUN 1 \"\" \"ctrun 9.8.7\"", ".SH NAME\nctrun \\- ", ".SH SYNOPSIS", ".SH DESCRIPTION",
                        ".SH OPTIONS", ".SS Nodes & rendezvous", ".SH EXIT STATUS", ".SH ENVIRONMENT", ".SH SIGNALS",
                        "\\fB\\%\\-r\\fR, \\fB\\%\\-\\-redirects\\fR \\fI0|1|2|3|MAP\\fR", "TORCHELASTIC_RESTART_COUNT",
                        "Environment: \\fBPET_NPROC_PER_NODE\\fR.", "torchrun"})
    EXPECT_THAT(*page, HasSubstr(s));
  for (const OptionInfo& o : OptionTable()) {
    std::string escaped = "\\%";
    for (char c : o.long_names[0]) escaped += c == '-' ? std::string("\\-") : std::string(1, c);
    EXPECT_THAT(*page, HasSubstr("\\fB" + escaped + "\\fR")) << o.long_names[0];
  }
  StatusOr<std::string> missing = ManPage({"1", OptionTable(), HelpParagraphs(), "# no sections\n"});
  EXPECT_THAT(missing.message(), HasSubstr("'## Exit codes'"));
}

// The files the build generated are what the generators make of today's table and README.
TEST(DocgenFiles, BuildTreeFilesAreCurrent) {
  const std::string gen = CTRUN_GENERATED_DIR;
  EXPECT_EQ(ReadFileOr(gen + "/bash/ctrun"), BashCompletion(OptionTable()));
  EXPECT_EQ(ReadFileOr(gen + "/zsh/_ctrun"), ZshCompletion(OptionTable()));
  EXPECT_EQ(ReadFileOr(gen + "/fish/ctrun.fish"), FishCompletion(OptionTable()));
  StatusOr<std::string> page = ManPage({CTRUN_PROJECT_VERSION, OptionTable(), HelpParagraphs(), Readme()});
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(ReadFileOr(gen + "/man/ctrun.1"), *page);
}

// README quotes `ctrun --version` (without the version number, which it would have to follow).
TEST(DocgenReadme, QuotesTheVersionLine) {
  std::string version = VersionText();
  std::string after_number = version.substr(version.find(':'));
  EXPECT_THAT(Readme(), HasSubstr("$ ctrun --version\nctrun "));
  EXPECT_THAT(Readme(), HasSubstr(after_number));
  EXPECT_THAT(version, HasSubstr("PyTorch 2.x"));
  EXPECT_THAT(version, Not(HasSubstr("\n\n")));
}

}  // namespace
}  // namespace ctrun::docgen
