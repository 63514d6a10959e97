// Security checks: standalone listens on loopback only; a multi-node rendezvous store refuses
// clients without the job's token; workers never see the token; files and directories ctrun
// creates are never group/world-writable and honour the umask; a log dir or snapshot directory
// that is a symlink planted by another user in a sticky /tmp-like directory is not followed.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "ctrun/snapshot_store.h"
#include "helpers/ctrun_command.h"
#include "helpers/free_port.h"
#include "helpers/test_util.h"
#include "reliability/hygiene.h"

namespace ctrun::reliability {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using ctrun::testing::BackgroundProcess;
using ctrun::testing::Ctrun;
using ctrun::testing::ReadEnvFile;
using ctrun::testing::ReadFileOr;
using ctrun::testing::RunCommand;
using ctrun::testing::RunResult;
using ctrun::testing::SplitLines;
using ctrun::testing::TempDir;
using ctrun::testing::WaitFor;

// Socket inodes of pid's fds.
std::set<std::string> SocketInodes(pid_t pid) {
  std::set<std::string> out;
  for (const std::string& fd : OpenFds(pid)) (void)fd;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    std::error_code ec2;
    const std::string t = fs::read_symlink(e.path(), ec2).string();
    if (t.rfind("socket:[", 0) == 0) out.insert(t.substr(8, t.size() - 9));
  }
  return out;
}

// "local address (hex as in /proc/net/tcp*)" of every listening TCP socket among `inodes`.
std::vector<std::string> ListeningAddresses(const std::set<std::string>& inodes) {
  std::vector<std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    const auto lines = SplitLines(ReadFileOr(table));
    for (size_t i = 1; i < lines.size(); ++i) {
      std::istringstream in(lines[i]);
      std::string sl, local, remote, st, queues, tr, retr, uid, timeout, inode;
      in >> sl >> local >> remote >> st >> queues >> tr >> retr >> uid >> timeout >> inode;
      if (st == "0A" && inodes.count(inode)) out.push_back(local);
    }
  }
  return out;
}

bool IsLoopbackHex(const std::string& local) {
  const std::string addr = local.substr(0, local.find(':'));
  if (addr.size() == 8) return addr.substr(6, 2) == "7F";  // 127.x.x.x, little-endian hex
  return addr == "00000000000000000000000001000000";      // ::1
}

TEST(Security, StandaloneListensOnLoopbackOnly) {
  TempDir dir;
  const std::string marker = NewJobMarker();
  BackgroundProcess job(Ctrun({"--standalone", "--nproc_per_node=2"}, {"--env-file", dir / "env", "--wait-file", dir / "go"}),
                        {MarkerEnv(marker), "TMPDIR=" + dir.path()}, dir / "out", dir / "err");
  // Both ranks' files: rank 0's is read below, and the ranks write theirs in no set order.
  ASSERT_TRUE(WaitFor([&] {
    return !ReadEnvFile(dir / "env.0")["MASTER_PORT"].empty() && !ReadEnvFile(dir / "env.1")["MASTER_PORT"].empty();
  }, 20s)) << ReadFileOr(dir / "err");
  const auto listening = ListeningAddresses(SocketInodes(job.pid()));
  EXPECT_FALSE(listening.empty()) << "ctrun hosts the workers' store: it should listen";
  for (const std::string& l : listening) EXPECT_TRUE(IsLoopbackHex(l)) << "ctrun listens on " << l;
  EXPECT_EQ(ReadEnvFile(dir / "env.0")["MASTER_ADDR"], "127.0.0.1");
  std::ofstream(dir / "go").put('1');
  EXPECT_EQ(job.Wait(30s), 0) << ReadFileOr(dir / "err");
  EXPECT_EQ(WaitJobGone(marker), std::vector<pid_t>{});
}

bool ClosedWithin(int fd, std::chrono::milliseconds t) {
  return WaitFor(
      [&] {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 20) <= 0) return false;
        char b[64];
        const ssize_t n = ::read(fd, b, sizeof b);
        return n == 0 || (n < 0 && errno == ECONNRESET);
      },
      t);
}

std::vector<std::string> C10d(int port) {
  return {"--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:" + std::to_string(port),
          "--rdzv_id=sec", "--rdzv_conf=join_timeout=60,last_call_timeout=1", "--local_addr=127.0.0.1"};
}

TEST(Security, MultiNodeStoreRefusesClientsWithoutTheTokenAndWorkersNeverSeeIt) {
  TempDir dir;
  const std::string marker = NewJobMarker();
  const std::string token = "tok-" + NewJobMarker();
  const int port = ctrun::testing::FreePort();
  const std::vector<std::string> env{MarkerEnv(marker), "TMPDIR=" + dir.path(), "CTRUN_RDZV_TOKEN=" + token};
  BackgroundProcess a0(Ctrun(C10d(port), {"--env-file", dir / "env"}), env, dir / "a0.out", dir / "a0.err");
  ASSERT_TRUE(WaitFor([&] { int fd = ConnectLoopback(port); if (fd >= 0) ::close(fd); return fd >= 0; }, 20s));
  // No AUTH at all (a torch client), then a wrong token: both closed, both logged.
  const std::string legacy_set = std::string(1, '\0') + std::string("\x01\0\0\0\0\0\0\0k\x01\0\0\0\0\0\0\0v", 18);
  std::string wrong_auth = std::string(1, '\xF5') + std::string("CTRA", 4);
  const uint64_t len = 5;
  wrong_auth += std::string(reinterpret_cast<const char*>(&len), 8) + "wrong";
  for (const std::string& msg : {legacy_set, wrong_auth}) {
    const int fd = ConnectLoopback(port);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::send(fd, msg.data(), msg.size(), MSG_NOSIGNAL), static_cast<ssize_t>(msg.size()));
    EXPECT_TRUE(ClosedWithin(fd, 5s)) << "the rendezvous store kept a client without the token";
    ::close(fd);
  }
  ASSERT_TRUE(WaitFor([&] { return ReadFileOr(dir / "a0.err").find("wrong AUTH token") != std::string::npos; }, 5s));
  EXPECT_NE(ReadFileOr(dir / "a0.err").find("no AUTH token presented"), std::string::npos) << ReadFileOr(dir / "a0.err");
  // The second agent completes the job; neither worker's environment holds the token.
  BackgroundProcess a1(Ctrun(C10d(port), {"--env-file", dir / "env"}), env, dir / "a1.out", dir / "a1.err");
  EXPECT_EQ(a0.Wait(60s), 0) << ReadFileOr(dir / "a0.err");
  EXPECT_EQ(a1.Wait(60s), 0) << ReadFileOr(dir / "a1.err");
  for (int rank = 0; rank < 2; ++rank) {
    const std::string text = ReadFileOr(dir / ("env." + std::to_string(rank)));
    ASSERT_FALSE(text.empty()) << "rank " << rank << " wrote no environment";
    EXPECT_EQ(text.find(token), std::string::npos) << "rank " << rank << " sees the rendezvous token";
  }
  EXPECT_EQ(WaitJobGone(marker), std::vector<pid_t>{});
}

// Every file and directory under root with its mode.
std::vector<std::pair<std::string, mode_t>> Modes(const std::string& root) {
  std::vector<std::pair<std::string, mode_t>> out;
  for (const std::string& rel : TreeOf(root)) {
    struct stat st {};
    if (::lstat((root + "/" + rel).c_str(), &st) == 0 && !S_ISLNK(st.st_mode)) out.emplace_back(rel, st.st_mode & 07777);
  }
  return out;
}

TEST(Security, FilesCtrunCreatesAreNotGroupOrWorldWritableAndHonourTheUmask) {
  for (const mode_t mask : {mode_t{022}, mode_t{077}}) {
    TempDir dir;
    std::vector<std::string> argv{"/bin/sh", "-c", "umask " + std::to_string(mask == 022 ? 22 : 77) + "; exec \"$@\"", "sh"};
    for (const auto& a : Ctrun({"--standalone", "--nproc_per_node=2", "--max_restarts=1", "--log_dir", dir / "logs",
                                "--redirects=3"},
                               {"--print", "2", "--only-rank", "1", "--exit", "3", "--error-file", "boom"}))
      argv.push_back(a);
    RunResult r = RunCommand(argv, {"TMPDIR=" + dir.path()}, 60s);
    EXPECT_EQ(r.exit_code, 3) << r.err;
    const auto modes = Modes(dir / "logs");
    EXPECT_GT(modes.size(), 10u);
    for (const auto& [path, mode] : modes) {
      EXPECT_EQ(mode & 022, 0u) << path << " is group/world-writable: " << std::oct << mode;
      EXPECT_EQ(mode & mask, 0u) << path << " ignores umask " << std::oct << mask << ": " << mode;
    }
  }
}

// A sticky, world-writable directory (like /tmp) holding `name` -> target, a symlink owned by
// nobody (uid 65534): another user's trap.
struct PlantedLink {
  explicit PlantedLink(const TempDir& dir) : sticky(dir / "sticky"), target(dir / "victim") {
    fs::create_directories(sticky);
    fs::create_directories(target);
    ok = ::chmod(sticky.c_str(), 01777) == 0;
  }
  std::string Plant(const std::string& name) {
    const std::string link = sticky + "/" + name;
    if (::symlink(target.c_str(), link.c_str()) != 0 || ::lchown(link.c_str(), 65534, 65534) != 0) ok = false;
    return link;
  }
  std::string sticky, target;
  bool ok = false;
};

TEST(Security, LogDirSymlinkPlantedByAnotherUserIsNotFollowed) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make a symlink owned by another user";
  TempDir dir;
  PlantedLink trap(dir);
  const std::string link = trap.Plant("logs");
  ASSERT_TRUE(trap.ok);
  const std::string marker = NewJobMarker();
  RunResult r = RunCommand(Ctrun({"--standalone", "--log_dir", link}, {"--touch", dir.path()}),
                           {MarkerEnv(marker), "TMPDIR=" + dir.path()}, 30s);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("not followed"), std::string::npos) << r.err;
  EXPECT_EQ(DirEntries(trap.target), std::set<std::string>{}) << "ctrun wrote through the planted link";
  EXPECT_FALSE(fs::exists(dir / "0")) << "a worker started";
  // A planted TMPDIR (the default log dir's parent) is refused too.
  const std::string tmp_link = trap.Plant("tmp");
  RunResult t = RunCommand(Ctrun({"--standalone"}, {"--touch", dir.path()}), {MarkerEnv(marker), "TMPDIR=" + tmp_link}, 30s);
  EXPECT_EQ(t.exit_code, 1) << t.err;
  EXPECT_NE(t.err.find("not followed"), std::string::npos) << t.err;
  EXPECT_EQ(DirEntries(trap.target), std::set<std::string>{});
  // The same link made by root itself (the directory's owner) is the user's own: followed.
  const std::string own = dir / "sticky/own";
  ASSERT_EQ(::symlink(trap.target.c_str(), own.c_str()), 0);
  RunResult o = RunCommand(Ctrun({"--standalone", "--log_dir", own}, {}), {MarkerEnv(marker), "TMPDIR=" + dir.path()}, 30s);
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_EQ(WaitJobGone(marker), std::vector<pid_t>{});
}

TEST(Security, SnapshotDirSymlinkPlantedByAnotherUserIsNotFollowed) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to make a symlink owned by another user";
  TempDir dir;
  PlantedLink trap(dir);
  const std::string link = trap.Plant("snap");
  ASSERT_TRUE(trap.ok);
  ctrun::worker::SnapshotOptions o;
  o.dir = link + "/rank0";
  o.fsync = false;
  try {
    ctrun::worker::SnapshotStore store(o);
    ADD_FAILURE() << "SnapshotStore followed the planted link";
  } catch (const ctrun::worker::SnapshotError& e) {
    EXPECT_NE(std::string(e.what()).find("not followed"), std::string::npos) << e.what();
  }
  EXPECT_EQ(DirEntries(trap.target), std::set<std::string>{});
}

}  // namespace
}  // namespace ctrun::reliability
