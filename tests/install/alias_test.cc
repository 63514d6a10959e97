// Invoked as `torchrun` (a symlink, the way the package's alias works) ctrun behaves exactly like
// ctrun: the same help, version, errors and exit codes, and the same job, found through PATH too.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include "helpers/test_util.h"
#include "install/install_util.h"

namespace ctrun::testing {
namespace {

using ::testing::HasSubstr;

class TorchrunAlias : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(symlink(CTRUN_BINARY, torchrun_.c_str()), 0); }

  // The same arguments through ctrun and through the alias.
  void ExpectSame(const std::vector<std::string>& args) {
    std::vector<std::string> a = {CTRUN_BINARY}, b = {torchrun_};
    a.insert(a.end(), args.begin(), args.end());
    b.insert(b.end(), args.begin(), args.end());
    RunResult ctrun = RunCommand(a), alias = RunCommand(b);
    EXPECT_EQ(alias.exit_code, ctrun.exit_code) << args[0];
    EXPECT_EQ(alias.out, ctrun.out) << args[0];
    EXPECT_EQ(alias.err, ctrun.err) << args[0];
  }

  TempDir dir_;
  std::string torchrun_ = dir_ / "torchrun";
};

TEST_F(TorchrunAlias, SameHelpVersionAndErrors) {
  ExpectSame({"--help"});
  ExpectSame({"--version"});
  ExpectSame({"--nnodes=0", "/bin/true"});
  ExpectSame({"--bogus", "/bin/true"});
  ExpectSame({"--rdzv_backend=etcd-v3", "/bin/true"});
  ExpectSame({"--standalone", "/definitely/not/here"});
}

TEST_F(TorchrunAlias, RunsAJobFromPath) {
  RunResult r = RunShell("PATH=" + ShellQuote(dir_.path()) + ":$PATH; "
                         "torchrun --standalone --nproc-per-node=2 --log-prefix=none /bin/sh -c "
                         "'echo \"rank=$RANK world=$WORLD_SIZE\"'",
                         /*hide_trees=*/false);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("rank=0 world=2"));
  EXPECT_THAT(r.out, HasSubstr("rank=1 world=2"));
}

TEST_F(TorchrunAlias, ExitCodeOfAFailedJob) {
  RunResult r = RunCommand({torchrun_, "--standalone", "--nproc_per_node=2", "/bin/sh", "-c", "exit 7"});
  EXPECT_EQ(r.exit_code, 7) << r.err;  // ctrun's root-cause code, not torchrun's 1
}

}  // namespace
}  // namespace ctrun::testing
