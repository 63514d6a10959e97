#include "sys/free_port.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <fstream>
#include <random>

#include "base/unique_fd.h"

namespace ctrun {
namespace {

constexpr int kFirst = 10000;  // below: well-known services' ports are dense
constexpr int kAvoidFirst = 29000, kAvoidEnd = 30000;  // torchrun's defaults and their neighbours

}  // namespace

UniqueFd BindLoopback(int port, int* bound) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof addr;
  if (fd && (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
             ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0))
    fd.reset();
  *bound = fd ? ntohs(addr.sin_port) : 0;
  return fd;
}

int EphemeralPortsStart(const std::string& path) {
  std::ifstream in(path);
  int low = 0;
  return in >> low && low > 0 ? low : 32768;
}

std::vector<int> FindFreePorts(int n) {
  const int end = EphemeralPortsStart();
  const bool below = end - kFirst - (kAvoidEnd - kAvoidFirst) > 64 * n;
  std::mt19937 pick(std::random_device{}());
  std::vector<UniqueFd> held;  // every port stays bound until all are drawn: they are distinct
  std::vector<int> ports;
  for (int tries = 0; below && static_cast<int>(ports.size()) < n && tries < 64 * n; ++tries) {
    const int draw = std::uniform_int_distribution<int>(kFirst, end - 1)(pick);
    if (draw >= kAvoidFirst && draw < kAvoidEnd) continue;
    int port = 0;
    if (UniqueFd fd = BindLoopback(draw, &port)) {  // else in use, or drawn twice
      held.push_back(std::move(fd));
      ports.push_back(port);
    }
  }
  while (static_cast<int>(ports.size()) < n) {
    int port = 0;
    if (UniqueFd fd = BindLoopback(0, &port)) held.push_back(std::move(fd));
    ports.push_back(port);
  }
  return ports;
}

}  // namespace ctrun
