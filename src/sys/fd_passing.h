// Datagrams with fds attached (SCM_RIGHTS) over AF_UNIX sockets: the warm spawner
// (src/warm/warm_spawner.cc) and the C++ warm server (src/worker/warm_main.cc) speak through it.
// Header-only: the worker library compiles it without linking the agent's layers.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "base/unique_fd.h"
#include "sys/posix_util.h"

namespace ctrun {

// At most this many fds travel with one message (a worker's fds 0-2 and its heartbeat fd).
inline constexpr size_t kMaxPassedFds = 4;

// One datagram of `data` with `fds` attached; MSG_NOSIGNAL (a dead peer is EPIPE, not SIGPIPE).
inline bool SendWithFds(int sock, std::string_view data, const std::vector<int>& fds = {}) {
  iovec iov{const_cast<char*>(data.data()), data.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  return RetryOnEintr([&] { return ::sendmsg(sock, &msg, MSG_NOSIGNAL); }) == static_cast<ssize_t>(data.size());
}

// One datagram of at most `max` bytes into *text (blocking). The fds that came with it are
// CLOEXEC and appended to *fds, or closed when fds is null. Returns the byte count: 0 on EOF,
// -1 on error (*text then empty).
inline ssize_t ReceiveWithFds(int sock, size_t max, std::string* text, std::vector<UniqueFd>* fds) {
  text->assign(max, '\0');
  iovec iov{text->data(), text->size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  const ssize_t n = RetryOnEintr([&] { return ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC); });
  for (cmsghdr* c = n >= 0 ? CMSG_FIRSTHDR(&msg) : nullptr; c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      if (fds) fds->emplace_back(fd);
      else ::close(fd);
    }
  }
  text->resize(n > 0 ? static_cast<size_t>(n) : 0);
  return n;
}

}  // namespace ctrun
