// Free loopback TCP ports for tests that start servers (racy by nature: free a moment ago).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <vector>

namespace ctrun::testing {

// Binds a loopback TCP socket to `port` (0: any); returns the fd (-1 on failure) and sets *bound.
inline int BindLoopback(int port, int* bound) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof addr;
  if (fd >= 0 && (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)) {
    ::close(fd);
    fd = -1;
  }
  *bound = fd >= 0 ? ntohs(addr.sin_port) : 0;
  return fd;
}

// The low end of the kernel's ephemeral port range (32768 when unreadable).
inline int EphemeralPortsStart() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  return in >> low && low > 0 ? low : 32768;
}

// `n` distinct loopback ports that were free a moment ago (all bound at once, then released).
// They are drawn below the ephemeral range: a port from it can be taken, between the draw and the
// server's bind, as the local port of any outgoing connection of a test running alongside (and a
// server then cannot bind it while nothing listens there). Never near torchrun's defaults (29400,
// 29500), which tests of the defaults bind. Ports from the range only when too few lie below it.
inline std::vector<int> FreePorts(int n) {
  constexpr int kFirst = 10000;
  const int end = EphemeralPortsStart();
  std::mt19937 pick(std::random_device{}());
  std::vector<int> fds, ports;
  for (int tries = 0; static_cast<int>(ports.size()) < n && tries < 64 * n && end - kFirst > 64 * n; ++tries) {
    const int draw = std::uniform_int_distribution<int>(kFirst, end - 1)(pick);
    if (draw >= 29000 && draw < 30000) continue;
    int port = 0;
    const int fd = BindLoopback(draw, &port);
    if (fd < 0) continue;  // in use (or the very same port drawn twice)
    fds.push_back(fd);
    ports.push_back(port);
  }
  while (static_cast<int>(ports.size()) < n) {
    int port = 0;
    if (const int fd = BindLoopback(0, &port); fd >= 0) fds.push_back(fd);
    ports.push_back(port);
  }
  for (int fd : fds) ::close(fd);
  return ports;
}

// One such port (0 when none could be bound).
inline int FreePort() { return FreePorts(1)[0]; }

}  // namespace ctrun::testing
