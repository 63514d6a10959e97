#include "logs/log_dir.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "helpers/test_util.h"

namespace ctrun::logs {
namespace {
namespace fs = std::filesystem;
using ctrun::testing::TempDir;

TEST(LogDir, TorchrunLayoutAndAttemptRecreation) {
  TempDir tmp;
  auto dir = LogDir::Create(tmp / "logs", "job42");
  ASSERT_TRUE(dir.ok()) << dir.message();
  fs::path run(dir->run_dir());
  EXPECT_EQ(run.parent_path(), fs::path(tmp / "logs"));
  EXPECT_EQ(run.filename().string().rfind("job42_", 0), 0u) << run;
  EXPECT_TRUE(fs::is_directory(run));

  auto a0 = dir->PrepareAttempt(0, 3);
  ASSERT_TRUE(a0.ok()) << a0.message();
  EXPECT_TRUE(a0->files_enabled());
  EXPECT_EQ(a0->dir, dir->run_dir() + "/attempt_0");
  ASSERT_EQ(a0->ranks.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    const RankPaths& p = a0->ranks[static_cast<size_t>(r)];
    EXPECT_EQ(p.dir, a0->dir + "/" + std::to_string(r));
    EXPECT_TRUE(fs::is_directory(p.dir));
    EXPECT_EQ(p.stdout_log, p.dir + "/stdout.log");
    EXPECT_EQ(p.stderr_log, p.dir + "/stderr.log");
    EXPECT_EQ(p.error_file, p.dir + "/error.json");
  }
  std::ofstream(a0->ranks[0].stdout_log) << "old";
  // A restart with the same attempt number starts from an empty directory.
  auto again = dir->PrepareAttempt(0, 2);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(fs::exists(a0->ranks[0].stdout_log));
  EXPECT_FALSE(fs::exists(a0->ranks[2].dir));
  EXPECT_TRUE(fs::is_directory(again->ranks[1].dir));
  auto a1 = dir->PrepareAttempt(1, 2);
  ASSERT_TRUE(a1.ok());
  EXPECT_TRUE(fs::is_directory(dir->run_dir() + "/attempt_1/1"));
  EXPECT_TRUE(fs::is_directory(dir->run_dir() + "/attempt_0/1"));  // earlier attempts are kept

  // A second agent (or run) with the same id gets its own directory.
  auto other = LogDir::Create(tmp / "logs", "job42");
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->run_dir(), dir->run_dir());
}

// LogDir::Create without --log_dir, with $TMPDIR set to `tmpdir` for the call.
StatusOr<LogDir> CreateInTmpdir(const std::string& tmpdir) {
  const char* old = getenv("TMPDIR");
  const std::string saved = old ? old : "";
  setenv("TMPDIR", tmpdir.c_str(), 1);
  auto dir = LogDir::Create(std::nullopt, "none");
  if (old) setenv("TMPDIR", saved.c_str(), 1);
  else unsetenv("TMPDIR");
  return dir;
}

TEST(LogDir, DefaultBaseIsAFreshTorchelasticTempDir) {
  TempDir tmp;
  auto dir = CreateInTmpdir(tmp.path());
  ASSERT_TRUE(dir.ok()) << dir.message();
  fs::path run(dir->run_dir());
  EXPECT_EQ(run.parent_path().parent_path(), fs::path(tmp.path()));
  EXPECT_EQ(run.parent_path().filename().string().rfind("torchelastic_", 0), 0u) << run;
  EXPECT_EQ(run.filename().string().rfind("none_", 0), 0u) << run;
}

// torchrun's base comes from Python's tempfile.gettempdir(), which passes over a $TMPDIR it cannot
// write to ($TEMP, $TMP, /tmp, ... next): a stale TMPDIR must not stop a job torchrun would run.
TEST(LogDir, AnUnusableTmpdirFallsBackLikePythonsTempfileAndSaysSo) {
  TempDir tmp;
  const std::string file = tmp / "a-file";
  std::ofstream(file) << "x";
  for (const std::string& bad : {tmp / "missing", file}) {
    const char* old_temp = getenv("TEMP");
    const std::string saved_temp = old_temp ? old_temp : "";
    setenv("TEMP", tmp.path().c_str(), 1);
    auto dir = CreateInTmpdir(bad);
    if (old_temp) setenv("TEMP", saved_temp.c_str(), 1);
    else unsetenv("TEMP");
    ASSERT_TRUE(dir.ok()) << dir.message();
    EXPECT_EQ(fs::path(dir->run_dir()).parent_path().parent_path(), fs::path(tmp.path())) << dir->run_dir();
    EXPECT_NE(dir->notice().find("TMPDIR=" + bad + " cannot be used"), std::string::npos) << dir->notice();
    EXPECT_NE(dir->notice().find("goes to " + tmp.path() + " instead"), std::string::npos) << dir->notice();
    ASSERT_TRUE(dir->RemoveTemporaryBase().ok());
  }
  auto fine = CreateInTmpdir(tmp.path());
  ASSERT_TRUE(fine.ok());
  EXPECT_EQ(fine->notice(), "");
  ASSERT_TRUE(fine->RemoveTemporaryBase().ok());
}

TEST(LogDir, HoldsAFileSeesFilesAtAnyDepthAndNotEmptyDirectories) {
  TempDir tmp;
  fs::create_directories(tmp / "run/attempt_0/1");
  EXPECT_FALSE(HoldsAFile(tmp / "run"));
  EXPECT_FALSE(HoldsAFile(tmp / "missing"));
  std::ofstream(tmp / "run/attempt_0/1/error.json") << "{}";
  EXPECT_TRUE(HoldsAFile(tmp / "run"));
  EXPECT_EQ(FirstFileUnder(tmp / "run"), "attempt_0/1/error.json");
  EXPECT_EQ(FirstFileUnder(tmp / "missing"), "");
}

TEST(LogDir, DevNullDisablesFiles) {
  auto dir = LogDir::Create(std::string("/dev/null"), "x");
  ASSERT_TRUE(dir.ok());
  EXPECT_FALSE(dir->files_enabled());
  auto a = dir->PrepareAttempt(2, 2);
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->files_enabled());
  EXPECT_EQ(a->ranks[1].error_file, "") << "TORCHELASTIC_ERROR_FILE is empty, as under torchrun";
  EXPECT_EQ(a->ranks[1].stdout_log, "/dev/null");
}

TEST(LogDir, UncreatableBaseIsAnError) {
  auto dir = LogDir::Create(std::string("/proc/ctrun-cannot-be-here"), "x");
  EXPECT_FALSE(dir.ok());
}

// The names in a directory, sorted ("." and ".." left out).
std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(LogDir, AnAttemptMadeAheadIsRenamedIntoPlace) {
  TempDir tmp;
  auto dir = LogDir::Create(tmp / "logs", "job");
  ASSERT_TRUE(dir.ok()) << dir.message();
  ASSERT_TRUE(dir->PrepareAttempt(0, 3).ok());
  dir->MakeAhead(1, 3);
  auto a1 = dir->PrepareAttempt(1, 3);  // waits for the thread, then renames
  ASSERT_TRUE(a1.ok()) << a1.message();
  EXPECT_EQ(a1->dir, dir->run_dir() + "/attempt_1");
  EXPECT_EQ(Entries(a1->dir), (std::vector<std::string>{"0", "1", "2"}));
  EXPECT_EQ(Entries(dir->run_dir()), (std::vector<std::string>{"attempt_0", "attempt_1"}));  // no .attempt_1 left
  EXPECT_EQ(a1->ranks[2].error_file, a1->dir + "/2/error.json");
}

TEST(LogDir, ATreeMadeAheadForAnotherAttemptOrSizeIsNotUsed) {
  TempDir tmp;
  auto dir = LogDir::Create(tmp / "logs", "job");
  ASSERT_TRUE(dir.ok()) << dir.message();
  dir->MakeAhead(1, 2);
  auto a2 = dir->PrepareAttempt(2, 2);  // another attempt: made here, the other tree removed
  ASSERT_TRUE(a2.ok()) << a2.message();
  EXPECT_EQ(Entries(dir->run_dir()), (std::vector<std::string>{"attempt_2"}));
  dir->MakeAhead(3, 2);
  auto a3 = dir->PrepareAttempt(3, 4);  // another size
  ASSERT_TRUE(a3.ok()) << a3.message();
  EXPECT_EQ(Entries(a3->dir), (std::vector<std::string>{"0", "1", "2", "3"}));
  EXPECT_EQ(Entries(dir->run_dir()), (std::vector<std::string>{"attempt_2", "attempt_3"}));
}

TEST(LogDir, AnExistingAttemptDirectoryIsReplacedByTheTreeMadeAhead) {
  TempDir tmp;
  auto dir = LogDir::Create(tmp / "logs", "job");
  ASSERT_TRUE(dir.ok()) << dir.message();
  auto first = dir->PrepareAttempt(1, 2);
  ASSERT_TRUE(first.ok());
  std::ofstream(first->ranks[0].stdout_log) << "old";
  dir->MakeAhead(1, 2);
  auto again = dir->PrepareAttempt(1, 2);
  ASSERT_TRUE(again.ok()) << again.message();
  EXPECT_FALSE(fs::exists(first->ranks[0].stdout_log));
  EXPECT_EQ(Entries(again->dir), (std::vector<std::string>{"0", "1"}));
  EXPECT_EQ(Entries(dir->run_dir()), (std::vector<std::string>{"attempt_1"}));
}

TEST(LogDir, DropAheadRemovesTheTreeNoAttemptTook) {
  TempDir tmp;
  auto dir = LogDir::Create(tmp / "logs", "job");
  ASSERT_TRUE(dir.ok()) << dir.message();
  ASSERT_TRUE(dir->PrepareAttempt(0, 2).ok());
  dir->MakeAhead(1, 2);
  EXPECT_TRUE(dir->DropAhead().ok());
  EXPECT_EQ(Entries(dir->run_dir()), (std::vector<std::string>{"attempt_0"}));
  EXPECT_TRUE(dir->DropAhead().ok());  // nothing pending: nothing to do
}

// The directories it made go by rmdir alone, and so do directories a worker made that hold
// nothing.
TEST(LogDir, RemovingTheTemporaryBaseRemovesEveryAttemptAndEmptyDirectoriesWorkersMade) {
  for (const bool leftovers : {false, true}) {
    TempDir tmp;
    auto dir = CreateInTmpdir(tmp.path());
    ASSERT_TRUE(dir.ok()) << dir.message();
    auto a0 = dir->PrepareAttempt(0, 4);
    ASSERT_TRUE(a0.ok()) << a0.message();
    if (leftovers) {
      fs::create_directories(a0->ranks[2].dir + "/scratch/deep");
      fs::create_directories(dir->run_dir() + "/../cache");
    }
    ASSERT_TRUE(dir->PrepareAttempt(1, 4).ok());
    ASSERT_TRUE(dir->PrepareAttempt(1, 4).ok());  // the same attempt prepared again
    dir->MakeAhead(2, 4);
    StatusOr<bool> removed = dir->RemoveTemporaryBase();
    ASSERT_TRUE(removed.ok()) << removed.message();
    EXPECT_TRUE(*removed) << leftovers;
    EXPECT_TRUE(Entries(tmp.path()).empty()) << leftovers;
  }
}

// A file is never removed, wherever it lies and whoever wrote it (an earlier attempt's error
// file, a worker's output next to it, a file in the base itself, a symlink): the base is kept,
// every attempt with all its rank directories in place, and only the tree made ahead goes.
TEST(LogDir, ATemporaryBaseThatHoldsAFileIsKeptWholeWithTorchrunsLayout) {
  const std::vector<std::string> places = {"attempt_0/1/error.json", "attempt_1/3/out.pt", "attempt_1/notes",
                                           "written-by-a-worker", "../base-file", "attempt_0/0/link"};
  for (const std::string& place : places) {
    TempDir tmp;
    auto dir = CreateInTmpdir(tmp.path());
    ASSERT_TRUE(dir.ok()) << dir.message();
    ASSERT_TRUE(dir->PrepareAttempt(0, 4).ok());
    ASSERT_TRUE(dir->PrepareAttempt(1, 4).ok());
    dir->MakeAhead(2, 4);
    const std::string file = dir->run_dir() + "/" + place;
    if (place.ends_with("link")) fs::create_symlink("/nonexistent", file);
    else std::ofstream(file) << "data";
    StatusOr<bool> removed = dir->RemoveTemporaryBase();
    ASSERT_TRUE(removed.ok()) << removed.message();
    EXPECT_FALSE(*removed) << place;
    EXPECT_TRUE(fs::exists(fs::symlink_status(file))) << place;
    for (const char* attempt : {"attempt_0", "attempt_1"})
      for (const char* rank : {"0", "1", "2", "3"})
        EXPECT_TRUE(fs::is_directory(dir->run_dir() + "/" + attempt + "/" + rank)) << place << " " << attempt << "/" << rank;
    EXPECT_FALSE(fs::exists(dir->run_dir() + "/.attempt_2")) << place;
  }
}

TEST(LogDir, RemovingTheTemporaryBaseWaitsForATreeMadeAhead) {
  TempDir tmp;
  auto dir = CreateInTmpdir(tmp.path());
  ASSERT_TRUE(dir.ok()) << dir.message();
  ASSERT_TRUE(dir->PrepareAttempt(0, 64).ok());
  dir->MakeAhead(1, 64);
  EXPECT_TRUE(dir->RemoveTemporaryBase().ok());
  EXPECT_TRUE(Entries(tmp.path()).empty());
}

// A temp cleaner may remove a long job's run directory: the next attempt makes it again, whether
// its tree was made ahead (after the removal) or is made then.
TEST(LogDir, ARunDirectoryRemovedUnderTheJobIsMadeAgain) {
  TempDir tmp;
  auto dir = LogDir::Create(tmp / "logs", "job");
  ASSERT_TRUE(dir.ok()) << dir.message();
  ASSERT_TRUE(dir->PrepareAttempt(0, 2).ok());
  fs::remove_all(dir->run_dir());
  auto a1 = dir->PrepareAttempt(1, 2);
  ASSERT_TRUE(a1.ok()) << a1.message();
  EXPECT_EQ(Entries(a1->dir), (std::vector<std::string>{"0", "1"}));
  fs::remove_all(dir->run_dir());
  dir->MakeAhead(2, 2);
  auto a2 = dir->PrepareAttempt(2, 2);
  ASSERT_TRUE(a2.ok()) << a2.message();
  EXPECT_EQ(Entries(a2->dir), (std::vector<std::string>{"0", "1"}));
  EXPECT_EQ(Entries(dir->run_dir()), (std::vector<std::string>{"attempt_2"}));
}

TEST(LogDir, NothingIsMadeAheadWhenFilesAreOff) {
  auto dir = LogDir::Create(std::string("/dev/null"), "x");
  ASSERT_TRUE(dir.ok());
  dir->MakeAhead(1, 2);
  auto a = dir->PrepareAttempt(1, 2);
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->files_enabled());
  EXPECT_TRUE(dir->DropAhead().ok());
}

// What a SIGKILLed agent's watchdog runs: the hidden trees made ahead go, nothing else does (an
// attempt that ran, a tree someone wrote into, a name that is not MakeAhead's).
TEST(LogDir, RemoveTreesMadeAheadTakesOnlyTheUnusedHiddenTrees) {
  TempDir tmp;
  auto dir = LogDir::Create(tmp / "logs", "job");
  ASSERT_TRUE(dir.ok()) << dir.message();
  ASSERT_TRUE(dir->PrepareAttempt(0, 2).ok());
  dir->MakeAhead(1, 64);
  const std::string run = dir->run_dir();
  for (const char* d : {"/.attempt_7/0", "/.attempt_x/0", "/.attempt_/0"}) fs::create_directories(run + d);
  std::ofstream(run + "/.attempt_7/0/stdout.log") << "kept";
  // Rank directories are made in order: the last one means the thread is done with the tree.
  ASSERT_TRUE(ctrun::testing::WaitFor([&] { return fs::is_directory(run + "/.attempt_1/63"); }, std::chrono::seconds(10)));

  RemoveTreesMadeAhead(run);
  EXPECT_EQ(Entries(run), (std::vector<std::string>{".attempt_", ".attempt_7", ".attempt_x", "attempt_0"}));
  EXPECT_EQ(Entries(run + "/.attempt_7"), (std::vector<std::string>{"0"}));
  EXPECT_EQ(Entries(run + "/attempt_0"), (std::vector<std::string>{"0", "1"}));
  RemoveTreesMadeAhead(tmp / "missing");  // silent
}

// Eager removal, on a fresh base in a temporary $TMPDIR with attempt 0 prepared. Releases are
// asynchronous: the tests settle them through RemoveTemporaryBase / RestoreReleased, or poll.
class LogDirRelease : public ::testing::Test {
 protected:
  void Prepare(int nproc) {
    auto made = CreateInTmpdir(tmp.path());
    ASSERT_TRUE(made.ok()) << made.message();
    dir.emplace(std::move(made.value()));
    auto a = dir->PrepareAttempt(0, nproc);
    ASSERT_TRUE(a.ok()) << a.message();
    a0 = std::move(a.value());
  }
  void ReleaseAllAndWaitForTheBaseToGo(int nproc) {
    for (int r = 0; r < nproc; ++r) dir->ReleaseRank(0, r);
    ASSERT_TRUE(ctrun::testing::WaitFor([&] { return Entries(tmp.path()).empty(); }, std::chrono::seconds(10)));
  }
  TempDir tmp;
  std::optional<LogDir> dir;
  AttemptPaths a0;
};

// A cleanly finished rank's directory goes at once (on the release thread); once every rank of
// the attempt has, so do the attempt, the run directory and the base.
TEST_F(LogDirRelease, ReleasedRanksGoAtOnceAndTheWholeBaseWithTheLast) {
  ASSERT_NO_FATAL_FAILURE(Prepare(3));
  dir->ReleaseRank(0, 1);
  ASSERT_TRUE(ctrun::testing::WaitFor([&] { return !fs::exists(a0.ranks[1].dir); }, std::chrono::seconds(10)));
  EXPECT_EQ(Entries(a0.dir), (std::vector<std::string>{"0", "2"}));
  dir->ReleaseRank(0, 1);  // counted once
  dir->ReleaseRank(1, 0);  // not the current attempt: ignored
  dir->ReleaseRank(0, 3);  // no such rank: ignored
  EXPECT_TRUE(fs::is_directory(a0.ranks[0].dir));
  ASSERT_NO_FATAL_FAILURE(ReleaseAllAndWaitForTheBaseToGo(3));
  EXPECT_TRUE(dir->RemoveTemporaryBase().ok());  // what is gone reads as removed
  EXPECT_TRUE(Entries(tmp.path()).empty());
}

// A run whose base is kept after all gets every released directory back, empty and parents
// first; the tree made ahead stays gone (a kept run directory holds only attempts that ran).
TEST_F(LogDirRelease, RestoreReleasedMakesTheRemovedDirectoriesAgainButNotTheTreeMadeAhead) {
  ASSERT_NO_FATAL_FAILURE(Prepare(2));
  dir->MakeAhead(1, 2);
  ASSERT_NO_FATAL_FAILURE(ReleaseAllAndWaitForTheBaseToGo(2));
  ASSERT_TRUE(dir->RestoreReleased().ok());
  EXPECT_EQ(Entries(dir->run_dir()), (std::vector<std::string>{"attempt_0"}));
  EXPECT_EQ(Entries(a0.dir), (std::vector<std::string>{"0", "1"}));
  EXPECT_EQ(fs::status(dir->run_dir()).permissions() & fs::perms::all, fs::perms::owner_all);  // as mkdtemp made it
  EXPECT_TRUE(dir->RestoreReleased().ok());  // nothing more to do
  EXPECT_TRUE(dir->RemoveTemporaryBase().ok());
  EXPECT_TRUE(Entries(tmp.path()).empty());
}

// rmdir alone: a released rank whose directory holds a file (an error file of a worker that exited
// 0 anyway) keeps it, and the attempt, run directory and base above it stay too.
TEST_F(LogDirRelease, AReleasedRankDirectoryWithAFileInItStaysAndSoDoesEverythingAbove) {
  ASSERT_NO_FATAL_FAILURE(Prepare(2));
  std::ofstream(a0.ranks[0].error_file) << "{}";
  dir->ReleaseRank(0, 1);
  dir->ReleaseRank(0, 0);
  ASSERT_TRUE(dir->RestoreReleased().ok());  // settles the releases first
  EXPECT_EQ(Entries(a0.dir), (std::vector<std::string>{"0", "1"}));
  EXPECT_TRUE(fs::exists(a0.ranks[0].error_file));
  StatusOr<bool> removed = dir->RemoveTemporaryBase();  // a file is never removed: the base is kept
  ASSERT_TRUE(removed.ok()) << removed.message();
  EXPECT_FALSE(*removed);
  EXPECT_TRUE(fs::exists(a0.ranks[0].error_file));
  EXPECT_EQ(Entries(a0.dir), (std::vector<std::string>{"0", "1"}));
}

// Multi-node, a finished node may start another round: its next attempt finds the base, the run
// directory and the earlier attempt as they were before the releases.
TEST_F(LogDirRelease, TheNextAttemptAfterAReleasedOneRestoresTheTreeFirst) {
  ASSERT_NO_FATAL_FAILURE(Prepare(2));
  ASSERT_NO_FATAL_FAILURE(ReleaseAllAndWaitForTheBaseToGo(2));
  auto a1 = dir->PrepareAttempt(1, 2);
  ASSERT_TRUE(a1.ok()) << a1.message();
  EXPECT_EQ(Entries(dir->run_dir()), (std::vector<std::string>{"attempt_0", "attempt_1"}));
  EXPECT_EQ(Entries(a0.dir), (std::vector<std::string>{"0", "1"}));
  EXPECT_EQ(Entries(a1->dir), (std::vector<std::string>{"0", "1"}));
  dir->ReleaseRank(0, 0);  // an attempt that is over: ignored
  EXPECT_TRUE(dir->RestoreReleased().ok());
  EXPECT_TRUE(fs::is_directory(a0.ranks[0].dir));
}

// With --log_dir nothing is released: that tree is the user's, and kept.
TEST(LogDir, NothingIsReleasedUnderAGivenBase) {
  TempDir tmp;
  auto dir = LogDir::Create(tmp / "logs", "job");
  ASSERT_TRUE(dir.ok()) << dir.message();
  auto a0 = dir->PrepareAttempt(0, 1);
  ASSERT_TRUE(a0.ok()) << a0.message();
  dir->ReleaseRank(0, 0);
  ASSERT_TRUE(dir->RestoreReleased().ok());
  EXPECT_TRUE(fs::is_directory(a0->ranks[0].dir));
}

TEST(FileTail, LastLinesAndBytes) {
  EXPECT_EQ(LastLines("a\nb\nc\n", 2), "b\nc\n");
  EXPECT_EQ(LastLines("a\nb\nc", 2), "b\nc");
  EXPECT_EQ(LastLines("a\nb\n", 5), "a\nb\n");
  EXPECT_EQ(LastLines("", 5), "");
  TempDir tmp;
  std::string text;
  for (int i = 0; i < 1000; ++i) text += "line " + std::to_string(i) + "\n";
  std::ofstream(tmp / "err") << text << "Traceback: boom";
  EXPECT_EQ(ReadFileTail(tmp / "err", 8192, 3), "line 998\nline 999\nTraceback: boom");
  std::string small = ReadFileTail(tmp / "err", 20, 100);
  EXPECT_LE(small.size(), 20u);
  EXPECT_EQ(small.substr(small.size() - 15), "Traceback: boom");
  EXPECT_EQ(ReadFileTail(tmp / "missing"), "");
}

}  // namespace
}  // namespace ctrun::logs
