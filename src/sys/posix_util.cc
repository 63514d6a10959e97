#include "sys/posix_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "base/unique_fd.h"

namespace ctrun {

bool WriteAll(int fd, const void* buf, size_t len) {
  const char* p = static_cast<const char*>(buf);
  while (len > 0) {
    ssize_t n = RetryOnEintr([&] { return ::write(fd, p, len); });
    if (n < 0) return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

bool ReadFile(const std::string& path, std::string* out) {
  UniqueFd fd(RetryOnEintr([&] { return ::open(path.c_str(), O_RDONLY | O_CLOEXEC); }));
  if (!fd) return false;
  out->clear();
  char buf[65536];
  for (;;) {
    ssize_t n = RetryOnEintr([&] { return ::read(fd.get(), buf, sizeof buf); });
    if (n < 0) return false;
    if (n == 0) return true;
    out->append(buf, static_cast<size_t>(n));
  }
}

std::string ReadFileHead(const std::string& path, size_t max_bytes) {
  UniqueFd fd(RetryOnEintr([&] { return ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK); }));
  if (!fd) return "";
  std::string head(max_bytes, '\0');
  const ssize_t n = RetryOnEintr([&] { return ::read(fd.get(), head.data(), head.size()); });
  head.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return head;
}

namespace {
struct rlimit g_original_nofile;
bool g_nofile_raised = false;
}  // namespace

void RaiseFdLimit() {
  struct rlimit lim;
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  rlim_t want = lim.rlim_max == RLIM_INFINITY ? (1u << 20) : std::min<rlim_t>(lim.rlim_max, 1u << 20);
  if (lim.rlim_cur >= want) return;
  struct rlimit raised = lim;
  raised.rlim_cur = want;
  if (::setrlimit(RLIMIT_NOFILE, &raised) != 0) return;
  g_original_nofile = lim;
  g_nofile_raised = true;
}

bool OriginalFdLimit(struct rlimit* out) {
  if (!g_nofile_raised) return false;
  *out = g_original_nofile;
  return true;
}

bool SetNonBlocking(int fd, bool on) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0) return false;
  const int want = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  return want == flags || ::fcntl(fd, F_SETFL, want) == 0;  // no second call when already so
}

std::string NumericHost(const sockaddr* addr) {
  char buf[INET6_ADDRSTRLEN] = {0};
  const void* src = nullptr;
  if (addr->sa_family == AF_INET) src = &reinterpret_cast<const sockaddr_in*>(addr)->sin_addr;
  if (addr->sa_family == AF_INET6) src = &reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr;
  if (!src || !::inet_ntop(addr->sa_family, src, buf, sizeof buf)) return "";
  return buf;
}

std::string RandomHex(size_t bytes) {
  unsigned char b[256];
  if (bytes > sizeof b || ::getentropy(b, bytes) != 0) return "";
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < bytes; ++i) {
    s += hex[b[i] >> 4];
    s += hex[b[i] & 15];
  }
  return s;
}

void OccupyClosedStdio() {
  for (int fd = 0; fd < 3; ++fd) {
    if (::fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    const int nul = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (nul < 0) return;
    if (nul != fd) {
      ::dup3(nul, fd, O_CLOEXEC);
      ::close(nul);
    }
  }
}

}  // namespace ctrun
