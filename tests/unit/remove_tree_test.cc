#include "sys/remove_tree.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "helpers/test_util.h"

namespace ctrun {
namespace {
namespace fs = std::filesystem;
using ctrun::testing::TempDir;

TEST(RemoveTree, RemovesALogBaseLikeTreeOfManyRanks) {
  TempDir tmp;
  const fs::path base = tmp / "torchelastic_x";
  for (int a = 0; a < 2; ++a)
    for (int r = 0; r < 40; ++r) {
      const fs::path rank = base / "run_1" / ("attempt_" + std::to_string(a)) / std::to_string(r);
      fs::create_directories(rank);
      if (r % 3 == 0) std::ofstream(rank / "error.json") << "{}";
      if (r % 5 == 0) std::ofstream(rank / "stdout.log") << std::string(10000, 'x');
    }
  std::ofstream(base / "run_1" / "attempt_0" / "filtered_stdout.log") << "line\n";
  ASSERT_TRUE(RemoveTree(base.string(), 4).ok());
  EXPECT_FALSE(fs::exists(base));
  EXPECT_TRUE(fs::is_directory(tmp.path()));  // only what was named
}

// The same tree with every removal counted as slow: the rounds go on threads from the second
// entry on, and remove exactly as much.
TEST(RemoveTree, RemovesTheSameOnThreadsWhenRemovalsAreSlow) {
  TempDir tmp;
  const fs::path base = tmp / "torchelastic_x";
  for (int r = 0; r < 40; ++r) {
    const fs::path rank = base / "run_1" / "attempt_0" / std::to_string(r);
    fs::create_directories(rank);
    if (r % 3 == 0) std::ofstream(rank / "error.json") << "{}";
  }
  std::ofstream(tmp / "sibling") << "kept";
  ASSERT_TRUE(RemoveTree(base.string(), 4, std::chrono::microseconds(0)).ok());
  EXPECT_FALSE(fs::exists(base));
  EXPECT_TRUE(fs::exists(tmp / "sibling"));
}

// No thread can be created (RLIMIT_NPROC reached, or a pids cgroup's limit): the removal goes on
// on the calling thread. In a child that runs as nobody with a limit of one process (root is not
// held to RLIMIT_NPROC).
TEST(RemoveTree, RemovesOnTheCallingThreadWhenNoThreadCanBeMade) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to become nobody";
  TempDir tmp;
  const fs::path base = tmp / "torchelastic_x";
  for (int r = 0; r < 20; ++r) {
    fs::create_directories(base / "run_1" / "attempt_0" / std::to_string(r));
    std::ofstream(base / "run_1" / "attempt_0" / std::to_string(r) / "error.json") << "{}";
  }
  for (const auto& e : fs::recursive_directory_iterator(tmp.path()))
    if (e.is_directory()) fs::permissions(e.path(), fs::perms::all);
  fs::permissions(tmp.path(), fs::perms::all);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const rlimit one{1, 1};
    if (::setgid(65534) != 0 || ::setuid(65534) != 0 || ::setrlimit(RLIMIT_NPROC, &one) != 0) ::_exit(10);
    const Status s = RemoveTree(base.string(), 4, std::chrono::microseconds(0));  // every round on threads
    ::_exit(!s.ok() ? 11 : fs::exists(base) ? 12 : 0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_FALSE(fs::exists(base));
}

TEST(RemoveTree, UnlinksSymlinksWithoutFollowingThem) {
  TempDir tmp;
  const fs::path outside = tmp / "outside";
  fs::create_directories(outside / "keep");
  std::ofstream(outside / "keep" / "file") << "precious";
  const fs::path tree = tmp / "tree";
  fs::create_directories(tree / "a");
  fs::create_directory_symlink(outside, tree / "a" / "link");
  fs::create_symlink(outside / "keep" / "file", tree / "file_link");
  ASSERT_TRUE(RemoveTree(tree.string()).ok());
  EXPECT_FALSE(fs::exists(fs::symlink_status(tree)));
  EXPECT_TRUE(fs::exists(outside / "keep" / "file"));
  // A symlink given as the top is unlinked, its target kept.
  fs::create_directory_symlink(outside, tmp / "top_link");
  ASSERT_TRUE(RemoveTree(tmp / "top_link").ok());
  EXPECT_FALSE(fs::exists(fs::symlink_status(tmp / "top_link")));
  EXPECT_TRUE(fs::is_directory(outside / "keep"));
}

TEST(RemoveTree, MissingPathIsSuccessAndAPlainFileIsUnlinked) {
  TempDir tmp;
  EXPECT_TRUE(RemoveTree(tmp / "absent").ok());
  std::ofstream(tmp / "plain") << "x";
  EXPECT_TRUE(RemoveTree(tmp / "plain", 1).ok());
  EXPECT_FALSE(fs::exists(tmp / "plain"));
}

TEST(RemoveTree, AFailureNamesTheTreeAndTheEntry) {
  // Entries of /proc/self/fd cannot be unlinked: the error names the step and the entry.
  const Status s = RemoveTree("/proc/self/fd", 2);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rm -rf /proc/self/fd: unlink /proc/self/fd/"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace ctrun
