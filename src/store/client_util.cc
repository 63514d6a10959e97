#include "store/client_util.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

namespace ctrun::store {

bool RetryableConnectError(int err) {
  return err == ECONNREFUSED || err == ETIMEDOUT || err == ENETUNREACH || err == EHOSTUNREACH ||
         err == ECONNRESET || err == EAGAIN || err == ECONNABORTED || err == EADDRNOTAVAIL;
}

Request MakeRequest(Op op, std::vector<std::string> keys, std::vector<std::string> values) {
  Request r;
  r.op = op;
  r.keys = std::move(keys);
  r.values = std::move(values);
  return r;
}

Request AuthRequest(const std::string& token) { return MakeRequest(Op::kAuth, {}, {token}); }

Request ValidateRequest() {
  Request r = MakeRequest(Op::kValidate);
  r.u32 = kValidationMagic;
  return r;
}

void TunePeerSocket(int fd, Duration op_timeout) {
  auto set = [fd](int level, int opt, int v) { ::setsockopt(fd, level, opt, &v, sizeof v); };
  const auto secs = std::chrono::duration_cast<std::chrono::seconds>(op_timeout).count();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(op_timeout).count();
  set(IPPROTO_TCP, TCP_NODELAY, 1);
  set(SOL_SOCKET, SO_KEEPALIVE, 1);
  set(IPPROTO_TCP, TCP_KEEPIDLE, static_cast<int>(std::clamp<int64_t>(secs / 2, 1, 1 << 15)));
  set(IPPROTO_TCP, TCP_KEEPINTVL, static_cast<int>(std::clamp<int64_t>(secs / 6, 1, 1 << 15)));
  set(IPPROTO_TCP, TCP_KEEPCNT, 3);
  set(IPPROTO_TCP, TCP_USER_TIMEOUT, static_cast<int>(std::clamp<int64_t>(ms, 1000, 1 << 30)));
}

std::string KeyList(const std::vector<std::string>& keys) {
  std::string s = "[";
  for (size_t i = 0; i < keys.size() && i < 8; ++i) s += (i ? ", " : "") + keys[i];
  if (keys.size() > 8) s += ", ...";
  return s + "]";
}

}  // namespace ctrun::store
