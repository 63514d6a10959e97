// ctrun_fake_worker: the worker program process and e2e tests launch under ctrun. Options are
// applied in this order: record (env/fds/pid files), spawn grandchildren, print, then the
// ending (hang / ignore SIGTERM / exit code / signal), which can be limited to one rank and
// one attempt so restart tests can "fail once, then succeed".
//
//   --env-file P        write the environment to P.<RANK> (one K=V per line)
//   --fd-file P         write the open fd numbers (from /proc/self/fd) to P.<RANK>
//   --affinity-file P   write the CPUs it may run on (sched_getaffinity), "0,1,...", to P.<RANK>
//   --pid-file P        append "<pid>\n" to P (the worker and every grandchild)
//   --touch DIR         create DIR/<RANK> (torchrun's test_script.sh)
//   --grandchildren N   fork N children that sleep forever (same process group)
//   --detached-grandchild  fork one child that calls setsid() (escapes the group) and sleeps
//   --print N           print N numbered lines "rank R line i" to stdout
//   --long-line N       print one line of N bytes ("rank R " then the digits 0-9 over and over)
//                       to stdout, in writes of 1000 to 9000 bytes
//   --stderr TEXT       write TEXT + newline to stderr
//   --partial TEXT      write TEXT (no newline) to stderr
//   --sleep-ms N        sleep N ms before ending
//   --ignore-term       ignore SIGTERM
//   --hang              sleep until killed
//   --exit N            exit code N (default 0)
//   --signal SIG        kill itself with SIG (number)
//   --only-rank R       apply --exit/--signal/--hang only on RANK R (others exit 0)
//   --only-attempt A    ... and only when TORCHELASTIC_RESTART_COUNT == A
//   --attempts-below A  ... and only while TORCHELASTIC_RESTART_COUNT < A (long restart runs)
//   --else-hang         ranks/attempts that --only-* excludes hang instead of exiting 0
//   --else-hang-attempt A  ... only when TORCHELASTIC_RESTART_COUNT == A (later attempts exit 0)
//   --hang-if-world N   hang while WORLD_SIZE == N (multi-node: until a membership change)
//   --only-world N      ... and only while WORLD_SIZE == N (multi-node: the ending of one size)
//   --wait-file P       before ending, wait (up to 30 s) until P exists
//   --fail-stderr TEXT  where the ending applies (--only-*), write TEXT + newline to stderr first
//   --error-file MSG    write a torchelastic error file with MSG to $TORCHELASTIC_ERROR_FILE
//   --error-raw TEXT    write TEXT verbatim to $TORCHELASTIC_ERROR_FILE (malformed error files)
//   --error-bytes N     write N bytes of 'x' to $TORCHELASTIC_ERROR_FILE (oversized error files)
//   --error-dir         make $TORCHELASTIC_ERROR_FILE a directory instead of a file
//   --heartbeat N       beat N times through the worker library (CTRUN_HEARTBEAT_FD/FILE)
//   --heartbeat-ms MS   ... MS apart (default 1)
//   --buffered-crash N  as the ending: printf N lines "buffered line i" (stdio's own buffering,
//                       no fflush), then abort(): on a pipe they are lost, on a pty (line-buffered)
//                       they are shown
//   --progress N        N '\r' updates "progress i/N" (20 ms apart), then a newline
//   --read-line         write "prompt> " (no newline), read one line from stdin, print
//                       "got: <line>" ("got EOF" at end of file)
//   --winsize-file P    write "<rows> <cols> <isatty(1)>" of fd 1 to P.<RANK>.0, wait (up to
//                       30 s) for SIGWINCH, then write the new size to P.<RANK>.1
//   --beat-step S       ... carrying steps S, S+1, ... (default: the library's counter)
//   --print-ms MS       sleep MS ms after each --print line (output without beats)
//   --quiet-rank R      RANK R prints nothing (no --print lines, no --long-line)
//   --else-beat MS      ranks/attempts that --only-* excludes beat every MS ms forever instead of
//                       exiting 0 (the healthy ranks of a hang test)
//   --stranger-child P  before the beats, start a child (fork and exec of this program, which
//                       inherits the environment) with --as-stranger P, and wait for it
//   --as-stranger P     only this: close fd 3, open a datagram socketpair with one end at fd 3
//                       (a stranger's socket at the heartbeat fd's number), beat 3 times through
//                       the library, and write "beats=<last counter> received=<datagrams on the
//                       other end> cloexec=<0|1> nonblock=<0|1>" (fd 3's flags) to P.<RANK>
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ctrun/heartbeat.h"

extern char** environ;

namespace {

std::string Env(const char* k, const char* dflt = "") {
  const char* v = getenv(k);
  return v ? v : dflt;
}

void AppendPid(const std::string& path, pid_t pid) {
  if (path.empty()) return;
  FILE* f = fopen(path.c_str(), "a");
  if (!f) return;
  fprintf(f, "%d\n", static_cast<int>(pid));
  fclose(f);
}

void SleepMs(long ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

// Polls `path` every 2 ms, for at most 30 s, until it exists (want_present) or is gone; false when
// the time ran out.
bool WaitForPath(const std::string& path, bool want_present) {
  struct stat st;
  for (int i = 0; i < 15000; ++i) {
    if ((stat(path.c_str(), &st) == 0) == want_present) return true;
    SleepMs(2);
  }
  return false;
}

// --as-stranger: a process the worker started, with its own socket where the worker's heartbeat
// fd was. Returns the exit code.
int BeatAsStranger(const std::string& path) {
  ::close(3);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_DGRAM, 0, sv) != 0) return 10;  // not CLOEXEC: the library must not make it so
  int peer = sv[0] == 3 ? sv[1] : sv[0];
  if (sv[0] != 3 && sv[1] != 3) {  // fd 3 was taken after all: put our end there
    if (dup2(sv[1], 3) != 3) return 11;
    close(sv[1]);
  }
  uint64_t last = 0;
  for (int i = 0; i < 3; ++i) last = ctrun::heartbeat();
  int received = 0;
  char buf[256];
  while (recv(peer, buf, sizeof buf, MSG_DONTWAIT) >= 0) ++received;
  const int fd_flags = fcntl(3, F_GETFD), fl_flags = fcntl(3, F_GETFL);
  FILE* f = fopen((path + "." + Env("RANK", "0")).c_str(), "w");
  if (!f) return 12;
  fprintf(f, "beats=%llu received=%d cloexec=%d nonblock=%d\n", static_cast<unsigned long long>(last), received,
          (fd_flags & FD_CLOEXEC) ? 1 : 0, (fl_flags & O_NONBLOCK) ? 1 : 0);
  fclose(f);
  return 0;
}

// --stranger-child: runs this program with --as-stranger `path` (fork and exec: it inherits the
// environment, and not the heartbeat fd, which the library made CLOEXEC) and waits for it.
void RunStrangerChild(const std::string& path) {
  const pid_t p = fork();
  if (p == 0) {
    execl("/proc/self/exe", "ctrun_fake_worker", "--as-stranger", path.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  while (p > 0 && waitpid(p, &status, 0) < 0 && errno == EINTR) {
  }
}

[[noreturn]] void SleepForever() {
  for (;;) pause();
}

void WriteWinsize(const std::string& path) {
  winsize ws{};
  ioctl(1, TIOCGWINSZ, &ws);
  if (FILE* f = fopen(path.c_str(), "w")) {
    fprintf(f, "%d %d %d\n", ws.ws_row, ws.ws_col, isatty(1));
    fclose(f);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> a(argv + 1, argv + argc);
  std::string affinity_file;
  std::string env_file, fd_file, pid_file, touch_dir, stderr_text, partial, wait_file, error_msg, error_raw;
  std::string fail_stderr;
  long error_bytes = -1;
  bool error_dir = false;
  int grandchildren = 0, exit_code = 0, sig = 0, print_n = 0, beats = 0, buffered_crash = -1, progress = 0;
  bool read_line = false;
  std::string winsize_file, stranger_child;
  long beat_ms = 1, print_ms = 0, else_beat_ms = -1;
  int quiet_rank = -1;
  long long_line = 0;
  long long beat_step = -1;
  long sleep_ms = 0;
  int wait_gone_rank = -1;
  bool ignore_term = false, hang = false, detached = false, else_hang = false;
  int attempts_below = -1;
  int only_rank = -1, only_attempt = -1, else_hang_attempt = -1, hang_if_world = -1, only_world = -1;
  for (size_t i = 0; i < a.size(); ++i) {
    auto next = [&]() -> std::string { return i + 1 < a.size() ? a[++i] : std::string(); };
    const std::string& o = a[i];
    if (o == "--env-file") env_file = next();
    else if (o == "--fd-file") fd_file = next();
    else if (o == "--affinity-file") affinity_file = next();
    else if (o == "--pid-file") pid_file = next();
    else if (o == "--touch") touch_dir = next();
    else if (o == "--grandchildren") grandchildren = atoi(next().c_str());
    else if (o == "--detached-grandchild") detached = true;
    else if (o == "--print") print_n = atoi(next().c_str());
    else if (o == "--long-line") long_line = atol(next().c_str());
    else if (o == "--stderr") stderr_text = next();
    else if (o == "--fail-stderr") fail_stderr = next();
    else if (o == "--partial") partial = next();
    else if (o == "--sleep-ms") sleep_ms = atol(next().c_str());
    else if (o == "--ignore-term") ignore_term = true;
    else if (o == "--hang") hang = true;
    else if (o == "--exit") exit_code = atoi(next().c_str());
    else if (o == "--signal") sig = atoi(next().c_str());
    else if (o == "--only-rank") only_rank = atoi(next().c_str());
    else if (o == "--only-attempt") only_attempt = atoi(next().c_str());
    else if (o == "--attempts-below") attempts_below = atoi(next().c_str());
    else if (o == "--wait-file") wait_file = next();
    else if (o == "--wait-gone-rank") wait_gone_rank = atoi(next().c_str());
    else if (o == "--else-hang") else_hang = true;
    else if (o == "--else-hang-attempt") else_hang_attempt = atoi(next().c_str());
    else if (o == "--hang-if-world") hang_if_world = atoi(next().c_str());
    else if (o == "--only-world") only_world = atoi(next().c_str());
    else if (o == "--heartbeat") beats = atoi(next().c_str());
    else if (o == "--heartbeat-ms") beat_ms = atol(next().c_str());
    else if (o == "--beat-step") beat_step = atoll(next().c_str());
    else if (o == "--print-ms") print_ms = atol(next().c_str());
    else if (o == "--quiet-rank") quiet_rank = atoi(next().c_str());
    else if (o == "--else-beat") else_beat_ms = atol(next().c_str());
    else if (o == "--error-file") error_msg = next();
    else if (o == "--error-raw") error_raw = next();
    else if (o == "--error-bytes") error_bytes = atol(next().c_str());
    else if (o == "--error-dir") error_dir = true;
    else if (o == "--buffered-crash") buffered_crash = atoi(next().c_str());
    else if (o == "--progress") progress = atoi(next().c_str());
    else if (o == "--read-line") read_line = true;
    else if (o == "--winsize-file") winsize_file = next();
    else if (o == "--stranger-child") stranger_child = next();
    else if (o == "--as-stranger") return BeatAsStranger(next());
    else {
      fprintf(stderr, "fake_worker: unknown option %s\n", o.c_str());
      return 64;
    }
  }
  const std::string rank = Env("RANK", "0");
  if (ignore_term) signal(SIGTERM, SIG_IGN);

  if (!env_file.empty()) {
    FILE* f = fopen((env_file + "." + rank).c_str(), "w");
    for (char** e = environ; f && *e; ++e) fprintf(f, "%s\n", *e);
    if (f) fclose(f);
  }
  if (!affinity_file.empty()) {
    cpu_set_t set;
    std::string cpus;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
      for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &set)) cpus += (cpus.empty() ? "" : ",") + std::to_string(c);
    if (FILE* f = fopen((affinity_file + "." + rank).c_str(), "w")) {
      fprintf(f, "%s\n", cpus.c_str());
      fclose(f);
    }
  }
  if (!fd_file.empty()) {
    // Collect first, write after: opening the output file must not show up in the list.
    std::vector<int> fds;
    if (DIR* d = opendir("/proc/self/fd")) {
      int self = dirfd(d);
      while (dirent* e = readdir(d)) {
        if (e->d_name[0] == '.') continue;
        int fd = atoi(e->d_name);
        if (fd != self) fds.push_back(fd);
      }
      closedir(d);
    }
    FILE* f = fopen((fd_file + "." + rank).c_str(), "w");
    for (int fd : fds) {
      char link[256] = {0};
      std::string p = "/proc/self/fd/" + std::to_string(fd);
      ssize_t n = readlink(p.c_str(), link, sizeof link - 1);
      if (f) fprintf(f, "%d %s\n", fd, n > 0 ? link : "?");
    }
    if (f) fclose(f);
  }
  if (!touch_dir.empty()) {
    int fd = open((touch_dir + "/" + rank).c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    if (fd >= 0) close(fd);
  }
  AppendPid(pid_file, getpid());
  for (int g = 0; g < grandchildren; ++g) {
    pid_t p = fork();
    if (p == 0) {
      signal(SIGTERM, SIG_DFL);
      SleepForever();
    }
    AppendPid(pid_file, p);
  }
  if (detached) {
    pid_t p = fork();
    if (p == 0) {
      setsid();
      SleepForever();
    }
    AppendPid(pid_file, p);
  }
  if (std::to_string(quiet_rank) == rank) print_n = 0, long_line = 0;
  if (long_line > 0) {
    std::string line = "rank " + rank + " ";
    while (static_cast<long>(line.size()) < long_line) line.push_back(static_cast<char>('0' + line.size() % 10));
    line.resize(static_cast<size_t>(long_line));
    line.push_back('\n');
    fflush(stdout);
    for (size_t at = 0, k = 0; at < line.size(); ++k) {
      const size_t n = std::min(line.size() - at, static_cast<size_t>(1000 + (k * 3001) % 8000));
      const ssize_t w = write(1, line.data() + at, n);
      if (w <= 0 && errno != EINTR) break;
      if (w > 0) at += static_cast<size_t>(w);
    }
  }
  for (int i = 0; i < print_n; ++i) {
    printf("rank %s line %d\n", rank.c_str(), i);
    if (print_ms > 0) {
      fflush(stdout);
      SleepMs(print_ms);
    }
  }
  fflush(stdout);
  if (!stderr_text.empty()) fprintf(stderr, "%s\n", stderr_text.c_str());
  if (!partial.empty()) fputs(partial.c_str(), stderr);
  fflush(stderr);
  for (int i = 1; i <= progress; ++i) {
    printf("\rprogress %d/%d", i, progress);
    fflush(stdout);
    SleepMs(20);
  }
  if (progress > 0) {
    printf("\n");
    fflush(stdout);
  }
  if (read_line) {
    fputs("prompt> ", stdout);
    fflush(stdout);
    char line[256];
    if (fgets(line, sizeof line, stdin)) {
      line[strcspn(line, "\n")] = 0;
      printf("got: %s\n", line);
    } else {
      printf("got EOF\n");
    }
    fflush(stdout);
  }
  if (!winsize_file.empty()) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGWINCH);
    sigprocmask(SIG_BLOCK, &set, nullptr);
    WriteWinsize(winsize_file + "." + rank + ".0");
    timespec timeout{30, 0};
    if (sigtimedwait(&set, nullptr, &timeout) == SIGWINCH) WriteWinsize(winsize_file + "." + rank + ".1");
  }
  if (!stranger_child.empty()) RunStrangerChild(stranger_child);
  for (int b = 0; b < beats; ++b) {
    if (beat_step >= 0) ctrun::heartbeat(static_cast<uint64_t>(beat_step + b));
    else ctrun::heartbeat();
    if (b + 1 < beats) SleepMs(beat_ms);
  }
  if (sleep_ms > 0) SleepMs(sleep_ms);
  if (!wait_file.empty()) (void)WaitForPath(wait_file, /*want_present=*/true);

  // Every other rank waits (bounded) until rank R's directory of this attempt, beside its own
  // (the directory of TORCHELASTIC_ERROR_FILE), is gone, and exits 4 when it never goes.
  if (wait_gone_rank >= 0 && std::to_string(wait_gone_rank) != rank) {
    std::string dir = Env("TORCHELASTIC_ERROR_FILE");
    dir = dir.substr(0, dir.rfind('/'));
    dir = dir.substr(0, dir.rfind('/') + 1) + std::to_string(wait_gone_rank);
    if (!WaitForPath(dir, /*want_present=*/false)) return 4;
  }
  bool applies = (only_rank < 0 || std::to_string(only_rank) == rank) &&
                 (only_attempt < 0 || std::to_string(only_attempt) == Env("TORCHELASTIC_RESTART_COUNT", "0")) &&
                 (attempts_below < 0 || atoi(Env("TORCHELASTIC_RESTART_COUNT", "0").c_str()) < attempts_below) &&
                 (only_world < 0 || std::to_string(only_world) == Env("WORLD_SIZE", ""));
  if (hang_if_world >= 0 && Env("WORLD_SIZE", "") == std::to_string(hang_if_world)) SleepForever();
  if (!applies) {
    if (else_hang) SleepForever();
    for (uint64_t b = 0; else_beat_ms >= 0; ++b) {
      if (beat_step >= 0) ctrun::heartbeat(static_cast<uint64_t>(beat_step + beats) + b);
      else ctrun::heartbeat();
      SleepMs(else_beat_ms);
    }
    if (else_hang_attempt >= 0 && std::to_string(else_hang_attempt) == Env("TORCHELASTIC_RESTART_COUNT", "0"))
      SleepForever();
    return 0;
  }
  if (!fail_stderr.empty()) {
    fprintf(stderr, "%s\n", fail_stderr.c_str());
    fflush(stderr);
  }
  if (!error_msg.empty()) {
    std::string path = Env("TORCHELASTIC_ERROR_FILE");
    if (FILE* f = fopen(path.c_str(), "w")) {
      fprintf(f,
              "{\"message\": {\"message\": \"RuntimeError: %s\", \"extraInfo\": {\"py_callstack\": "
              "\"Traceback (most recent call last):\\n  fake frame\\nRuntimeError: %s\\n\", \"timestamp\": \"%ld\"}}}",
              error_msg.c_str(), error_msg.c_str(), static_cast<long>(time(nullptr)));
      fclose(f);
    }
  }
  if (!error_raw.empty() || error_bytes >= 0) {
    if (FILE* f = fopen(Env("TORCHELASTIC_ERROR_FILE").c_str(), "w")) {
      fputs(error_raw.c_str(), f);
      for (long i = 0; i < error_bytes; ++i) fputc('x', f);
      fclose(f);
    }
  }
  if (error_dir) mkdir(Env("TORCHELASTIC_ERROR_FILE").c_str(), 0755);
  if (buffered_crash >= 0) {
    for (int i = 0; i < buffered_crash; ++i) printf("buffered line %d\n", i);
    abort();
  }
  if (hang) SleepForever();
  if (sig) {
    signal(sig, SIG_DFL);
    kill(getpid(), sig);
    SleepForever();
  }
  return exit_code;
}
