// cmake --install into a temporary prefix: everything in its GNU place, the generated files as
// built, nothing that names the source or build tree, and the installed ctrun (and its torchrun
// alias) runs a 2-worker job with both trees hidden.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <memory>

#include "helpers/test_util.h"
#include "install/install_util.h"

namespace ctrun::testing {
namespace {

using ::testing::AnyOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using namespace std::chrono_literals;

// One `cmake --install` of the whole build into a temporary prefix, for the suite.
class InstallTree : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<TempDir>();
    install_ = RunCommand({CMAKE_COMMAND_PATH, "--install", CTRUN_BUILD_DIR, "--prefix", Prefix()}, {}, 120s);
  }
  static void TearDownTestSuite() { dir_.reset(); }
  void SetUp() override { ASSERT_EQ(install_.exit_code, 0) << install_.out << install_.err; }

  static std::string Prefix() { return *dir_ / "prefix"; }

  static inline std::unique_ptr<TempDir> dir_;
  static inline RunResult install_;
};

TEST_F(InstallTree, GnuLayout) {
  std::vector<std::string> files = ListTree(Prefix());
  for (const char* f : {"bin/ctrun", "libexec/ctrun/torchrun", "include/ctrun/worker.h", "include/ctrun/launch_env.h",
                        "share/bash-completion/completions/ctrun", "share/zsh/vendor-completions/_ctrun",
                        "share/fish/vendor_completions.d/ctrun.fish", "share/man/man1/ctrun.1.gz",
                        "share/doc/ctrun/README.md", "share/doc/ctrun/copyright", "share/doc/ctrun/docs/store.md",
                        "share/doc/ctrun-dev/copyright"})
    EXPECT_THAT(files, Contains(f));
#ifdef CT_WATCHDOG
  EXPECT_THAT(files, Contains("libexec/ctrun/ct-watchdog"));
#endif
  bool config = false, library = false;
  for (const std::string& f : files) {
    config |= f.ends_with("/cmake/ctrun/ctrunConfig.cmake") && f.starts_with("lib");
    library |= f.ends_with("/libctrun_worker.a") && f.starts_with("lib");
  }
  EXPECT_TRUE(config && library) << "lib*/cmake/ctrun/ctrunConfig.cmake, lib*/libctrun_worker.a";
  EXPECT_EQ(access((Prefix() + "/bin/ctrun").c_str(), X_OK), 0);
}

TEST_F(InstallTree, CompletionsAndManPageAsGenerated) {
  const std::string gen = CTRUN_GENERATED_DIR;
  EXPECT_EQ(ReadFileOr(Prefix() + "/share/bash-completion/completions/ctrun"), ReadFileOr(gen + "/bash/ctrun"));
  EXPECT_EQ(ReadFileOr(Prefix() + "/share/zsh/vendor-completions/_ctrun"), ReadFileOr(gen + "/zsh/_ctrun"));
  EXPECT_EQ(ReadFileOr(Prefix() + "/share/man/man1/ctrun.1.gz"), ReadFileOr(gen + "/man/ctrun.1.gz"));
}

TEST_F(InstallTree, TorchrunAliasIsARelativeLinkToCtrun) {
  std::error_code ec;
  std::filesystem::path link = Prefix() + "/libexec/ctrun/torchrun";
  ASSERT_TRUE(std::filesystem::is_symlink(link, ec));
  EXPECT_EQ(std::filesystem::read_symlink(link, ec).string(), "../../bin/ctrun");
  EXPECT_TRUE(std::filesystem::equivalent(link, Prefix() + "/bin/ctrun", ec));
}

// No installed text file names the source or the build tree; ctrun has no RPATH/RUNPATH into them.
TEST_F(InstallTree, NothingPointsBackIntoTheTrees) {
  for (const std::string& f : ListTree(Prefix())) {
    if (f.ends_with(".a") || f.ends_with(".gz") || f.starts_with("bin/") || f.starts_with("libexec/")) continue;
    std::string text = ReadFileOr(Prefix() + "/" + f);
    EXPECT_THAT(text, Not(HasSubstr(CTRUN_BUILD_DIR))) << f;
    EXPECT_THAT(text, Not(HasSubstr(std::string(CTRUN_SOURCE_DIR) + "/"))) << f;
  }
  std::string readelf = FindTool("readelf");
  if (readelf.empty()) return;
  RunResult dyn = RunCommand({readelf, "-d", Prefix() + "/bin/ctrun"});
  EXPECT_THAT(dyn.out, Not(HasSubstr("PATH")));  // neither RPATH nor RUNPATH
}

// The agent needs only glibc at run time: the C++ runtime is linked in (CTRUN_STATIC_CXX_RUNTIME)
// and so are spdlog and fmt (src/base/spdlog_fmt.cc), so neither libstdc++, libgcc_s, libspdlog nor libfmt is
// loaded (nor needed on the machine). NVML, libcurl and hwloc come later, by dlopen.
TEST_F(InstallTree, CtrunNeedsOnlyGlibc) {
  if (!CTRUN_STATIC_CXX_RUNTIME) GTEST_SKIP() << "built with the shared C++ runtime (CTRUN_SANITIZE)";
  CTRUN_REQUIRE_TOOL(readelf, "readelf", "binutils (build-essential)");
  RunResult dyn = RunCommand({readelf, "-d", Prefix() + "/bin/ctrun"});
  ASSERT_EQ(dyn.exit_code, 0) << dyn.err;
  std::vector<std::string> needed;  // " 0x...01 (NEEDED)  Shared library: [libc.so.6]"
  for (const std::string& line : SplitLines(dyn.out)) {
    size_t open = line.find('['), close = line.rfind(']');
    if (line.find("(NEEDED)") != std::string::npos && open < close) needed.push_back(line.substr(open + 1, close - open - 1));
  }
  EXPECT_THAT(needed, Contains("libc.so.6"));
  for (const std::string& lib : needed)
    EXPECT_THAT(lib, AnyOf("libc.so.6", "libm.so.6", StartsWith("ld-linux")))  // the unwinder's _dl_find_object
        << "ctrun needs only glibc at run time: " << dyn.out;
}

// The installed ctrun, and the alias, run a 2-worker job with the source and build trees hidden.
TEST_F(InstallTree, RunsFromThePrefixAlone) {
  const std::string bin = ShellQuote(Prefix() + "/bin/ctrun");
  const std::string alias = ShellQuote(Prefix() + "/libexec/ctrun/torchrun");
  bool hidden = false;
  RunResult r = RunShell(bin + " --version && " + bin + " --standalone --nproc_per_node=2 --log-level=debug /bin/true && " + alias +
                             " --standalone --nproc-per-node=2 --log-prefix=none /bin/sh -c 'echo rank=$RANK'",
                         /*hide_trees=*/true, &hidden);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("ctrun " CTRUN_PROJECT_VERSION ": follows torchrun of PyTorch 2.x"));
  EXPECT_THAT(r.out, HasSubstr("rank=0"));
  EXPECT_THAT(r.out, HasSubstr("rank=1"));
#ifdef CT_WATCHDOG
  // The installed ctrun finds the installed ct-watchdog (libexec/ctrun), not the build tree's.
  EXPECT_THAT(r.err, Not(HasSubstr("the watchdog is a fork of ctrun"))) << r.err;
#endif
  if (!hidden) std::cerr << "note: could not hide the source and build trees (unshare -m needs root)\n";
}

}  // namespace
}  // namespace ctrun::testing
