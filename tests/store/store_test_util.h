// Helpers for the store tests: hex fixtures, a StoreServer running on its own loop thread, raw
// blocking sockets with timeouts, and deadline polling (no sleeps).
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/unique_fd.h"
#include "store/store_server.h"
#include "sys/event_loop.h"

namespace ctrun::store::testing {

// "00 0400000000000000 2f66" -> bytes; spaces ignored.
inline std::string Hex(std::string_view h) {
  std::string out;
  int hi = -1;
  for (char ch : h) {
    int v;
    if (ch >= '0' && ch <= '9') v = ch - '0';
    else if (ch >= 'a' && ch <= 'f') v = ch - 'a' + 10;
    else if (ch >= 'A' && ch <= 'F') v = ch - 'A' + 10;
    else continue;
    if (hi < 0) {
      hi = v;
    } else {
      out.push_back(static_cast<char>(hi * 16 + v));
      hi = -1;
    }
  }
  return out;
}

inline std::string ToHex(std::string_view b) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (unsigned char c : b) {
    s.push_back(d[c >> 4]);
    s.push_back(d[c & 15]);
  }
  return s;
}

inline bool WaitFor(const std::function<bool()>& pred,
                    std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return pred();
    ::poll(nullptr, 0, 2);  // a bounded poll interval against a deadline, not a fixed sleep
  }
  return true;
}

// A StoreServer whose EventLoop runs on a background thread.
class ServerThread {
 public:
  explicit ServerThread(const ServerOptions& opts = {}) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) std::abort();
    wake_r_.reset(p[0]);
    wake_w_.reset(p[1]);
    auto s = StoreServer::Start(loop_, opts);
    if (!s.ok()) {
      error_ = s.message();
      return;
    }
    server_ = std::move(*s);
    if (Status st = loop_.AddFd(wake_r_.get(), EPOLLIN, [this](uint32_t) { RunQueued(); }); !st.ok()) {
      error_ = st.message();  // ok() stays false: no thread was started
      return;
    }
    thread_ = std::thread([this] {
      while (!stop_.load()) loop_.RunOnce(std::chrono::milliseconds(100));
      server_.reset();
    });
  }
  ~ServerThread() {
    if (thread_.joinable()) {
      stop_ = true;
      loop_.Wake();
      thread_.join();
    }
  }
  bool ok() const { return thread_.joinable(); }
  const std::string& error() const { return error_; }
  int port() const { return server_->port(); }  // fixed once started
  StoreServer& server() { return *server_; }

  // Runs fn on the loop thread and waits for it to finish.
  void RunOnLoop(std::function<void()> fn) {
    std::promise<void> done;
    auto fut = done.get_future();
    {
      std::lock_guard<std::mutex> l(mu_);
      queued_.push_back([&] {
        fn();
        done.set_value();
      });
    }
    char b = 1;
    (void)!::write(wake_w_.get(), &b, 1);
    fut.wait();
  }

 private:
  void RunQueued() {
    char buf[64];
    while (::read(wake_r_.get(), buf, sizeof buf) > 0) {
    }
    std::vector<std::function<void()>> q;
    {
      std::lock_guard<std::mutex> l(mu_);
      q.swap(queued_);
    }
    for (auto& f : q) f();
  }

  EventLoop loop_;
  std::unique_ptr<StoreServer> server_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  UniqueFd wake_r_, wake_w_;
  std::mutex mu_;
  std::vector<std::function<void()>> queued_;
  std::string error_;
};

// Blocking loopback connection with 5 s send/receive timeouts. A `receive_buffer` (bytes, 0: the
// default) is set before connecting, so the window it advertises stays that small: a slow reader
// whose kernel cannot absorb a large reply on its behalf.
inline UniqueFd RawConnect(int port, int receive_buffer = 0) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (receive_buffer > 0) ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof receive_buffer);
  timeval tv{5, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return {};
  return fd;
}

inline bool SendAll(int fd, std::string_view b) {
  while (!b.empty()) {
    ssize_t n = ::send(fd, b.data(), b.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    b.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// Receives exactly n bytes, or fewer on EOF/error/timeout.
inline std::string RecvN(int fd, size_t n) {
  std::string out;
  char buf[65536];
  while (out.size() < n) {
    ssize_t got = ::recv(fd, buf, std::min(sizeof buf, n - out.size()), 0);
    if (got <= 0) break;
    out.append(buf, static_cast<size_t>(got));
  }
  return out;
}

// True once the peer closed the connection (EOF or reset) within the timeout.
inline bool PeerClosed(int fd, std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left < 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) <= 0) return false;
    ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN)) return true;
  }
}

inline size_t RssBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  long pages = 0, rss = 0;
  if (f) {
    if (std::fscanf(f, "%ld %ld", &pages, &rss) != 2) rss = 0;
    std::fclose(f);
  }
  return static_cast<size_t>(rss) * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

// Raises the soft fd limit towards `want`; returns the resulting soft limit.
inline rlim_t RaiseFdLimit(rlim_t want) {
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < want) {
    rl.rlim_cur = std::min(want, rl.rlim_max);
    ::setrlimit(RLIMIT_NOFILE, &rl);
    ::getrlimit(RLIMIT_NOFILE, &rl);
  }
  return rl.rlim_cur;
}

}  // namespace ctrun::store::testing
