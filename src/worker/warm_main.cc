// The native warm server behind CTRUN_MAIN (ctrun/warm_main.h). It speaks the protocol of
// src/warm/warm_server.py, so ctrun's WarmSpawner drives both alike:
//   server -> ctrun  {"op":"ready","pid","problem","files"}    once, after start-up
//   ctrun -> server  {"op":"check"}  -> {"op":"check","stale","problem"}
//   ctrun -> server  {"op":"fork","n"} -> n x {"op":"child","pid"} + [pidfd, spec socket],
//                                         or {"op":"unsafe","problem"} instead of forking
//   ctrun -> child   {"argv","env","cwd","parent","fd_targets","closed_fds"} + one fd per fd_targets entry
// Process tree and reaping are as for the Python server (see the top of warm_server.py): the
// server forks an intermediate, which forks the worker, opens its pidfd while it is still its
// parent, hands it over and exits; the worker is reparented to ctrun (the child subreaper) before
// the server passes the pidfd on.
//
// Safety: the server forks only while it has exactly one thread and has not touched CUDA (the
// driver in libcuda initialised, or a /dev/nvidia* device open); otherwise it reports the broken rule and ctrun starts the
// workers cold. "Stale": a file the loader mapped (the binary and its shared libraries) that was
// replaced or modified since start-up; ctrun then restarts the server.
//
// The server itself runs nothing but this file before main's caller would have run fn: no
// threads, no signal changes, no output. A waiting worker exits on EOF of its spec socket.
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/unique_fd.h"
#include "ctrun/warm_main.h"
#include "sys/fd_passing.h"
#include "worker/heartbeat_internal.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

extern char** environ;

namespace ctrun::worker {
namespace {

using nlohmann::json;

constexpr size_t kMaxSpec = 1 << 22;  // argv + environment of one worker
constexpr int kFirstHighFd = 10;      // received fds are parked here before dup2 onto 0-3

// A worker's argv and initial environment, for the rest of its life (as the loader's are); held
// here so they stay reachable (leak checkers) even after setenv replaces environ.
char** g_worker_argv = nullptr;
char** g_worker_environ = nullptr;

// --- signals: as found at main(), restored in every worker -----------------------------------------
struct SignalState {
  struct sigaction action[NSIG];
  sigset_t mask;
};

void Capture(SignalState* s) {
  for (int sig = 1; sig < NSIG; ++sig) ::sigaction(sig, nullptr, &s->action[sig]);
  ::sigprocmask(SIG_SETMASK, nullptr, &s->mask);
}

void Restore(const SignalState& s) {
  for (int sig = 1; sig < NSIG; ++sig)
    if (sig != SIGKILL && sig != SIGSTOP) ::sigaction(sig, &s.action[sig], nullptr);
  ::sigprocmask(SIG_SETMASK, &s.mask, nullptr);
}

// --- safety rules --------------------------------------------------------------------------------
int ThreadCount() {
  DIR* d = ::opendir("/proc/self/task");
  if (!d) return -1;
  int n = 0;
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++n;
  ::closedir(d);
  return n;
}

// Whether the CUDA driver mapped at `path` was initialised (cuInit called): cuCtxGetCurrent answers
// CUDA_ERROR_NOT_INITIALIZED (3) until then, and asking changes nothing. Being mapped is not
// enough: every CUDA build of LibTorch 2.x maps libcuda at load (a library of torch's links it)
// without calling it. A driver that cannot be asked counts as initialised.
bool CudaDriverInitialised(const std::string& path) {
  void* lib = ::dlopen(path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
  if (!lib) return true;
  using CtxGetCurrent = int (*)(void**);
  const auto get = reinterpret_cast<CtxGetCurrent>(::dlsym(lib, "cuCtxGetCurrent"));
  void* ctx = nullptr;
  const bool initialised = !get || get(&ctx) != 3;
  ::dlclose(lib);
  return initialised;
}

std::string CudaProblem() {
  std::ifstream maps("/proc/self/maps");
  std::set<std::string> drivers;  // a library is mapped in several segments: ask each file once
  for (std::string line; std::getline(maps, line);) {
    const size_t at = line.find('/');
    if (line.find("/libcuda.so") != std::string::npos && at != std::string::npos) drivers.insert(line.substr(at));
  }
  for (const std::string& path : drivers)
    if (CudaDriverInitialised(path)) return "CUDA was initialised before main (the CUDA driver, libcuda, is initialised)";
  if (DIR* d = ::opendir("/proc/self/fd")) {
    std::string found;
    while (dirent* e = ::readdir(d)) {
      char target[256];
      const std::string link = std::string("/proc/self/fd/") + e->d_name;
      const ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
      if (n > 0 && std::string_view(target, static_cast<size_t>(n)).starts_with("/dev/nvidia")) found = "yes";
    }
    ::closedir(d);
    if (!found.empty()) return "CUDA was initialised before main (a /dev/nvidia* device is open)";
  }
  return "";
}

std::string UnsafeReason() {
  const int threads = ThreadCount();
  if (threads != 1)
    return "the warm server has " + std::to_string(threads) + " threads (a static initialiser started threads)";
  return CudaProblem();
}

// --- stale code: the files the loader mapped ------------------------------------------------------
struct MappedFile {
  std::string path;
  dev_t dev;
  ino_t ino;
  timespec mtime;
};

// On overlayfs, kernels before 6.8 show the lower layer's device and inode in /proc/self/maps,
// while stat() of the path gives the overlay's: the two never match there, which says nothing
// about the file having been replaced. Such a file's identity is taken from stat() alone.
bool OnOverlay(const std::string& path) {
  constexpr decltype(statfs::f_type) kOverlayMagic = 0x794c7630;  // OVERLAYFS_SUPER_MAGIC
  struct statfs fs;
  return ::statfs(path.c_str(), &fs) == 0 && fs.f_type == kOverlayMagic;
}

class Staleness {
 public:
  // Every file mapped now (the binary, its libraries): identity from /proc/self/maps (what is
  // mapped), mtime from stat. A path already replaced is stale from the start (not seen on
  // overlayfs: see OnOverlay).
  Staleness() {
    std::ifstream maps("/proc/self/maps");
    for (std::string line; std::getline(maps, line);) {
      char perms[8], dev[16];
      unsigned long long start, end, offset, inode;
      int path_at = 0;
      if (std::sscanf(line.c_str(), "%llx-%llx %7s %llx %15s %llu %n", &start, &end, perms, &offset, dev, &inode,
                      &path_at) < 6 ||
          inode == 0 || path_at <= 0 || line[static_cast<size_t>(path_at)] != '/')
        continue;
      std::string path = line.substr(static_cast<size_t>(path_at));
      // Not files the loader read: anonymous shared memory and devices.
      if (path.starts_with("/memfd:") || path.starts_with("/dev/") || path.starts_with("/SYSV")) continue;
      bool seen = false;
      for (const auto& f : files_) seen = seen || f.path == path;
      if (seen) continue;
      unsigned major = 0, minor = 0;
      std::sscanf(dev, "%x:%x", &major, &minor);
      struct stat st;
      if (path.ends_with(" (deleted)") || ::stat(path.c_str(), &st) != 0 ||
          ((st.st_ino != inode || ::major(st.st_dev) != major || ::minor(st.st_dev) != minor) &&
           !OnOverlay(path))) {
        if (stale_.empty()) stale_ = path;
        continue;
      }
      files_.push_back({path, st.st_dev, st.st_ino, st.st_mtim});
    }
  }
  size_t size() const { return files_.size(); }
  // The first file replaced or modified since start-up, or "".
  const std::string& Check() {
    for (const auto& f : files_) {
      if (!stale_.empty()) break;
      struct stat st;
      if (::stat(f.path.c_str(), &st) != 0 || st.st_dev != f.dev || st.st_ino != f.ino ||
          st.st_mtim.tv_sec != f.mtime.tv_sec || st.st_mtim.tv_nsec != f.mtime.tv_nsec)
        stale_ = f.path;
    }
    return stale_;
  }

 private:
  std::vector<MappedFile> files_;
  std::string stale_;
};

// Runs from exit() once the handlers the worker registered (atexit, on_exit, destructors of
// statics it constructed) have run, since handlers run in reverse order of registration and this
// one is registered first thing in the worker: flushes stdio and ends the process with exit()'s
// status. What it skips are the destructors of everything constructed before main, in the server
// (LibTorch's operator and type registries): in a forked worker they would write to pages shared
// copy-on-write with the server and copy most of them, which measured ~0.5-1 s per LibTorch
// worker on a loaded 2-core machine; a cold process's teardown frees private memory instead. The
// server's copies are never destroyed either.
void EndWithoutPreMainDestructors(int status, void*) {
  // The standard streams' own buffers (after std::ios::sync_with_stdio(false)) are flushed by a
  // destructor registered before main, which is skipped here: flush them as it would.
  std::cout.flush();
  std::clog.flush();
  std::wcout.flush();
  std::wclog.flush();
  std::fflush(nullptr);
  ::_exit(status);
}

// --- the worker side -----------------------------------------------------------------------------
struct Spec {
  std::vector<std::string> argv;
};

[[noreturn]] void FailedStart(const std::string& why) {
  std::fprintf(stderr, "ctrun --warm: cannot start the worker: %s\n", why.c_str());
  std::fflush(stderr);
  ::_exit(1);
}

// fds 0-2 and the heartbeat channel at their cold-start numbers; everything received is parked
// above kFirstHighFd first, so no dup2 overwrites an fd still to be placed.
// A stdio fd in `closed` is closed: the one a cold worker would not have either.
void PlaceFds(std::vector<UniqueFd>& fds, const std::vector<int>& targets, const std::vector<int>& closed) {
  std::vector<UniqueFd> high;
  for (auto& fd : fds) high.emplace_back(::fcntl(fd.get(), F_DUPFD_CLOEXEC, kFirstHighFd));
  fds.clear();
  if (high.size() != targets.size()) FailedStart("malformed spec: fd_targets");
  for (size_t i = 0; i < high.size(); ++i)
    if (!high[i] || ::dup2(high[i].get(), targets[i]) < 0) FailedStart(std::string("dup2: ") + std::strerror(errno));
  for (int fd : closed) (void)::close(fd);
}

// A waiting worker: the spec arrives (EOF: ctrun is gone or does not need us: exit quietly).
Spec BecomeWorker(UniqueFd sock, const SignalState& signals, void (*after_fork)()) {
  ::setpgid(0, 0);
  std::vector<UniqueFd> fds;
  std::string msg;
  if (ReceiveWithFds(sock.get(), kMaxSpec, &msg, &fds) <= 0) ::_exit(0);
  const json spec = json::parse(msg, nullptr, false);
  if (!spec.is_object() || !spec.contains("argv") || !spec["argv"].is_array() || !spec.contains("env") ||
      !spec["env"].is_array() || !spec.contains("parent") || !spec["parent"].is_number_integer())
    FailedStart("malformed spec");
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != spec.value("parent", -1)) ::_exit(128 + SIGKILL);
  sock.reset();
  if (!spec.contains("fd_targets") || !spec["fd_targets"].is_array() || !spec.contains("closed_fds") ||
      !spec["closed_fds"].is_array())
    FailedStart("malformed spec");
  PlaceFds(fds, spec["fd_targets"].get<std::vector<int>>(), spec["closed_fds"].get<std::vector<int>>());
  const std::string cwd = spec.value("cwd", "");
  if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) FailedStart("chdir " + cwd + ": " + std::strerror(errno));
  // The environment exactly as execve would give it (first entry of a name wins, as getenv).
  const auto& env = spec["env"];
  g_worker_environ = new char*[env.size() + 1];
  for (size_t i = 0; i < env.size(); ++i) g_worker_environ[i] = ::strdup(env[i].get<std::string>().c_str());
  g_worker_environ[env.size()] = nullptr;
  environ = g_worker_environ;
  ForgetHeartbeatChannel();
  Spec out;
  out.argv = spec["argv"].get<std::vector<std::string>>();
  if (out.argv.empty()) FailedStart("empty argv");
  // What error(3) and err(3) print as the program's name.
  program_invocation_name = ::strdup(out.argv[0].c_str());
  const char* slash = std::strrchr(program_invocation_name, '/');
  program_invocation_short_name = slash ? const_cast<char*>(slash + 1) : program_invocation_name;
  Restore(signals);
  ::on_exit(EndWithoutPreMainDestructors, nullptr);
  if (after_fork) after_fork();
  return out;
}

// --- the server ----------------------------------------------------------------------------------
// Forks one waiting worker. In the server: returns nullopt after handing ctrun the child (or
// setting *problem). In the worker: returns its spec.
std::optional<Spec> ForkOne(int ctl, const SignalState& signals, void (*after_fork)(), std::string* problem) {
  int pair[2], back[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0 ||
      ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, back) != 0) {
    *problem = std::string("cannot fork a worker: socketpair: ") + std::strerror(errno);
    return std::nullopt;
  }
  UniqueFd ours(pair[0]), theirs(pair[1]), back_r(back[0]), back_w(back[1]);
  std::fflush(nullptr);
  const pid_t mid = ::fork();
  if (mid < 0) {
    *problem = std::string("cannot fork a worker: ") + std::strerror(errno);
    return std::nullopt;
  }
  if (mid == 0) {  // the intermediate
    ::close(ctl);
    ours.reset();
    back_r.reset();
    const pid_t worker = ::fork();
    if (worker == 0) {
      back_w.reset();
      return BecomeWorker(std::move(theirs), signals, after_fork);
    }
    if (worker > 0) {
      const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, worker, 0));
      if (pidfd >= 0) SendWithFds(back_w.get(), std::to_string(worker), {pidfd});
    }
    ::_exit(0);
  }
  theirs.reset();
  back_w.reset();
  std::vector<UniqueFd> fds;
  std::string pid;
  ReceiveWithFds(back_r.get(), 64, &pid, &fds);
  int st;
  while (::waitpid(mid, &st, 0) < 0 && errno == EINTR) {
  }
  // Now the worker is ctrun's child.
  if (pid.empty() || fds.empty()) {
    *problem = "cannot fork a worker";
    return std::nullopt;
  }
  SendWithFds(ctl, json{{"op", "child"}, {"pid", std::stoi(pid)}}.dump(), {fds[0].get(), ours.get()});
  return std::nullopt;
}

// Returns only in a forked worker, with its spec.
Spec Serve(int ctl, const SignalState& signals, void (*after_fork)()) {
  Staleness stale;
  const std::string problem = UnsafeReason();
  SendWithFds(ctl, json{{"op", "ready"}, {"pid", ::getpid()}, {"problem", problem}, {"files", stale.size()}}.dump());
  while (true) {
    std::string data;
    if (ReceiveWithFds(ctl, 4096, &data, nullptr) <= 0) ::_exit(0);  // ctrun closed its end: done with us, or gone
    const json req = json::parse(data, nullptr, false);
    const std::string op = req.is_object() ? req.value("op", "") : "";
    if (op == "check") {
      SendWithFds(ctl, json{{"op", "check"}, {"stale", stale.Check()}, {"problem", UnsafeReason()}}.dump());
    } else if (op == "fork") {
      for (int i = 0; i < req.value("n", 0); ++i) {
        std::string why = UnsafeReason();
        if (why.empty())
          if (auto spec = ForkOne(ctl, signals, after_fork, &why)) return std::move(*spec);
        if (!why.empty()) {
          SendWithFds(ctl, json{{"op", "unsafe"}, {"problem", why}}.dump());
          break;
        }
      }
    }
  }
}

// The control socket when this process was started as ctrun's warm server, else -1. The variable
// is removed either way: nothing the program runs later may see it.
int ServerSocket() {
  const char* v = std::getenv(kWarmServerVariable);
  if (!v) return -1;
  int fd = -1;
  long parent = -1;
  const bool parsed = std::sscanf(v, "%d:%ld", &fd, &parent) == 2;
  ::unsetenv(kWarmServerVariable);
  int type = 0;
  socklen_t len = sizeof type;
  if (!parsed || fd < 3 || parent != ::getppid() || ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 ||
      type != SOCK_SEQPACKET)
    return -1;
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  return fd;
}

}  // namespace

int warm_main(int argc, char** argv, MainFunction fn, void (*after_fork)()) {
  const int ctl = ServerSocket();
  if (ctl < 0) return fn(argc, argv);
  static SignalState signals;  // as the loader left them: what a cold start gets at main
  Capture(&signals);
  Spec spec = Serve(ctl, signals, after_fork);
  // A forked worker.
  g_worker_argv = new char*[spec.argv.size() + 1];
  for (size_t i = 0; i < spec.argv.size(); ++i) g_worker_argv[i] = ::strdup(spec.argv[i].c_str());
  g_worker_argv[spec.argv.size()] = nullptr;
  return fn(static_cast<int>(spec.argv.size()), g_worker_argv);
}

}  // namespace ctrun::worker
