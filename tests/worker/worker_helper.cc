// ctrun_worker_helper: a child program for the worker-library tests (tests run it, then kill or
// inspect it).
//   snapshot-writer DIR [START]  saves snapshots START, START+1, ... forever (sync, fsync on);
//                                payload of step s is Pattern(s) (1..6 MiB); after each save
//                                prints "saved <s>" (line-buffered). Killed by the test.
//   snapshot-open DIR            opens a SnapshotStore on DIR (fsync on; creates it), exits 0.
//   heartbeat N                  calls ctrun::heartbeat() N times, prints the last counter.
//   heartbeat-early              before any beat, runs a shell that says whether it inherited the
//                                channel ("exec closed"), forks a child that beats ("child 0 0"),
//                                then beats ("parent 1").
//   heartbeat-pause N            N beats, prints "paused", reads a line from stdin, N beats.
//   heartbeat-fork               beats, forks a child that beats and prints what heartbeat()
//                                and heartbeat_enabled() returned there ("child 0 0"), beats
//                                again once the child is gone and prints the counter ("parent 2").
//   heartbeat-flags N            N beats, then prints the last counter and the flags of the fd
//                                CTRUN_HEARTBEAT_FD names: "<last> cloexec=<0|1> nonblock=<0|1>".
//   throw                        installs the terminate handler and throws std::runtime_error.
//   record MESSAGE               record_error(MESSAGE) with a backtrace; exit 0 if written.
//   launch-env                   LaunchEnv::from_env() (and its debugger wait), prints "rank <r>".
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "ctrun/worker.h"
#include "worker/pattern.h"

// Forks a child that beats and prints "child <beat> <enabled>", waits for it, then beats and
// prints "parent <beat>". Returns the exit code.
int ForkedChildThenParentBeat() {
  std::fflush(stdout);
  const pid_t child = ::fork();
  if (child == 0) {
    const uint64_t beat = ctrun::heartbeat();
    std::printf("child %llu %d\n", static_cast<unsigned long long>(beat), ctrun::worker::heartbeat_enabled() ? 1 : 0);
    std::fflush(stdout);
    ::_exit(0);
  }
  int status = 0;
  if (child < 0 || ::waitpid(child, &status, 0) != child) return 1;
  std::printf("parent %llu\n", static_cast<unsigned long long>(ctrun::heartbeat()));
  return 0;
}

int main(int argc, char** argv) {
  namespace cw = ctrun::worker;
  if (argc < 2) return 2;
  const std::string mode = argv[1];
  if (mode == "snapshot-writer" && argc >= 3) {
    cw::SnapshotOptions o;
    o.dir = argv[2];
    o.keep_last = 2;
    cw::SnapshotStore store(o);
    uint64_t step = argc >= 4 ? std::strtoull(argv[3], nullptr, 10) : 1;
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    for (;; ++step) {
      store.save(step, ctrun::testing::Pattern(step));
      std::printf("saved %llu\n", static_cast<unsigned long long>(step));
    }
  }
  if (mode == "snapshot-open" && argc >= 3) {
    cw::SnapshotOptions o;
    o.dir = argv[2];
    cw::SnapshotStore store(o);
    return 0;
  }
  if (mode == "heartbeat" && argc >= 3) {
    uint64_t last = 0;
    for (int i = 0; i < std::atoi(argv[2]); ++i) last = ctrun::heartbeat();
    std::printf("%llu\n", static_cast<unsigned long long>(last));
    return 0;
  }
  if (mode == "heartbeat-flags" && argc >= 3) {
    uint64_t last = 0;
    for (int i = 0; i < std::atoi(argv[2]); ++i) last = ctrun::heartbeat();
    const char* fd_env = std::getenv("CTRUN_HEARTBEAT_FD");
    const int fd = fd_env ? std::atoi(fd_env) : -1;
    const int fd_flags = ::fcntl(fd, F_GETFD), fl_flags = ::fcntl(fd, F_GETFL);
    if (fd_flags < 0 || fl_flags < 0) return 1;
    std::printf("%llu cloexec=%d nonblock=%d\n", static_cast<unsigned long long>(last), (fd_flags & FD_CLOEXEC) ? 1 : 0,
                (fl_flags & O_NONBLOCK) ? 1 : 0);
    return 0;
  }
  if (mode == "heartbeat-fork") {
    (void)ctrun::heartbeat();
    return ForkedChildThenParentBeat();
  }
  if (mode == "heartbeat-pause" && argc >= 3) {  // N beats, "paused", waits for a line, N beats
    const int n = std::atoi(argv[2]);
    for (int i = 0; i < n; ++i) (void)ctrun::heartbeat();
    std::printf("paused\n");
    std::fflush(stdout);
    char line[8];
    if (!std::fgets(line, sizeof line, stdin)) return 1;
    for (int i = 0; i < n; ++i) (void)ctrun::heartbeat();
    return 0;
  }
  if (mode == "heartbeat-early") {  // helpers started before the first beat
    std::fflush(stdout);
    if (std::system("if [ -e /proc/$$/fd/$CTRUN_HEARTBEAT_FD ]; then echo exec inherited; else echo exec closed; fi") != 0)
      return 1;
    return ForkedChildThenParentBeat();
  }
  if (mode == "launch-env") {
    std::printf("rank %d\n", cw::LaunchEnv::from_env().rank);
    return 0;
  }
  if (mode == "throw") {
    cw::install_terminate_handler();
    throw std::runtime_error("boom from the helper");
  }
  if (mode == "record" && argc >= 3) return cw::record_error(argv[2], cw::native_backtrace()) ? 0 : 1;
  return 2;
}
