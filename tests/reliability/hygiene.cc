#include "reliability/hygiene.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "helpers/test_util.h"

namespace ctrun::reliability {
namespace fs = std::filesystem;
using ctrun::testing::ReadFileOr;

namespace {

std::vector<pid_t> AllPids() {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    long v = std::strtol(e->d_name, &end, 10);
    if (end && *end == '\0' && v > 0) out.push_back(static_cast<pid_t>(v));
  }
  ::closedir(d);
  return out;
}

// (state, ppid) from /proc/pid/stat; state 0 when gone.
std::pair<char, pid_t> StateOf(pid_t pid) {
  const std::string stat = ReadFileOr("/proc/" + std::to_string(pid) + "/stat");
  const auto close = stat.rfind(')');
  char state = 0;
  int ppid = 0;
  if (close == std::string::npos || std::sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid) != 2) return {0, 0};
  return {state, ppid};
}

long StatusField(pid_t pid, const std::string& key) {
  std::istringstream in(ReadFileOr("/proc/" + std::to_string(pid) + "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::strtol(line.c_str() + key.size() + 1, nullptr, 10);
  }
  return -1;
}

}  // namespace

std::string NewJobMarker() {
  static std::atomic<int> counter{0};
  std::random_device rd;
  return std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" + std::to_string(rd());
}

std::string MarkerEnv(const std::string& marker) { return std::string(kMarkerVar) + "=" + marker; }

std::vector<pid_t> ProcessesOfJob(const std::string& marker) {
  const std::string needle = MarkerEnv(marker);
  std::vector<pid_t> out;
  for (pid_t pid : AllPids()) {
    if (pid == ::getpid()) continue;
    // environ is NUL-separated; a zombie's is empty, so zombies are found through their parent below.
    const std::string env = ReadFileOr("/proc/" + std::to_string(pid) + "/environ");
    size_t pos = 0;
    while (pos < env.size()) {
      size_t end = env.find('\0', pos);
      if (end == std::string::npos) end = env.size();
      if (env.compare(pos, end - pos, needle) == 0) {
        out.push_back(pid);
        break;
      }
      pos = end + 1;
    }
  }
  return out;
}

std::vector<pid_t> WaitJobGone(const std::string& marker, int timeout_ms) {
  std::vector<pid_t> left;
  ctrun::testing::WaitFor(
      [&] {
        left = ProcessesOfJob(marker);
        return left.empty();
      },
      std::chrono::milliseconds(timeout_ms));
  return left;
}

std::vector<pid_t> ZombieChildren(pid_t parent) {
  std::vector<pid_t> out;
  for (pid_t pid : AllPids()) {
    auto [state, ppid] = StateOf(pid);
    if (ppid == parent && state == 'Z') out.push_back(pid);
  }
  return out;
}

std::set<std::string> OpenFds(pid_t pid) {
  std::set<std::string> out;
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::error_code ec2;
    const auto target = fs::read_symlink(e.path(), ec2);
    std::string t = ec2 ? "?" : target.string();
    // Anonymous inodes and sockets/pipes carry their inode number; keep only the kind, so the same
    // fd re-created for the next attempt (a fresh pipe) compares equal.
    if (t.rfind("pipe:", 0) == 0 || t.rfind("socket:", 0) == 0) t = t.substr(0, t.find(':'));
    out.insert(e.path().filename().string() + " -> " + t);
  }
  return out;
}

std::set<std::string> DirEntries(const std::string& dir) {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) out.insert(e.path().filename().string());
  return out;
}

std::vector<std::string> TreeOf(const std::string& root) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    out.push_back(fs::relative(it->path(), root, ec).string());
  }
  return out;
}

LogDirCheck CheckLogDir(const std::string& run_dir, int nproc, bool redirected) {
  LogDirCheck c;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("attempt_", 0) != 0 || !e.is_directory()) {
      c.unexpected.push_back(name);
      continue;
    }
    ++c.attempts;
    for (int r = 0; r < nproc; ++r) {
      const fs::path rank = e.path() / std::to_string(r);
      if (!fs::is_directory(rank)) c.missing.push_back(rank.string());
      if (!redirected) continue;
      for (const char* f : {"stdout.log", "stderr.log"}) {
        if (!fs::is_regular_file(rank / f)) c.missing.push_back((rank / f).string());
      }
    }
  }
  if (ec) c.missing.push_back(run_dir + ": " + ec.message());
  return c;
}

std::vector<pid_t> DescendantsRunning(pid_t ancestor, const std::string& exe) {
  std::vector<pid_t> out;
  std::error_code ec;
  const auto want = fs::canonical(exe, ec);
  for (pid_t pid : AllPids()) {
    std::error_code ec2;
    if (fs::read_symlink("/proc/" + std::to_string(pid) + "/exe", ec2) != want || ec2) continue;
    if (StateOf(pid).first == 'Z') continue;
    for (pid_t p = StateOf(pid).second; p > 1; p = StateOf(p).second) {
      if (p == ancestor) {
        out.push_back(pid);
        break;
      }
    }
  }
  return out;
}

std::string EnvOf(pid_t pid, const std::string& name) {
  const std::string env = ReadFileOr("/proc/" + std::to_string(pid) + "/environ");
  const std::string key = name + "=";
  size_t pos = 0;
  while (pos < env.size()) {
    size_t end = env.find('\0', pos);
    if (end == std::string::npos) end = env.size();
    if (env.compare(pos, key.size(), key) == 0) return env.substr(pos + key.size(), end - pos - key.size());
    pos = end + 1;
  }
  return "";
}

int ConnectLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

long RssKib(pid_t pid) { return StatusField(pid, "VmRSS"); }
long PeakRssKib(pid_t pid) { return StatusField(pid, "VmHWM"); }

std::string Describe(const std::vector<pid_t>& pids) {
  std::string out;
  for (pid_t p : pids) {
    std::string cmd = ReadFileOr("/proc/" + std::to_string(p) + "/cmdline");
    for (char& ch : cmd) {
      if (ch == '\0') ch = ' ';
    }
    const auto [state, ppid] = StateOf(p);
    out += "pid " + std::to_string(p) + " (" + cmd + ") state " + std::string(1, state) + " ppid " +
           std::to_string(ppid) + " pgid " + std::to_string(::getpgid(p)) + "; ";
  }
  return out;
}

}  // namespace ctrun::reliability
