#include "ctrun/heartbeat.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "base/unique_fd.h"
#include "worker/heartbeat_internal.h"
#include "sys/posix_util.h"

namespace ctrun::worker {
namespace {

enum class Mode { kOff, kFd, kSocket, kFile };

struct State {
  std::mutex mu;
  // Set in a process forked from the one that read the variables (a data loader, a helper): it
  // inherits the channel but is not the rank, and its beats would keep a hung rank looking alive,
  // so it sends none. Set by a pthread_atfork child handler (no system call per beat) and read
  // before `mu`: a fork while another thread held the lock leaves it held for ever in the child.
  std::atomic<bool> forked{false};
  bool atfork_registered = false;
  bool initialized = false;
  Mode mode = Mode::kOff;
  int fd = -1;          // kFd: the inherited fd (not owned: the launcher gave it to us)
  UniqueFd file;        // kFile: our own fd, CLOEXEC
  uint64_t counter = 0;
  // kSocket on a stream socket: the tail of a line the socket took only in part. It goes out
  // before the next line, so the reader never sees two lines glued into one.
  char unsent[64] = {};
  size_t unsent_len = 0;
};

State& GetState() {
  static State* s = new State();  // leaked on purpose: usable from atexit/terminate paths
  return *s;
}

// How beats go out through an inherited fd: kSocket (what ctrun gives: a datagram socket) takes
// one send(MSG_NOSIGNAL) per beat, kFd (a pipe or FIFO) a write with the SIGPIPE dance in Beat.
// Anything else is kOff: a closed fd, and a regular file, tty or device, which is never a
// launcher's channel.
Mode FdMode(const struct stat& st) {
  if (S_ISSOCK(st.st_mode)) return Mode::kSocket;
  if (S_ISFIFO(st.st_mode)) return Mode::kFd;
  return Mode::kOff;
}

// Whether `st` is the file CTRUN_HEARTBEAT_ID names ("<st_dev>:<st_ino>", decimal). Unset (or
// empty: an older launcher, or a user's own channel) names any file, and the type rule alone
// decides; a value that does not parse names none.
bool IsNamedChannel(const struct stat& st) {
  const char* id = std::getenv(kHeartbeatIdVariable);
  if (!id || !*id) return true;
  const char* end = id + std::strlen(id);
  unsigned long long dev = 0, ino = 0;
  auto [colon, ec] = std::from_chars(id, end, dev);
  if (ec != std::errc() || colon == end || *colon != ':') return false;
  auto [p, ec2] = std::from_chars(colon + 1, end, ino);
  if (ec2 != std::errc() || p != end) return false;
  return dev == static_cast<unsigned long long>(st.st_dev) && ino == static_cast<unsigned long long>(st.st_ino);
}

// The mode of the inherited `fd`, or kOff when it is not the launcher's channel. It can be a
// stranger's: a child process inherits the variables but not the fd (FD_CLOEXEC, set below), and
// its own first socket() or open() may reuse the number. A stranger's fd is never written to nor
// has its flags changed; CTRUN_HEARTBEAT_ID tells a stranger's socket or pipe from ours, and
// without it the type rule keeps beats at least out of a regular file.
Mode InheritedFdMode(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !IsNamedChannel(st)) return Mode::kOff;
  return FdMode(st);
}

// The channel CTRUN_HEARTBEAT_FD names, with its mode; {-1, kOff} when it is unset or unusable
// (an unusable fd, or one that is not the launcher's, is treated as an absent one, as a closed fd
// always was).
std::pair<int, Mode> InheritedChannel() {
  const char* fd_env = std::getenv(kHeartbeatFdVariable);
  if (!fd_env || !*fd_env) return {-1, Mode::kOff};
  int fd = -1;
  auto [p, ec] = std::from_chars(fd_env, fd_env + std::strlen(fd_env), fd);
  if (ec != std::errc() || *p != '\0' || fd < 0) return {-1, Mode::kOff};
  const Mode mode = InheritedFdMode(fd);
  return {mode == Mode::kOff ? -1 : fd, mode};
}

// Keeps the channel from the processes this one starts (dataloaders, compilers), and a fork from
// beating for the rank, from the moment the process starts rather than from its first beat: a
// worker may start its helpers before it beats. Reads the environment but keeps nothing, so the
// first beat still reads the variables as they are then.
void RegisterForkGuard(State& s) {
  if (!s.atfork_registered)
    s.atfork_registered = ::pthread_atfork(nullptr, nullptr, [] { GetState().forked.store(true); }) == 0;
}

// Only the launcher's channel (InheritedChannel) is made CLOEXEC: a stranger's fd is left as it is.
void GuardChannel() {
  RegisterForkGuard(GetState());
  if (const auto [fd, mode] = InheritedChannel(); mode != Mode::kOff)
    ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC);
}

// Runs when the program (or the shared library) is loaded, while it has one thread.
[[gnu::constructor]] void GuardChannelAtLoad() { GuardChannel(); }

void Init(State& s) {
  s.initialized = true;
  RegisterForkGuard(s);
  if (const auto [fd, mode] = InheritedChannel(); mode != Mode::kOff) {
    ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC);  // as GuardChannel, for the variables as they are now
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);  // never block training
    s.fd = fd;
    s.mode = mode;
    return;
  }
  if (const char* path = std::getenv("CTRUN_HEARTBEAT_FILE"); path && *path) {
    // Only a regular file is a channel. The open never blocks (O_NONBLOCK: a FIFO without a
    // reader fails with ENXIO instead of blocking this beat, and every later one behind `mu`),
    // never follows a link (O_NOFOLLOW) and never takes a terminal (O_NOCTTY); whatever it opened
    // that is not a regular file (a FIFO with a reader, a device) is closed unwritten. Either way
    // beats stay off for the process, silently, as for an unusable fd.
    UniqueFd fd(RetryOnEintr([&] {
      return ::open(path, O_WRONLY | O_CREAT | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC, 0644);
    }));
    struct stat st {};
    if (fd && ::fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode)) {
      s.file = std::move(fd);
      s.mode = Mode::kFile;
    }
  }
}

uint64_t NowUnixNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

bool Enabled() {
  State& s = GetState();
  if (s.forked.load(std::memory_order_relaxed)) return false;
  std::lock_guard lock(s.mu);
  if (!s.initialized) Init(s);
  return s.mode != Mode::kOff;
}

uint64_t Beat(std::optional<uint64_t> step);

}  // namespace

uint64_t heartbeat() { return Beat(std::nullopt); }
uint64_t heartbeat(uint64_t step) { return Beat(step); }
bool heartbeat_enabled() { return Enabled(); }

void ForgetHeartbeatChannel() {
  State& s = GetState();
  s.forked.store(false);
  s.initialized = false;
  s.mode = Mode::kOff;
  s.fd = -1;
  (void)s.file.release();  // not closed: the worker's own fds (PlaceFds) may sit at its number now
  s.counter = 0;
  s.unsent_len = 0;
  GuardChannel();  // the worker's own channel, as an exec'd worker's is guarded at load
}

namespace {

// One send on the socket channel: the bytes taken, or -1 when none were (a full socket drops the
// beat; any other error means the agent is gone, and beats stop quietly).
ssize_t SendSome(State& s, const char* data, size_t len) {
  const ssize_t w = RetryOnEintr([&] { return ::send(s.fd, data, len, MSG_NOSIGNAL | MSG_DONTWAIT); });
  if (w < 0 && errno != EAGAIN && errno != ENOBUFS) s.mode = Mode::kOff;
  return w;
}

// True once no part of an earlier line is waiting to go out.
bool SendUnsent(State& s) {
  if (s.unsent_len == 0) return true;
  const ssize_t w = SendSome(s, s.unsent, s.unsent_len);
  if (w <= 0) return false;
  s.unsent_len -= static_cast<size_t>(w);
  std::memmove(s.unsent, s.unsent + w, s.unsent_len);
  return s.unsent_len == 0;
}

// "<step> <unix_time_ns>\n"; heartbeat()'s counter also carries kHeartbeatCounterMark (it starts
// again at 1 in every process: the agent shows it, but does not compare it across attempts).
int FormatLine(char (&buf)[64], unsigned long long shown, bool counter) {
  return std::snprintf(buf, sizeof buf, counter ? "%llu %llu %s\n" : "%llu %llu\n", shown,
                       static_cast<unsigned long long>(NowUnixNs()), kHeartbeatCounterMark);
}

uint64_t Beat(std::optional<uint64_t> step) {
  State& s = GetState();
  if (s.forked.load(std::memory_order_relaxed)) return 0;
  std::lock_guard lock(s.mu);
  if (!s.initialized) Init(s);
  if (s.mode == Mode::kOff) return 0;
  const uint64_t n = ++s.counter;
  const unsigned long long shown = step.value_or(n);
  char buf[64];
  if (s.mode == Mode::kSocket) {
    if (!SendUnsent(s)) return 0;
    const int len = FormatLine(buf, shown, !step);
    const ssize_t w = SendSome(s, buf, static_cast<size_t>(len));
    if (w < 0) return 0;  // dropped whole
    if (w < len) {        // a stream socket took part of it: the rest goes first next time
      s.unsent_len = static_cast<size_t>(len - w);
      std::memcpy(s.unsent, buf + w, s.unsent_len);
      return 0;
    }
    return n;
  }
  if (s.mode == Mode::kFd) {
    const int len = FormatLine(buf, shown, !step);
    // A closed reader must not SIGPIPE the worker: block SIGPIPE around the write and consume
    // the one this write raised (the standard trick for pipes, where MSG_NOSIGNAL does not apply).
    sigset_t pipe_set;
    sigset_t old_set;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set);
    ssize_t w = RetryOnEintr([&] { return ::write(s.fd, buf, static_cast<size_t>(len)); });
    int err = errno;
    if (w < 0 && err == EPIPE) {
      struct timespec zero {};
      RetryOnEintr([&] { return ::sigtimedwait(&pipe_set, nullptr, &zero); });
    }
    pthread_sigmask(SIG_SETMASK, &old_set, nullptr);
    if (w < 0 && err != EAGAIN) s.mode = Mode::kOff;  // EPIPE/EBADF: agent gone; stop quietly
    return w < 0 ? 0 : n;
  }
  int len = std::snprintf(buf, sizeof buf, "%020llu %020llu\n", shown,
                          static_cast<unsigned long long>(NowUnixNs()));
  ssize_t w = RetryOnEintr([&] { return ::pwrite(s.file.get(), buf, static_cast<size_t>(len), 0); });
  if (w != len) {
    s.mode = Mode::kOff;
    s.file.reset();
    return 0;
  }
  return n;
}

}  // namespace
}  // namespace ctrun::worker
