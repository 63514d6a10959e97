// ctrun_relay_bench: N writer processes (ctrun_bench_writer) with piped stdout, relayed to a file.
//   ctrun_relay_bench WRITER_BIN WRITERS BYTES_PER_WRITER OUT_FILE MODE [printf]
// MODE relay: OutputRelay on an EventLoop, "[rNN] " prefixes, console = OUT_FILE (like ctrun's
//             default multi-worker output redirected to a file)
// MODE tee:   relay, plus each rank's raw bytes into OUT_FILE.<rank> (like --tee)
// MODE cat:   each writer piped into its own `cat` appending to OUT_FILE (the no-work baseline)
// RELAY_PTY=1: each writer's stdout is a pseudo-terminal (sys/pty.h, as ctrun --tty gives
// workers at a terminal) instead of a pipe; relay/tee modes only.
// Prints wall time, aggregate throughput, and CPU time (user+sys) of the writers and of the
// relay (this process) or of the cats.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "logs/output_relay.h"
#include "sys/pty.h"

using namespace ctrun;

namespace {

double Cpu(const rusage& r) {
  return static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
         static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

pid_t Spawn(const std::vector<std::string>& argv, int in_fd, int out_fd) {
  pid_t pid = ::fork();
  if (pid == 0) {
    if (in_fd >= 0) ::dup2(in_fd, 0);
    ::dup2(out_fd, 1);
    std::vector<char*> a;
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    ::execvp(a[0], a.data());
    ::_exit(127);
  }
  return pid;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6 && argc != 7) {
    std::fprintf(stderr, "usage: %s WRITER_BIN WRITERS BYTES_PER_WRITER OUT_FILE relay|tee|cat\n", argv[0]);
    return 2;
  }
  std::string writer = argv[1];
  int n = std::atoi(argv[2]);
  std::string bytes = argv[3];
  std::string mode = argv[5];
  UniqueFd out(::open(argv[4], O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644));
  if (!out) return 1;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<pid_t> writers, cats;
  EventLoop loop;
  logs::ConsoleOptions opt;
  opt.stdout_fd = out.get();
  opt.stderr_fd = out.get();
  if (const char* v = std::getenv("RELAY_READ_SIZE")) opt.read_size = std::strtoul(v, nullptr, 10);
  if (const char* v = std::getenv("RELAY_PIPE_SIZE")) opt.pipe_size = std::strtoul(v, nullptr, 10);
  logs::OutputRelay relay(loop, opt);
  int drained = 0;
  relay.SetOnWorkerDrained([&](int) { ++drained; });
  const bool use_pty = std::getenv("RELAY_PTY") != nullptr && mode != "cat";
  for (int r = 0; r < n; ++r) {
    int fds[2];
    if (use_pty) {
      auto p = OpenPty(WindowSize{24, 80});
      if (!p.ok()) return 1;
      fds[0] = p->master.release();
      fds[1] = p->slave.release();
    } else if (::pipe2(fds, O_CLOEXEC) != 0) {
      return 1;
    }
    std::vector<std::string> wargv{writer, bytes, std::to_string(r)};
    if (argc == 7) wargv.push_back(argv[6]);
    writers.push_back(Spawn(wargv, -1, fds[1]));
    ::close(fds[1]);
    if (mode == "cat") {
      cats.push_back(Spawn({"cat"}, fds[0], out.get()));
      ::close(fds[0]);
    } else {
      logs::Sinks s;
      s.console = true;
      s.prefix = "[r" + std::string(r < 10 ? "0" : "") + std::to_string(r) + "] ";
      s.color_key = r;
      if (mode == "tee") {
        std::string path = std::string(argv[4]) + "." + std::to_string(r);
        s.file.reset(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
      }
      if (!relay.AddStream(r, logs::Stream::kStdout, UniqueFd(fds[0]), std::move(s)).ok()) return 1;
    }
  }
  if (mode != "cat") {
    while (drained < n) loop.RunOnce();
  }
  double writers_cpu = 0, cats_cpu = 0;
  for (pid_t p : writers) {
    int st;
    rusage ru{};
    ::wait4(p, &st, 0, &ru);
    writers_cpu += Cpu(ru);
  }
  for (pid_t p : cats) {
    int st;
    rusage ru{};
    ::wait4(p, &st, 0, &ru);
    cats_cpu += Cpu(ru);
  }
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  rusage self{};
  ::getrusage(RUSAGE_SELF, &self);
  double in_bytes = static_cast<double>(n) * std::strtod(bytes.c_str(), nullptr);
  off_t out_bytes = ::lseek(out.get(), 0, SEEK_END);
  double self_user = static_cast<double>(self.ru_utime.tv_sec) + static_cast<double>(self.ru_utime.tv_usec) / 1e6;
  if (use_pty) std::printf("pty ");
  std::printf("%s mode=%-5s writers=%d in=%.0fMB out=%.0fMB wall=%.2fs throughput=%.0fMB/s writers_cpu=%.2fs %s_cpu=%.2fs",
              argc == 7 ? "printf-writers" : "memcpy-writers", mode.c_str(), n, in_bytes / 1e6, static_cast<double>(out_bytes) / 1e6, wall, in_bytes / 1e6 / wall,
              writers_cpu, mode == "cat" ? "cats" : "relay", mode == "cat" ? cats_cpu : Cpu(self));
  if (mode != "cat") std::printf(" (user %.2fs sys %.2fs)", self_user, Cpu(self) - self_user);
  std::printf("\n");
  return 0;
}
