// SnapshotStore: round trip, retention, corruption handling, async save, zstd, CRC32C.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "crc32c.h"
#include "ctrun/snapshot_store.h"
#include "helpers/test_util.h"
#include "atomic_file.h"
#include "worker/pattern.h"

namespace ctrun::worker {
namespace {

using ctrun::testing::Pattern;
using ctrun::testing::TempDir;

std::vector<std::byte> Bytes(const std::string& s) {
  std::vector<std::byte> v(s.size());
  std::memcpy(v.data(), s.data(), s.size());
  return v;
}

SnapshotOptions Opts(const std::string& dir, int keep = 3, int zstd = 0) {
  SnapshotOptions o;
  o.dir = dir;
  o.keep_last = keep;
  o.zstd_level = zstd;
  return o;
}

void Corrupt(const std::string& path, off_t offset) {
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  unsigned char c = 0;
  ASSERT_EQ(::pread(fd, &c, 1, offset), 1);
  c ^= 0x40;
  ASSERT_EQ(::pwrite(fd, &c, 1, offset), 1);
  ::close(fd);
}

// Runs fn in a forked child; its return value is the exit code. -1 when the child has not ended
// by the deadline (it is then killed): a call that blocks fails the test instead of hanging it.
int RunInChild(const std::function<int()>& fn, std::chrono::milliseconds timeout) {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(fn());
  if (pid < 0) return -1;
  int status = 0;
  if (!ctrun::testing::WaitFor([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, timeout)) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(Crc32c, KnownValuesAndHardwareMatchesSoftware) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  std::vector<std::byte> data = Pattern(7);
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{4095}, data.size()}) {
    EXPECT_EQ(crc32c(data.data(), n), crc32c_software(0, data.data(), n)) << n;
  }
  // Extending is concatenation.
  const uint32_t whole = crc32c(data.data(), 1000);
  EXPECT_EQ(crc32c_extend(crc32c(data.data(), 333), data.data() + 333, 667), whole);
}

TEST(SnapshotStore, EmptyDirectoryLoadsNothing) {
  TempDir dir;
  SnapshotStore store(Opts(dir / "snaps"));
  EXPECT_FALSE(store.load_latest().snapshot);
  EXPECT_TRUE(store.list_steps().empty());
  EXPECT_TRUE(std::filesystem::is_directory(dir / "snaps"));  // created
}

// Under strace: every directory the store creates is followed by an fsync of its parent.
TEST(SnapshotStore, CreatedDirectoriesAreFsyncedIntoTheirParents) {
  if (::access("/usr/bin/strace", X_OK) != 0) GTEST_SKIP() << "strace not installed";
  TempDir dir;
  const std::string root = std::filesystem::canonical(dir.path()).string();
  std::filesystem::create_directory(root + "/a");  // exists: must not need an fsync
  const std::string trace = root + "/trace";
  auto r = ctrun::testing::RunCommand({"/usr/bin/strace", "-f", "-qq", "-y", "-e", "trace=mkdir,mkdirat,fsync", "-o",
                                       trace, WORKER_HELPER, "snapshot-open", root + "/a/b/c/d"});
  if (r.exit_code != 0 && r.err.find("ptrace") != std::string::npos) GTEST_SKIP() << "no ptrace here: " << r.err;
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(std::filesystem::is_directory(root + "/a/b/c/d"));
  const std::vector<std::string> lines = ctrun::testing::SplitLines(ctrun::testing::ReadFileOr(trace));
  auto find_from = [&](size_t from, const std::string& a, const std::string& b) {
    for (size_t i = from; i < lines.size(); ++i)
      if (lines[i].find(a) != std::string::npos && lines[i].find(b) != std::string::npos) return i;
    return lines.size();
  };
  std::string all;
  for (const auto& l : lines) all += l + "\n";
  const std::vector<std::pair<std::string, std::string>> created{
      {root + "/a/b", root + "/a"}, {root + "/a/b/c", root + "/a/b"}, {root + "/a/b/c/d", root + "/a/b/c"}};
  for (const auto& [child, parent] : created) {
    const size_t made = find_from(0, "mkdir", "\"" + child + "\", 0777) = 0");
    ASSERT_LT(made, lines.size()) << child << " not created in:\n" << all;
    EXPECT_LT(find_from(made + 1, "fsync(", "<" + parent + ">) = 0"), lines.size())
        << parent << " not fsync'ed after creating " << child << " in:\n" << all;
  }
  EXPECT_EQ(find_from(0, "fsync(", "<" + root + ">"), lines.size()) << "an existing parent fsync'ed:\n" << all;
}

TEST(SnapshotStore, RoundTripAndNewestWins) {
  TempDir dir;
  SnapshotStore store(Opts(dir.path()));
  store.save(5, Bytes("five"));
  store.save(9, Bytes("nine"));
  store.save(12, Bytes("twelve"));  // (saved after 9: a save of 9 would supersede 12)
  LoadResult r = store.load_latest();
  ASSERT_TRUE(r.snapshot);
  EXPECT_EQ(r.snapshot->step, 12u);
  EXPECT_EQ(r.snapshot->data, Bytes("twelve"));
  EXPECT_TRUE(r.skipped.empty());
  auto nine = store.load(9);
  ASSERT_TRUE(nine);
  EXPECT_EQ(nine->data, Bytes("nine"));
  EXPECT_FALSE(store.load(10));
  EXPECT_EQ(store.load_latest(11).snapshot->step, 9u);  // bounded search
  EXPECT_FALSE(store.load_latest(4).snapshot);
  store.save(13, std::vector<std::byte>{});  // empty payload is legal
  EXPECT_TRUE(store.load(13)->data.empty());
}

TEST(SnapshotStore, KeepsOnlyTheLastK) {
  TempDir dir;
  SnapshotStore store(Opts(dir.path(), 2));
  for (uint64_t s = 1; s <= 6; ++s) store.save(s * 10, Bytes("s" + std::to_string(s)));
  EXPECT_EQ(store.list_steps(), (std::vector<uint64_t>{50, 60}));
}

TEST(SnapshotStore, ASaveSupersedesHigherStepsAndNeverRemovesItself) {
  TempDir dir;
  {
    SnapshotStore earlier(Opts(dir.path(), 2));  // a longer earlier run in the same directory
    earlier.save(40, Bytes("forty"));
    earlier.save(50, Bytes("fifty"));
  }
  SnapshotStore store(Opts(dir.path(), 2));  // a fresh start there
  const std::string path = store.save(10, Bytes("ten"));
  EXPECT_EQ(path, store.path_for(10));
  EXPECT_TRUE(std::filesystem::exists(path));
  EXPECT_EQ(store.list_steps(), std::vector<uint64_t>{10});  // 40 and 50: its abandoned future
  LoadResult r = store.load_latest();
  ASSERT_TRUE(r.snapshot);
  EXPECT_EQ(r.snapshot->step, 10u);
  EXPECT_EQ(r.snapshot->data, Bytes("ten"));
  store.save(20, Bytes("twenty"));
  store.save(30, Bytes("thirty"));
  EXPECT_EQ(store.list_steps(), (std::vector<uint64_t>{20, 30}));
  // A resume from 20 (say the other ranks lack 30), then the next save: 30 goes, 20 stays.
  store.save(25, Bytes("twenty-five"));
  EXPECT_EQ(store.list_steps(), (std::vector<uint64_t>{20, 25}));
  EXPECT_EQ(store.load_latest().snapshot->data, Bytes("twenty-five"));
  // Async saves follow the same rule; so does keep_last = 1 (only the new one stays).
  store.save_async(21, Bytes("twenty-one"));
  store.wait();
  EXPECT_EQ(store.list_steps(), (std::vector<uint64_t>{20, 21}));
  SnapshotStore one(Opts(dir.path(), 1));
  one.save(3, Bytes("three"));
  EXPECT_EQ(one.list_steps(), std::vector<uint64_t>{3});
  EXPECT_EQ(one.load_latest().snapshot->data, Bytes("three"));
}

TEST(SnapshotStore, RetentionCountsOnlyValidSnapshots) {
  TempDir dir;
  TempDir other;
  SnapshotStore store(Opts(dir.path(), 2));
  store.save(10, Bytes("ten"));
  // Names that are not valid snapshots, all newer than 10: garbage, a copy of 10 (its header
  // names step 10), a broken symlink, a directory and a FIFO.
  std::ofstream(store.path_for(20)) << "not a snapshot at all, but long enough to have a header..................";
  std::filesystem::copy_file(store.path_for(10), store.path_for(24));
  std::filesystem::create_symlink(other / "gone.ctsnap", store.path_for(21));
  std::filesystem::create_directory(store.path_for(22));
  ASSERT_EQ(::mkfifo(store.path_for(23).c_str(), 0644), 0);
  store.save(30, Bytes("thirty"));
  // keep_last = 2 valid ones: 30 and 10. The invalid names between them do not count and stay.
  EXPECT_EQ(store.list_steps(), (std::vector<uint64_t>{10, 20, 21, 22, 23, 24, 30}));
  ASSERT_TRUE(store.load(10));
  EXPECT_EQ(store.load(10)->data, Bytes("ten"));
  // A torn newest older one does not count either: 30 is the second valid one, and everything
  // below it goes but the directory.
  store.save(35, Bytes("thirty-five"));
  std::filesystem::resize_file(store.path_for(35), 64 + 3);
  store.save(40, Bytes("forty"));
  EXPECT_EQ(store.list_steps(), (std::vector<uint64_t>{22, 30, 35, 40}));
  LoadResult r = store.load_latest(39);
  ASSERT_TRUE(r.snapshot);
  EXPECT_EQ(r.snapshot->step, 30u);
  EXPECT_EQ(r.snapshot->data, Bytes("thirty"));
}

TEST(SnapshotStore, SkipsCorruptAndTornFilesAndFallsBack) {
  TempDir dir;
  SnapshotStore store(Opts(dir.path(), 10));
  for (uint64_t s = 1; s <= 5; ++s) store.save(s, Pattern(s));
  Corrupt(store.path_for(5), 64 + 1000);        // payload bit flip
  Corrupt(store.path_for(4), 20);               // header bit flip
  std::filesystem::resize_file(store.path_for(3), 64 + 100);  // torn (truncated) file
  // A file whose header is valid but names another step (copied over).
  std::filesystem::copy_file(store.path_for(1), store.path_for(6));
  LoadResult r = store.load_latest();
  ASSERT_TRUE(r.snapshot);
  EXPECT_EQ(r.snapshot->step, 2u);
  EXPECT_EQ(r.snapshot->data, Pattern(2));
  ASSERT_EQ(r.skipped.size(), 4u);
  EXPECT_NE(r.skipped[0].find("header step"), std::string::npos) << r.skipped[0];
  EXPECT_NE(r.skipped[1].find("payload checksum"), std::string::npos) << r.skipped[1];
  EXPECT_NE(r.skipped[2].find("header checksum"), std::string::npos) << r.skipped[2];
  EXPECT_NE(r.skipped[3].find("length mismatch"), std::string::npos) << r.skipped[3];
  // Loads never delete evidence.
  EXPECT_EQ(store.list_steps().size(), 6u);
  // Garbage and truncated-header files.
  std::ofstream(store.path_for(7)) << "not a snapshot at all, but long enough to have a header..................";
  std::ofstream(store.path_for(8)) << "short";
  r = store.load_latest();
  EXPECT_EQ(r.snapshot->step, 2u);
  EXPECT_NE(r.skipped[0].find("truncated header"), std::string::npos) << r.skipped[0];
  EXPECT_NE(r.skipped[1].find("bad magic"), std::string::npos) << r.skipped[1];
}

TEST(SnapshotStore, SkipsNamesThatAreNotRegularFilesWithoutBlocking) {
  TempDir dir;
  TempDir other;
  SnapshotStore store(Opts(dir.path(), 10));
  store.save(5, Bytes("five"));
  ASSERT_EQ(::mkfifo(store.path_for(9).c_str(), 0644), 0);  // a plain open() blocks on it forever
  std::filesystem::create_directory(store.path_for(8));
  // A link to a valid snapshot of the same step elsewhere: never followed.
  SnapshotStore elsewhere(Opts(other.path()));
  elsewhere.save(7, Bytes("seven"));
  std::filesystem::create_symlink(elsewhere.path_for(7), store.path_for(7));
  // First prove in a child that neither load blocks, then check the results here.
  const int rc = RunInChild([&] {
    (void)store.load(9);
    (void)store.load_latest();
    return 0;
  }, std::chrono::seconds(30));
  ASSERT_EQ(rc, 0) << "a load blocked on the FIFO (or died)";
  EXPECT_FALSE(store.load(9));
  EXPECT_FALSE(store.load(7));
  LoadResult r = store.load_latest();
  ASSERT_TRUE(r.snapshot);
  EXPECT_EQ(r.snapshot->step, 5u);
  EXPECT_EQ(r.snapshot->data, Bytes("five"));
  ASSERT_EQ(r.skipped.size(), 3u);
  EXPECT_NE(r.skipped[0].find("not a regular file (FIFO)"), std::string::npos) << r.skipped[0];
  EXPECT_NE(r.skipped[1].find("not a regular file (directory)"), std::string::npos) << r.skipped[1];
  EXPECT_NE(r.skipped[2].find("symbolic link, not followed"), std::string::npos) << r.skipped[2];
  EXPECT_EQ(r.skipped[0].rfind(store.path_for(9) + ": ", 0), 0u) << r.skipped[0];
  // Loads leave them in place, like any other rejected file.
  EXPECT_EQ(store.list_steps(), (std::vector<uint64_t>{5, 7, 8, 9}));
}

// A pid that no process has: a child we have reaped.
pid_t DeadPid() {
  pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  if (dead > 0) ::waitpid(dead, nullptr, 0);
  return dead;
}

std::string TempName(uint64_t step, const std::string& writer) {
  char name[64];
  std::snprintf(name, sizeof name, ".tmp-snapshot-%020llu.ctsnap-", static_cast<unsigned long long>(step));
  return name + writer;
}

void MakeOld(const std::string& path) {
  struct timespec times[2] = {};
  times[0].tv_sec = times[1].tv_sec = ::time(nullptr) - 2 * 3600;
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0) << path;
}

TEST(SnapshotStore, IgnoresTempFilesAndRemovesThoseOfDeadWriters) {
  TempDir dir;
  { SnapshotStore store(Opts(dir.path())); store.save(1, Bytes("one")); }
  const pid_t dead = DeadPid();
  ASSERT_GT(dead, 0);
  const std::string host = temp_host_token();
  const std::string stale = dir / TempName(2, host + "-" + std::to_string(dead) + "-0");
  const std::string live = dir / TempName(3, host + "-" + std::to_string(::getppid()) + "-0");
  std::ofstream(stale) << "partial";
  std::ofstream(live) << "partial";
  SnapshotStore store(Opts(dir.path()));
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_TRUE(std::filesystem::exists(live));  // its writer may still be running
  EXPECT_EQ(store.load_latest().snapshot->step, 1u);
  EXPECT_EQ(store.list_steps(), std::vector<uint64_t>{1});
}

// A shared filesystem: the pid in another host's temp name is not ours to check (an evaluator on
// another node opening a rank's store must not remove the rank's save in flight). Such a temp,
// and one of the older name without a host, goes only once unmodified for an hour.
TEST(SnapshotStore, TempFilesOfOtherHostsGoOnlyWhenOld) {
  TempDir dir;
  const pid_t dead = DeadPid();
  ASSERT_GT(dead, 0);
  const std::string pid = std::to_string(dead);
  const std::string other = temp_host_token() + "-other-7";  // dashes and digits in a host name
  const std::string fresh_other = dir / TempName(2, other + "-" + pid + "-0");
  const std::string old_other = dir / TempName(3, other + "-" + pid + "-1");
  const std::string fresh_legacy = dir / TempName(4, pid + "-2");
  const std::string old_legacy = dir / TempName(5, pid + "-3");
  for (const auto& p : {fresh_other, old_other, fresh_legacy, old_legacy}) std::ofstream(p) << "partial";
  MakeOld(old_other);
  MakeOld(old_legacy);
  SnapshotStore store(Opts(dir.path()));
  EXPECT_TRUE(std::filesystem::exists(fresh_other));
  EXPECT_TRUE(std::filesystem::exists(fresh_legacy));
  EXPECT_FALSE(std::filesystem::exists(old_other));
  EXPECT_FALSE(std::filesystem::exists(old_legacy));
}

// kill(pid, 0) fails with EPERM for a live process of another user: its writer is alive.
TEST(SnapshotStore, TheTempFileOfALiveWriterOfAnotherUserIsKept) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (a live process of another user than the store's)";
  TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0777), 0);  // nobody may remove what it likes in there
  const std::string live = dir / TempName(2, temp_host_token() + "-" + std::to_string(::getpid()) + "-0");
  std::ofstream(live) << "partial";
  constexpr int kSkip = 77;
  const int rc = RunInChild([&] {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) return kSkip;
    if (::kill(::getppid(), 0) == 0 || errno != EPERM) return kSkip;
    SnapshotStore store(Opts(dir.path()));
    return 0;
  }, std::chrono::seconds(30));
  if (rc == kSkip) GTEST_SKIP() << "cannot become nobody here";
  ASSERT_EQ(rc, 0);
  EXPECT_TRUE(std::filesystem::exists(live));
}

// A container restarted in a fresh pid namespace: the rank's new process often has the pid of
// the one that was killed mid-save. Its temp file is a dead writer's all the same (this process
// writes nothing yet), and the first save of the same step does not trip over its name.
TEST(SnapshotStore, ATempFileOfADeadWriterWithOurPidIsRemovedAndNotInTheWay) {
  TempDir dir;
  const std::string ours = temp_host_token() + "-" + std::to_string(::getpid());
  std::vector<std::string> stale;
  for (int n = 0; n < 8; ++n) stale.push_back(dir / TempName(4, ours + "-" + std::to_string(n)));
  for (const auto& s : stale) std::ofstream(s) << "partial";
  SnapshotStore store(Opts(dir.path()));
  for (const auto& s : stale) EXPECT_FALSE(std::filesystem::exists(s)) << s;
  for (const auto& s : stale) std::ofstream(s) << "partial";  // and if they came back meanwhile
  store.save(4, Bytes("four"));
  EXPECT_EQ(store.load_latest().snapshot->step, 4u);
}

TEST(AtomicFile, TempNamesCarryTheHostAndParseFromTheRight) {
  const std::string& host = temp_host_token();
  ASSERT_FALSE(host.empty());
  for (char c : host) EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-') << host;
  char name[256] = {};
  ASSERT_EQ(::gethostname(name, sizeof name - 1), 0);
  if (std::string(name).find_first_not_of(
          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") == std::string::npos &&
      name[0] != '\0') {
    EXPECT_EQ(host, name);
  }
  auto w = parse_temp_writer("node-12-345-6");
  ASSERT_TRUE(w);
  EXPECT_EQ(w->host, "node-12");
  EXPECT_EQ(w->pid, 345);
  w = parse_temp_writer("345-6");  // the older form, without a host
  ASSERT_TRUE(w);
  EXPECT_EQ(w->host, "");
  EXPECT_EQ(w->pid, 345);
  for (const char* bad : {"", "6", "node-6", "node-x-6", "node-345-", "node-345-6x", "node-0-6", "node-+1-6"})
    EXPECT_FALSE(parse_temp_writer(bad)) << bad;
  // The name write_file_atomic uses: its error text names the temp file (here a write refused
  // by RLIMIT_FSIZE, in a child).
  TempDir dir;
  const std::string err_file = dir / "err";
  const int rc = RunInChild([&] {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit old {};
    if (::getrlimit(RLIMIT_FSIZE, &old) != 0) return 1;
    rlimit none = old;
    none.rlim_cur = 0;
    if (::setrlimit(RLIMIT_FSIZE, &none) != 0) return 1;
    const std::string data = "{}";
    const std::string err = write_file_atomic(dir / "error.json", {{data.data(), data.size()}});
    if (::setrlimit(RLIMIT_FSIZE, &old) != 0) return 1;
    const int fd = ::open(err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    return fd >= 0 && ::write(fd, err.data(), err.size()) >= 0 ? 0 : 2;
  }, std::chrono::seconds(30));
  ASSERT_EQ(rc, 0);
  const std::string err = ctrun::testing::ReadFileOr(err_file);
  EXPECT_NE(err.find("/.tmp-error.json-" + host + "-"), std::string::npos) << err;
}

// The atomic write never replaces what is not a file: a FIFO (or /dev/null, as root) at the
// path is refused and stays what it was.
TEST(AtomicFile, ANonRegularFileAtThePathIsRefusedNotReplaced) {
  TempDir dir;
  const std::string fifo = dir / "error.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string data = "{}";
  const std::string err = write_file_atomic(fifo, {{data.data(), data.size()}});
  EXPECT_NE(err.find("not a regular file"), std::string::npos) << err;
  struct stat st {};
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), std::filesystem::directory_iterator{}), 1)
      << "a temp file was left";
}

// The names in a directory, sorted.
std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Puts write_file_atomic's test switches back to their defaults, and the umask back, at scope end.
struct HooksReset {
  mode_t umask_before = ::umask(0022);
  ~HooksReset() {
    atomic_write_test_hooks = {};
    ::umask(umask_before);
  }
};

// Runs write_file_atomic(path, "new") in a forked child whose hook kills it with SIGKILL once the
// data is written, before the file is named; true when the child died of that signal.
bool KilledMidWrite(const std::string& path, bool named_temp_only) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    atomic_write_test_hooks.named_temp_only = named_temp_only;
    atomic_write_test_hooks.before_name = [](const std::string&) { ::raise(SIGKILL); };
    const std::string data(1 << 20, 'n');
    (void)write_file_atomic(path, {{data.data(), data.size()}});
    ::_exit(3);  // not reached
  }
  if (pid < 0) return false;
  int status = 0;
  if (!ctrun::testing::WaitFor([&] { return ::waitpid(pid, &status, WNOHANG) == pid; }, std::chrono::seconds(30))) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
    return false;
  }
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
}

// A writer killed while it writes (the long part: a large snapshot) leaves nothing behind: its
// data is in an unnamed file until the end. Only the named-temp fallback leaves its temp file
// (for the snapshot store's start-up to remove).
TEST(AtomicFile, AWriterKilledMidWriteLeavesNoTempFile) {
  TempDir dir;
  const std::string path = dir / "error.json";
  std::ofstream(path) << "old";
  ASSERT_TRUE(KilledMidWrite(path, /*named_temp_only=*/false));
  EXPECT_EQ(Names(dir.path()), std::vector<std::string>{"error.json"});
  EXPECT_EQ(ctrun::testing::ReadFileOr(path), "old");

  ASSERT_TRUE(KilledMidWrite(path, /*named_temp_only=*/true));
  const std::vector<std::string> names = Names(dir.path());
  ASSERT_EQ(names.size(), 2u);
  EXPECT_EQ(names[0].rfind(std::string(kTempPrefix) + "error.json-" + temp_host_token() + "-", 0), 0u) << names[0];
  EXPECT_EQ(ctrun::testing::ReadFileOr(path), "old");
}

// Every way of writing gives the same file: the unnamed file (named by linkat(AT_EMPTY_PATH) or
// through /proc/self/fd) and the named-temp fallback. The mode is 0644 less the umask, as the
// named temp file's; the temp name is in flight before it exists, and nothing is left over.
TEST(AtomicFile, UnnamedAndNamedTempWritesGiveTheSameFile) {
  struct Way {
    const char* what;
    bool named_temp_only;
    bool link_through_proc;
  };
  static bool named_at_hook = false;
  static bool in_flight_at_hook = false;
  static std::string tmp_at_hook;
  for (const Way way : {Way{"unnamed, AT_EMPTY_PATH", false, false}, Way{"unnamed, /proc/self/fd", false, true},
                        Way{"named temp", true, false}}) {
    SCOPED_TRACE(way.what);
    HooksReset reset;
    ::umask(027);
    TempDir dir;
    const std::string path = dir / "summary.json";
    std::ofstream(path) << "old";
    ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
    atomic_write_test_hooks.named_temp_only = way.named_temp_only;
    atomic_write_test_hooks.link_through_proc = way.link_through_proc;
    atomic_write_test_hooks.before_name = [](const std::string& tmp) {
      tmp_at_hook = tmp;
      named_at_hook = ::access(tmp.c_str(), F_OK) == 0;
      in_flight_at_hook = temp_in_flight(tmp);
    };
    const std::string head = "new ";
    const std::string tail(100000, 't');
    ASSERT_EQ(write_file_atomic(path, {{head.data(), head.size()}, {tail.data(), tail.size()}}), "");
    EXPECT_EQ(ctrun::testing::ReadFileOr(path), head + tail);
    EXPECT_EQ(Names(dir.path()), std::vector<std::string>{"summary.json"});
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0640u);
    EXPECT_EQ(tmp_at_hook.rfind(dir / (std::string(kTempPrefix) + "summary.json-" + temp_host_token() + "-"), 0), 0u)
        << tmp_at_hook;
    EXPECT_EQ(named_at_hook, way.named_temp_only) << "the temp file has a name only in the fallback";
    EXPECT_TRUE(in_flight_at_hook);
    EXPECT_FALSE(temp_in_flight(tmp_at_hook));
  }
}

// A dead writer's temp names with our pid (a restarted container's fresh pid namespace) are
// stepped over by the unnamed file's link as by the named temp file's creation, and left alone.
TEST(AtomicFile, TheUnnamedFileStepsOverADeadWritersTempNames) {
  HooksReset reset;
  TempDir dir;
  const std::string path = dir / "error.json";
  static std::string tmp_at_hook;
  atomic_write_test_hooks.before_name = [](const std::string& tmp) { tmp_at_hook = tmp; };
  atomic_write_test_hooks.named_temp_only = true;  // a first write shows the number reached
  ASSERT_EQ(write_file_atomic(path, {{"one", 3}}), "");
  const size_t dash = tmp_at_hook.rfind('-');
  ASSERT_NE(dash, std::string::npos);
  const unsigned long n = std::stoul(tmp_at_hook.substr(dash + 1));
  std::vector<std::string> stale;
  for (unsigned long k = n + 1; k <= n + 8; ++k) stale.push_back(tmp_at_hook.substr(0, dash + 1) + std::to_string(k));
  for (const auto& s : stale) std::ofstream(s) << "partial";
  atomic_write_test_hooks.named_temp_only = false;
  tmp_at_hook.clear();
  ASSERT_EQ(write_file_atomic(path, {{"two", 3}}), "");
  EXPECT_EQ(tmp_at_hook, stale[0]);
  EXPECT_EQ(ctrun::testing::ReadFileOr(path), "two");
  for (const auto& s : stale) EXPECT_EQ(ctrun::testing::ReadFileOr(s), "partial") << s;
  EXPECT_EQ(Names(dir.path()).size(), stale.size() + 1);
}

TEST(SnapshotStore, AsyncSaveIsDurableAfterWaitAndKeepsOrder) {
  TempDir dir;
  SnapshotStore store(Opts(dir.path(), 3));
  for (uint64_t s = 1; s <= 8; ++s) {
    std::vector<std::byte> buf = Pattern(s);
    store.save_async(s, std::move(buf));  // returns while the write runs; waits if one is in flight
  }
  store.wait();
  EXPECT_FALSE(store.busy());
  EXPECT_EQ(store.take_buffer(), Pattern(8));  // the last written buffer comes back for reuse
  EXPECT_TRUE(store.take_buffer().empty());
  EXPECT_EQ(store.list_steps(), (std::vector<uint64_t>{6, 7, 8}));
  EXPECT_EQ(store.load_latest().snapshot->data, Pattern(8));
  // A sync save after async ones waits for them first.
  store.save_async(9, Pattern(9));
  store.save(10, Bytes("ten"));
  EXPECT_EQ(store.list_steps(), (std::vector<uint64_t>{8, 9, 10}));
}

TEST(SnapshotStore, AsyncErrorSurfacesOnWait) {
  TempDir dir;
  SnapshotStore store(Opts(dir / "d"));
  std::filesystem::remove_all(dir / "d");  // the background write will fail to create its temp file
  store.save_async(1, Bytes("x"));
  EXPECT_THROW(store.wait(), SnapshotError);
  store.wait();  // the error is reported once
}

// A background thread that cannot start (clone() fails with EAGAIN under a pids limit, here
// RLIMIT_NPROC) makes save_async throw SnapshotError and leaves the store usable: the next
// save_async starts the thread and its save completes, and wait() and the destructor return.
// RLIMIT_NPROC does not bind root, so the child first becomes nobody.
TEST(SnapshotStore, AWriterThreadThatCannotStartIsReportedAndTheStoreStaysUsable) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to become nobody (RLIMIT_NPROC does not bind root)";
  TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0777), 0);
  constexpr int kSkip = 77;
  std::string message;  // the child's exception text, for the failure message
  const std::string message_file = dir / "message";
  const int rc = RunInChild([&] {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) return kSkip;
    SnapshotStore store(Opts(dir / "snaps"));
    rlimit old {};
    if (::getrlimit(RLIMIT_NPROC, &old) != 0) return 10;
    rlimit none = old;
    none.rlim_cur = 0;
    if (::setrlimit(RLIMIT_NPROC, &none) != 0) return 11;
    try {
      store.save_async(1, Bytes("one"));
      return kSkip;  // the limit did not bind here
    } catch (const SnapshotError& e) {
      std::ofstream(message_file) << e.what();
    } catch (...) {
      return 12;  // not a SnapshotError
    }
    if (::setrlimit(RLIMIT_NPROC, &old) != 0) return 13;
    if (store.busy()) return 14;
    store.save_async(2, Bytes("two"));  // blocked for ever when the failed writer was kept
    store.wait();
    auto r = store.load_latest();
    if (!r.snapshot || r.snapshot->step != 2 || store.list_steps() != std::vector<uint64_t>{2}) return 15;
    store.save_async(3, Bytes("three"));
    return 0;  // the destructor waits for 3
  }, std::chrono::seconds(60));
  if (rc == kSkip) GTEST_SKIP() << "cannot become nobody, or RLIMIT_NPROC does not bind here";
  message = ctrun::testing::ReadFileOr(message_file);
  ASSERT_EQ(rc, 0) << "child failed or blocked (-1); exception text: " << message;
  EXPECT_NE(message.find("cannot start the background writer thread"), std::string::npos) << message;
  SnapshotStore store(Opts(dir / "snaps"));
  EXPECT_EQ(store.load_latest().snapshot->step, 3u);
}

TEST(SnapshotStore, ZstdRoundTripCompresses) {
  if (!snapshot_compression_available()) GTEST_SKIP() << "built without zstd";
  TempDir dir;
  SnapshotStore store(Opts(dir.path(), 3, /*zstd=*/3));
  std::vector<std::byte> data(4u << 20);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>((i / 64) % 7);
  store.save(1, data);
  EXPECT_LT(std::filesystem::file_size(store.path_for(1)), data.size() / 10);
  EXPECT_EQ(store.load_latest().snapshot->data, data);
  // A raw store reads compressed files too (the flag is per file).
  SnapshotStore raw(Opts(dir.path()));
  EXPECT_EQ(raw.load(1)->data, data);
  // Corruption inside the compressed payload is caught by the checksum.
  Corrupt(store.path_for(1), 64 + 10);
  EXPECT_FALSE(store.load(1));
}

// A crafted compressed snapshot: valid checksums, and a zstd frame whose content size (and the
// header's raw length) is ~8 GiB, the most the length bound allows for its 256 KiB, while it
// holds 256 KiB (two raw blocks). A load rejects it and falls back without allocating what it
// claims: it runs in a child whose address space may grow by 256 MiB only.
TEST(SnapshotStore, ACraftedZstdLengthIsRejectedWithoutAllocatingIt) {
  if (!snapshot_compression_available()) GTEST_SKIP() << "built without zstd";
  TempDir dir;
  SnapshotStore store(Opts(dir.path()));
  store.save(1, Bytes("one"));
  constexpr size_t kBlock = 128 << 10;
  // Frame: magic; descriptor 0xC0 (8-byte content size, a window descriptor, no checksum);
  // window 2^17; the content size; then raw blocks (3-byte header: size << 3 | type 0 | last).
  std::vector<unsigned char> frame = {0x28, 0xB5, 0x2F, 0xFD, 0xC0, 0x38};
  const size_t stored_len = frame.size() + 8 + 2 * (3 + kBlock);
  const uint64_t claimed = (stored_len / 4 + 1) * kBlock;
  for (int i = 0; i < 8; ++i) frame.push_back(static_cast<unsigned char>(claimed >> (8 * i)));
  const std::vector<std::byte> content = Pattern(3);
  for (int b = 0; b < 2; ++b) {
    const uint32_t block_header = static_cast<uint32_t>(kBlock << 3) | (b == 1 ? 1u : 0u);
    for (int i = 0; i < 3; ++i) frame.push_back(static_cast<unsigned char>(block_header >> (8 * i)));
    for (size_t i = 0; i < kBlock; ++i) frame.push_back(static_cast<unsigned char>(content[i % content.size()]));
  }
  ASSERT_EQ(frame.size(), stored_len);
  unsigned char h[64] = {};
  auto put = [&](size_t off, auto v) { std::memcpy(h + off, &v, sizeof v); };
  std::memcpy(h, "CTSNAP01", 8);
  put(8, uint32_t{1});   // version
  put(12, uint32_t{1});  // flags: zstd
  put(16, uint64_t{2});  // step
  put(24, uint64_t{stored_len});
  put(32, uint64_t{claimed});
  put(48, crc32c(frame.data(), frame.size()));
  put(56, crc32c(h, 56));
  {
    std::ofstream f(store.path_for(2), std::ios::binary);
    f.write(reinterpret_cast<const char*>(h), 64);
    f.write(reinterpret_cast<const char*>(frame.data()), static_cast<std::streamsize>(frame.size()));
  }
  const std::string out = dir / "out";
  const int rc = RunInChild([&] {
    // The address space may grow by 256 MiB from here (VmSize, in kB, from /proc/self/status).
    unsigned long long vm_kb = 0;
    for (const std::string& l : ctrun::testing::SplitLines(ctrun::testing::ReadFileOr("/proc/self/status")))
      if (l.rfind("VmSize:", 0) == 0) vm_kb = std::stoull(l.substr(7));
    if (vm_kb == 0) return 10;
    const rlimit as{(vm_kb << 10) + (256ull << 20), RLIM_INFINITY};
    if (::setrlimit(RLIMIT_AS, &as) != 0) return 11;
    std::string text;
    try {
      LoadResult r = store.load_latest();
      text = (r.snapshot ? std::to_string(r.snapshot->step) : std::string("none")) + "\n";
      for (const auto& why : r.skipped) text += why + "\n";
    } catch (const std::exception& e) {
      text = std::string("threw: ") + e.what() + "\n";
    }
    const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    return fd >= 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) ? 0 : 12;
  }, std::chrono::seconds(60));
  ASSERT_EQ(rc, 0);
  const std::vector<std::string> lines = ctrun::testing::SplitLines(ctrun::testing::ReadFileOr(out));
  ASSERT_EQ(lines.size(), 2u) << ctrun::testing::ReadFileOr(out);
  EXPECT_EQ(lines[0], "1");
  // zstd itself notices the frame ending short of its content size.
  EXPECT_EQ(lines[1].rfind(store.path_for(2) + ": zstd: ", 0), 0u) << lines[1];
}

TEST(SnapshotStore, RejectsBadOptions) {
  TempDir dir;
  EXPECT_THROW(SnapshotStore(Opts("")), SnapshotError);
  EXPECT_THROW(SnapshotStore(Opts(dir.path(), 0)), SnapshotError);
}

}  // namespace
}  // namespace ctrun::worker
