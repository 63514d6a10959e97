// ctrun_store_server: runs one StoreServer for Python tests and benchmarks.
//
//   ctrun_store_server [--host H] [--port P] [--token T] [--max-connections N] [--ignore-stdin]
//
// Prints "PORT <n>" on stdout once listening, then serves until SIGTERM/SIGINT or EOF on stdin
// (so a parent that dies takes it along). Signals are read from a signalfd in the loop; no work
// happens in a signal handler.
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <spdlog/spdlog.h>

#include "store/store_server.h"
#include "sys/event_loop.h"

int main(int argc, char** argv) {
  ctrun::store::ServerOptions opts;
  bool watch_stdin = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "ctrun_store_server: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--host") opts.bind_host = next();
    else if (a == "--port") opts.port = std::atoi(next().c_str());
    else if (a == "--token") opts.token = next();
    else if (a == "--max-connections") opts.max_connections = std::strtoull(next().c_str(), nullptr, 10);
    else if (a == "--ignore-stdin") watch_stdin = false;
    else if (a == "--verbose") spdlog::set_level(spdlog::level::debug);
    else {
      std::fprintf(stderr, "ctrun_store_server: unknown argument %s\n", a.c_str());
      return 2;
    }
  }

  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigprocmask(SIG_BLOCK, &mask, nullptr);
  signal(SIGPIPE, SIG_IGN);
  ctrun::UniqueFd sfd(signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));

  ctrun::EventLoop loop;
  auto server = ctrun::store::StoreServer::Start(loop, opts);
  if (!server.ok()) {
    std::fprintf(stderr, "ctrun_store_server: %s\n", server.message().c_str());
    return 1;
  }
  if (ctrun::Status s = loop.AddFd(sfd.get(), EPOLLIN, [&](uint32_t) { loop.Stop(); }); !s.ok()) {
    std::fprintf(stderr, "ctrun_store_server: %s\n", s.message().c_str());
    return 1;
  }
  if (watch_stdin) {
    // Fails (EPERM) for a regular file or /dev/null: then stdin is simply not watched.
    (void)loop.AddFd(STDIN_FILENO, EPOLLIN, [&](uint32_t) {
      char buf[256];
      ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) loop.Stop();
    });
  }
  std::printf("PORT %d\n", (*server)->port());
  std::fflush(stdout);
  loop.Run();
  server->reset();
  return 0;
}
