// The generated bash completion in a non-interactive bash: `complete -p ctrun`, then _ctrun run on
// COMP_WORDS/COMP_LINE as bash fills them for a typed line (words split at blanks and at '=' and ':',
// like readline), with bash-completion loaded (how it is used) and without it (the fallback).
// Zsh and fish: the scripts parse (zsh -n, fish --no-execute) and fish completes from them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "helpers/test_util.h"
#include "install/install_util.h"

namespace ctrun::testing {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::UnorderedElementsAre;

const std::string kBashCompletionLib = "/usr/share/bash-completion/bash_completion";
const std::string kGenerated = CTRUN_GENERATED_DIR;

// Sets COMP_LINE/COMP_POINT/COMP_WORDS/COMP_CWORD for a line typed up to the cursor, splitting
// words as readline does with the default COMP_WORDBREAKS (runs of '=' or ':' are words of their own).
constexpr const char* kWordsFunction = R"SH(
_test_words() {
  COMP_LINE=$1 COMP_POINT=${#1} COMP_WORDS=()
  local w= c i
  for ((i = 0; i < ${#1}; i++)); do
    c=${1:i:1}
    if [[ $c == [[:blank:]] ]]; then
      [[ $w ]] && COMP_WORDS+=("$w")
      w=
    elif [[ $c == [=:] && $w && $w != [=:]* ]] || [[ $c != [=:] && $w == [=:]* ]]; then
      COMP_WORDS+=("$w")
      w=$c
    else
      w+=$c
    fi
  done
  COMP_WORDS+=("$w")
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
}
)SH";

class BashCompletion : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    bash_ = FindTool("bash");
    if (bash_.empty()) GTEST_SKIP() << "bash not found: install the Debian package bash";
    if (GetParam() && access(kBashCompletionLib.c_str(), R_OK) != 0)
      GTEST_SKIP() << kBashCompletionLib
                   << " not found: install the Debian package bash-completion (listed in scripts/debian-packages.txt)";
    std::ofstream(dir_ / "train.py") << "print()\n";
    std::ofstream(dir_ / "tr:ick") << "";
    std::filesystem::create_directory(dir_ / "trainer");
  }

  // Runs `body` in a fresh non-interactive bash that has loaded the completion (and bash-completion
  // when the parameter says so), in a directory with train.py, tr:ick and trainer/.
  RunResult Bash(const std::string& body) {
    std::string script = std::string(GetParam() ? ". " + ShellQuote(kBashCompletionLib) + "\n" : "") + ". " +
                         ShellQuote(kGenerated + "/bash/ctrun") + "\ncd " + ShellQuote(dir_.path()) + "\n" +
                         kWordsFunction + body;
    return RunCommand({bash_, "--norc", "--noprofile", "-c", script});
  }

  // What <TAB> offers at the end of `line`, sorted.
  std::vector<std::string> Complete(const std::string& line) {
    RunResult r = Bash("_test_words " + ShellQuote(line) + "\n_ctrun ctrun\nprintf '%s\\n' \"${COMPREPLY[@]}\"\n");
    EXPECT_EQ(r.exit_code, 0) << line << "\n" << r.err;
    EXPECT_EQ(r.err, "") << line;
    std::vector<std::string> words;
    for (const std::string& w : SplitLines(r.out))
      if (!w.empty()) words.push_back(w);
    std::sort(words.begin(), words.end());
    return words;
  }

  std::string bash_;
  TempDir dir_;
};

TEST_P(BashCompletion, IsRegisteredForCtrun) {
  RunResult r = Bash("complete -p ctrun\n");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "complete -F _ctrun ctrun\n");
}

TEST_P(BashCompletion, OptionNamesInBothSpellings) {
  EXPECT_THAT(Complete("ctrun --rdzv-b"), ElementsAre("--rdzv-backend"));
  EXPECT_THAT(Complete("ctrun --rdzv_b"), ElementsAre("--rdzv_backend"));
  EXPECT_THAT(Complete("ctrun --nproc"), ElementsAre("--nproc-per-node", "--nproc_per_node"));
  EXPECT_THAT(Complete("ctrun --run"), ElementsAre("--run-id", "--run-path", "--run_id", "--run_path"));
  EXPECT_THAT(Complete("ctrun -"), Contains("-r"));
  EXPECT_THAT(Complete("ctrun -"), Contains("--standalone"));
}

TEST_P(BashCompletion, ValueChoices) {
  EXPECT_THAT(Complete("ctrun --rdzv_backend "), ElementsAre("c10d", "etcd", "etcd-v2", "static"));
  EXPECT_THAT(Complete("ctrun --rdzv-backend=et"), ElementsAre("etcd", "etcd-v2"));
  EXPECT_THAT(Complete("ctrun --rdzv-backend="), ElementsAre("c10d", "etcd", "etcd-v2", "static"));
  EXPECT_THAT(Complete("ctrun --nproc_per_node "), ElementsAre("auto", "cpu", "gpu"));
  EXPECT_THAT(Complete("ctrun --nproc-per-node=g"), ElementsAre("gpu"));
  EXPECT_THAT(Complete("ctrun --nproc "), ElementsAre("auto", "cpu", "gpu"));  // a unique prefix
  EXPECT_THAT(Complete("ctrun -r "), ElementsAre("0", "1", "2", "3"));
  EXPECT_THAT(Complete("ctrun -mt "), ElementsAre("0", "1", "2", "3"));
  EXPECT_THAT(Complete("ctrun --tee="), ElementsAre("0", "1", "2", "3"));
  EXPECT_THAT(Complete("ctrun --redirects "), ElementsAre("0", "1", "2", "3"));
  EXPECT_THAT(Complete("ctrun --log-level "), ElementsAre("debug", "error", "info", "off", "trace", "warning"));
  EXPECT_THAT(Complete("ctrun --start_method f"), ElementsAre("fork", "forkserver"));
  EXPECT_THAT(Complete("ctrun --master_port "), IsEmpty());  // free text: nothing to offer
}

TEST_P(BashCompletion, DirectoriesForLogDir) {
  EXPECT_THAT(Complete("ctrun --log_dir tr"), ElementsAre("trainer"));
}

TEST_P(BashCompletion, EntrypointIsAFile) {
  EXPECT_THAT(Complete("ctrun --standalone --nproc_per_node=2 train"), UnorderedElementsAre("train.py", "trainer"));
  EXPECT_THAT(Complete("ctrun --nnodes 1 train."), ElementsAre("train.py"));
  EXPECT_THAT(Complete("ctrun -- train."), ElementsAre("train.py"));
}

TEST_P(BashCompletion, NoOptionsAfterTheEntrypoint) {
  EXPECT_THAT(Complete("ctrun train.py --nn"), Not(Contains("--nnodes")));
  EXPECT_THAT(Complete("ctrun --standalone -- --nn"), Not(Contains("--nnodes")));
  // host:port and a separate value are values, not the entrypoint.
  EXPECT_THAT(Complete("ctrun --rdzv_endpoint head:29400 --nn"), ElementsAre("--nnodes"));
  EXPECT_THAT(Complete("ctrun --nproc 2 --stand"), ElementsAre("--standalone"));
  EXPECT_THAT(Complete("ctrun -r 3 --stand"), ElementsAre("--standalone"));
}

INSTANTIATE_TEST_SUITE_P(WithAndWithoutBashCompletion, BashCompletion, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "BashCompletionLoaded" : "Plain";
                         });

TEST(ZshCompletion, Parses) {
  CTRUN_REQUIRE_TOOL(zsh, "zsh", "zsh");
  RunResult r = RunCommand({zsh, "-n", kGenerated + "/zsh/_ctrun"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
}

TEST(FishCompletion, CompletesChoicesAndOptions) {
  CTRUN_REQUIRE_TOOL(fish, "fish", "fish");
  const std::string file = kGenerated + "/fish/ctrun.fish";
  RunResult syntax = RunCommand({fish, "--no-execute", file});
  EXPECT_EQ(syntax.exit_code, 0) << syntax.err;
  RunResult r = RunCommand({fish, "--no-config", "-c",
                            "source " + ShellQuote(file) + "; complete -C 'ctrun --rdzv_backend '; echo ---; "
                            "complete -C 'ctrun --nproc-per-'; echo ---; complete -C 'ctrun ./train.py --nnod'"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::vector<std::string>> parts(1);  // the candidates (before the tab) of each command
  for (const std::string& line : SplitLines(r.out)) {
    if (line == "---") {
      parts.emplace_back();
    } else if (!line.empty()) {
      parts.back().push_back(line.substr(0, line.find('\t')));
    }
  }
  ASSERT_EQ(parts.size(), 3u) << r.out;
  EXPECT_THAT(parts[0], UnorderedElementsAre("static", "c10d", "etcd", "etcd-v2"));
  EXPECT_THAT(parts[1], ElementsAre("--nproc-per-node"));
  EXPECT_THAT(parts[2], IsEmpty());  // the entrypoint is on the line: no more ctrun options
}

}  // namespace
}  // namespace ctrun::testing
