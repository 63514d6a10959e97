// cpack -G DEB from the build tree (the fixture test install.cpack, make_packages.cmake): the
// metadata of the ctrun and ctrun-dev packages (version from the project, Depends from
// dpkg-shlibdeps with no LibTorch or CUDA), their contents, the maintainer script that drops the
// torchrun alternative; then ctrun run from the extracted package with the source and build trees
// hidden, and a downstream project built against the extracted ctrun-dev.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "helpers/consumer_project.h"
#include "helpers/test_util.h"
#include "install/install_util.h"

namespace ctrun::testing {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using namespace std::chrono_literals;

// The packages the fixture test install.cpack built into CTRUN_DEB_DIR.
class DebianPackage : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dpkg_deb_ = FindTool("dpkg-deb");
    for (const std::string& f : ListTree(CTRUN_DEB_DIR)) {
      if (f.find('/') != std::string::npos || !f.ends_with(".deb")) continue;
      (f.starts_with("ctrun-dev_") ? dev_ : agent_) = std::string(CTRUN_DEB_DIR) + "/" + f;
    }
  }
  void SetUp() override {
    CTRUN_REQUIRE_TOOL(deb, "dpkg-deb", "dpkg-dev");
    CTRUN_REQUIRE_TOOL(shlibdeps, "dpkg-shlibdeps", "dpkg-dev");
    ASSERT_FALSE(agent_.empty() || dev_.empty()) << "no packages in " CTRUN_DEB_DIR " (run the test install.cpack)";
  }

  static std::string Field(const std::string& deb, const std::string& field) {
    RunResult r = RunCommand({dpkg_deb_, "-f", deb, field});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.out.empty() ? "" : r.out.substr(0, r.out.size() - 1);
  }
  // "./usr/bin/ctrun", "./usr/libexec/ctrun/torchrun -> ../../bin/ctrun", ...
  static std::vector<std::string> Contents(const std::string& deb) {
    RunResult r = RunCommand({dpkg_deb_, "-c", deb});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::vector<std::string> paths;
    for (const std::string& line : SplitLines(r.out)) {
      size_t dot = line.find(" ./");
      if (dot != std::string::npos && !line.ends_with("/")) paths.push_back(line.substr(dot + 1));
    }
    return paths;
  }
  static std::string Extract(const std::string& deb, const std::string& root) {
    RunResult r = RunCommand({dpkg_deb_, "-x", deb, root});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return root;
  }

  static inline std::string dpkg_deb_, agent_, dev_;
  TempDir dir_;
};

TEST_F(DebianPackage, FileNamesAndVersionFromTheProject) {
  EXPECT_THAT(std::filesystem::path(agent_).filename().string(), StartsWith("ctrun_" CTRUN_PROJECT_VERSION "_"));
  EXPECT_THAT(std::filesystem::path(dev_).filename().string(), StartsWith("ctrun-dev_" CTRUN_PROJECT_VERSION "_"));
  EXPECT_EQ(Field(agent_, "Package"), "ctrun");
  EXPECT_EQ(Field(dev_, "Package"), "ctrun-dev");
  EXPECT_EQ(Field(agent_, "Version"), CTRUN_PROJECT_VERSION);
  EXPECT_EQ(Field(dev_, "Version"), CTRUN_PROJECT_VERSION);
  EXPECT_EQ(Field(agent_, "Section"), "utils");
  EXPECT_THAT(Field(agent_, "Description"), HasSubstr("drop-in replacement for torchrun"));
}

// dpkg-shlibdeps computed the agent's Depends from its shared libraries: glibc only (the C++ runtime,
// spdlog and fmt are linked in), nothing of LibTorch or CUDA; libcurl and hwloc,
// loaded only by the etcd backend and the binding flags, are recommended.
TEST_F(DebianPackage, AgentDependsFromShlibdepsWithoutTorchOrCuda) {
  std::string depends = Field(agent_, "Depends");
  EXPECT_THAT(depends, HasSubstr("libc6 (>= "));
  for (const char* no : {"torch", "cuda", "nccl", "cudnn", "python"}) EXPECT_THAT(depends, Not(HasSubstr(no)));
  if (CTRUN_STATIC_CXX_RUNTIME) {
    for (const char* no : {"libstdc++", "libgcc", "spdlog", "libfmt"}) EXPECT_THAT(depends, Not(HasSubstr(no)));
  }
  EXPECT_EQ(Field(agent_, "Recommends"), "libcurl4, libhwloc15");
}

TEST_F(DebianPackage, AgentContents) {
  std::vector<std::string> files = Contents(agent_);
  for (const char* f : {"./usr/bin/ctrun", "./usr/libexec/ctrun/torchrun -> ../../bin/ctrun",
                        "./usr/share/bash-completion/completions/ctrun", "./usr/share/zsh/vendor-completions/_ctrun",
                        "./usr/share/fish/vendor_completions.d/ctrun.fish", "./usr/share/man/man1/ctrun.1.gz",
                        "./usr/share/doc/ctrun/copyright", "./usr/share/doc/ctrun/README.md"})
    EXPECT_THAT(files, Contains(f));
#ifdef CT_WATCHDOG
  EXPECT_THAT(files, Contains("./usr/libexec/ctrun/ct-watchdog"));
#endif
  for (const std::string& f : files) {
    EXPECT_THAT(f, Not(StartsWith("./usr/include"))) << "headers belong in ctrun-dev";
    EXPECT_THAT(f, Not(HasSubstr(".a"))) << "the worker library belongs in ctrun-dev";
  }
  EXPECT_THAT(files, Not(Contains("./usr/bin/torchrun")));  // the alias is off by default
}

TEST_F(DebianPackage, DevContents) {
  std::vector<std::string> files = Contents(dev_);
  bool header = false, library = false, config = false;
  for (const std::string& f : files) {
    header |= f == "./usr/include/ctrun/worker.h";
    library |= f.ends_with("/libctrun_worker.a");
    config |= f.ends_with("/cmake/ctrun/ctrunConfig.cmake");
    EXPECT_THAT(f, Not(StartsWith("./usr/bin"))) << "the agent is in the ctrun package";
  }
  EXPECT_TRUE(header && library && config) << ::testing::PrintToString(files);
}

TEST_F(DebianPackage, PrermDropsTheTorchrunAlternativeAndPostinstAddsNone) {
  RunResult prerm = RunCommand({dpkg_deb_, "-I", agent_, "prerm"});
  ASSERT_EQ(prerm.exit_code, 0) << prerm.err;
  EXPECT_THAT(prerm.out, HasSubstr("update-alternatives --remove torchrun /usr/libexec/ctrun/torchrun"));
  RunResult postinst = RunCommand({dpkg_deb_, "-I", agent_, "postinst"});
  EXPECT_NE(postinst.exit_code, 0) << "built without CTRUN_DEB_TORCHRUN_ALTERNATIVE, there is no postinst";
}

TEST_F(DebianPackage, ExtractedCtrunRunsAlone) {
  const std::string root = Extract(agent_, dir_ / "root");
  const std::string bin = ShellQuote(root + "/usr/bin/ctrun");
  bool hidden = false;
  RunResult r = RunShell(bin + " --version && " + bin + " --standalone --nproc_per_node=2 /bin/true && " +
                             ShellQuote(root + "/usr/libexec/ctrun/torchrun") + " --version",
                         /*hide_trees=*/true, &hidden);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::vector<std::string> lines = SplitLines(r.out);
  ASSERT_GE(lines.size(), 2u) << r.out;
  EXPECT_THAT(lines[0], StartsWith("ctrun " CTRUN_PROJECT_VERSION ": follows torchrun of PyTorch 2.x"));
  EXPECT_EQ(lines[1], lines[0]) << "the torchrun alias says the same";
  if (!hidden) std::cerr << "note: could not hide the source and build trees (unshare -m needs root)\n";
}

// A downstream CMake project finds the worker library in the extracted ctrun-dev (relocated: the
// package config computes its prefix from where it lies).
TEST_F(DebianPackage, DevPackageServesFindPackage) {
  const std::string root = Extract(dev_, dir_ / "dev-root");
  BuildAndRunConsumer(root + "/usr", dir_);
}

}  // namespace
}  // namespace ctrun::testing
