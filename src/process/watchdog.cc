#include "process/watchdog.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "sys/posix_util.h"

namespace ctrun {
namespace {

// Makes this process's command line (/proc/self/cmdline: what ps and pkill -f read) say only
// "ct-watchdog": a forked watchdog has the agent's, so `pkill -f train.py` would match it. The
// arguments' memory (arg_start..arg_end, fields 48 and 49 of /proc/self/stat) is overwritten in
// place. Best effort: left as it is when those fields cannot be read.
void HideCommandLine() {
  char stat[2048];
  const int fd = ::open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  const ssize_t n = RetryOnEintr([&] { return ::read(fd, stat, sizeof stat - 1); });
  ::close(fd);
  if (n <= 0) return;
  stat[n] = '\0';
  const char* p = std::strrchr(stat, ')');  // the name may hold spaces and parentheses
  unsigned long long start = 0, end = 0;
  for (int field = 2; p && field < 48; ++field) p = std::strchr(p + 1, ' ');
  if (!p || std::sscanf(p + 1, "%llu %llu", &start, &end) != 2) return;
  constexpr char kName[] = "ct-watchdog";
  if (end <= start || end - start < sizeof kName) return;
  char* args = reinterpret_cast<char*>(static_cast<uintptr_t>(start));
  std::memset(args, 0, end - start);
  std::memcpy(args, kName, sizeof kName);
}

// A forked watchdog: the same contract as the ct-watchdog program (process/watchdog_helper.c),
// in this process's copy of the agent.
[[noreturn]] void WatchdogMain(int rfd, const WatchdogCleanup& cleanup) {
  // The signals and the name first: until the signals are ignored, a ^C or killpg(ctrun) takes
  // this child; while it is called "ctrun", so does `pkill -9 ctrun`, which matches process names
  // and must leave the watchdog to do its job (it took both, and the workers' children ran on).
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE}) ::signal(s, SIG_IGN);
  ::prctl(PR_SET_NAME, "ct-watchdog");
  HideCommandLine();
  // Close everything except the pipe: the watchdog must not keep worker pipes or sockets open.
  // The pipe moves above fds 0-2 first (ctrun started with them closed can have it there), or
  // /dev/null would replace it below.
  if (rfd < 3) {
    const int moved = ::fcntl(rfd, F_DUPFD, 3);
    if (moved >= 0) rfd = moved;
  }
  for (int fd = 0; fd < 3; ++fd) {
    int nul = ::open("/dev/null", O_RDWR);
    if (nul >= 0 && nul != fd) {
      ::dup2(nul, fd);
      ::close(nul);
    }
  }
  if (rfd > 3) ::dup2(rfd, 3), rfd = 3;
  ::syscall(SYS_close_range, 4u, ~0u, 0u);
  ::setpgid(0, 0);  // out of ctrun's group: terminal ^C and killpg(ctrun) do not reach it
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);

  static PgidSet groups;  // static: zero-initialised BSS, not 512 KiB of stack
  bool clean = false;
  WatchdogMessage m;
  for (;;) {
    ssize_t r = RetryOnEintr([&] { return ::read(rfd, &m, sizeof m); });
    if (r != static_cast<ssize_t>(sizeof m)) break;  // EOF (or torn message): agent is gone
    if (m.op == 'A') {
      groups.Add(m.pgid);
    } else if (m.op == 'R') {
      groups.Remove(m.pgid);
    } else if (m.op == 'Q') {
      clean = true;
    }
  }
  if (!clean) {
    groups.ForEach([](pid_t pgid) { ::kill(-pgid, SIGKILL); });
    if (cleanup.run) cleanup.run(cleanup.args);
  }
  ::_exit(0);
}

// Moves `fd` (CLOEXEC) to 5 or above: the program's fds 0-4 are made by dup2 from these, and a
// source among them would be overwritten before its turn.
void MoveAbove4(UniqueFd* fd) {
  if (*fd && fd->get() < 5) {
    const int moved = ::fcntl(fd->get(), F_DUPFD_CLOEXEC, 5);
    if (moved >= 0) fd->reset(moved);
  }
}

// Starts the ct-watchdog program with the pipe's read end as fd 3 and ctrun's executable as fd 4
// (for the cleanup exec, when there is a cleanup); its pid, or -1 with errno when it could not be
// started. posix_spawn:
// the agent is suspended only until the exec, and none of its pages become copy-on-write.
pid_t SpawnHelper(const std::string& helper, UniqueFd& rfd, const WatchdogCleanup& cleanup) {
  UniqueFd exe;
  std::vector<std::string> args{"ct-watchdog"};
  std::vector<std::string> env;  // environ, and the cleanup's arguments (see kWatchdogCleanupFlag)
  const std::string own = std::string(kWatchdogCleanupArgsVariable) + "=";
  for (char** e = environ; *e; ++e)
    if (!std::string_view(*e).starts_with(own)) env.emplace_back(*e);
  if (cleanup.run) {
    // Without it the program could not clean up: a forked watchdog can.
    exe.reset(::open("/proc/self/exe", O_PATH | O_CLOEXEC));
    if (!exe) return -1;
    args.push_back("ct-watchdog");  // the cleanup's argv[0]
    args.push_back(kWatchdogCleanupFlag);
    std::string lines;
    bool one_line_each = true;
    for (size_t i = 0; i < cleanup.args.size(); ++i) {
      one_line_each = one_line_each && cleanup.args[i].find('\n') == std::string::npos;
      lines += (i > 0 ? "\n" : "") + cleanup.args[i];
    }
    if (one_line_each && !cleanup.args.empty()) env.push_back(std::string(kWatchdogCleanupArgsVariable) + "=" + lines);
    else args.insert(args.end(), cleanup.args.begin(), cleanup.args.end());  // a path with a newline
  }
  MoveAbove4(&rfd);
  MoveAbove4(&exe);
  posix_spawn_file_actions_t actions;
  if (int err = ::posix_spawn_file_actions_init(&actions); err != 0) return errno = err, -1;
  ::posix_spawn_file_actions_adddup2(&actions, rfd.get(), 3);
  if (exe) ::posix_spawn_file_actions_adddup2(&actions, exe.get(), 4);
  ::posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDWR, 0);
  ::posix_spawn_file_actions_adddup2(&actions, 0, 1);
  ::posix_spawn_file_actions_adddup2(&actions, 0, 2);
  // Its own group before the exec, so that no ^C or killpg(ctrun) can reach it in between.
  posix_spawnattr_t attr;
  if (int err = ::posix_spawnattr_init(&attr); err != 0) {
    ::posix_spawn_file_actions_destroy(&actions);
    return errno = err, -1;
  }
  ::posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  ::posix_spawnattr_setpgroup(&attr, 0);
  std::vector<char*> argv, envp;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  const int err = ::posix_spawn(&pid, helper.c_str(), &actions, &attr, argv.data(), envp.data());
  ::posix_spawnattr_destroy(&attr);
  ::posix_spawn_file_actions_destroy(&actions);
  if (err != 0) return errno = err, -1;
  return pid;
}

}  // namespace

std::string LocateWatchdogHelper(const std::string* override_path) {
  if (override_path) return *override_path;
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  const std::filesystem::path dir = exe.parent_path();
  for (const std::filesystem::path& p : {dir / "ct-watchdog", dir / ".." / "libexec" / "ctrun" / "ct-watchdog"})
    if (::access(p.c_str(), X_OK) == 0) return p.lexically_normal().string();
  return "";
}

void PgidSet::Add(pid_t pgid) {
  if (pgid > 0 && static_cast<uint32_t>(pgid) < kPidLimit)
    bits_[pgid / kWordBits] |= Word{1} << (pgid % kWordBits);
}

void PgidSet::Remove(pid_t pgid) {
  if (pgid > 0 && static_cast<uint32_t>(pgid) < kPidLimit)
    bits_[pgid / kWordBits] &= ~(Word{1} << (pgid % kWordBits));
}

StatusOr<Watchdog> Watchdog::Start(const std::string& helper, WatchdogCleanup cleanup) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Status::Errno("pipe2", errno);
  UniqueFd r(fds[0]), w(fds[1]);
  std::string why_forked = "no ct-watchdog program found";
  if (!helper.empty()) {
    const pid_t pid = SpawnHelper(helper, r, cleanup);
    if (pid > 0) return Watchdog(std::move(w), pid, "");
    why_forked = "cannot start " + helper + ": " + std::strerror(errno);
  }
  pid_t pid = ::fork();
  if (pid < 0) return Status::Errno("fork watchdog", errno);
  if (pid == 0) {
    w.reset();
    WatchdogMain(r.release(), cleanup);
  }
  return Watchdog(std::move(w), pid, std::move(why_forked));
}

Watchdog::~Watchdog() {
  if (write_) Send('Q', 0);
}

namespace {

void SendTo(int fd, char op, pid_t pgid) {
  const WatchdogMessage m{op, static_cast<int32_t>(pgid)};
  (void)RetryOnEintr([&] { return ::write(fd, &m, sizeof m); });  // 5 bytes < PIPE_BUF: whole or nothing
}

}  // namespace

void AnnounceGroup(int watchdog_fd, pid_t pgid) {
  if (watchdog_fd >= 0) SendTo(watchdog_fd, 'A', pgid);
}

void Watchdog::Send(char op, pid_t pgid) {
  if (write_) SendTo(write_.get(), op, pgid);
}

void Watchdog::RemoveGroup(pid_t pgid) { Send('R', pgid); }

}  // namespace ctrun
