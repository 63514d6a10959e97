#include "sys/posix_util.h"

#include <fcntl.h>
#include <unistd.h>

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

bool SetNonBlocking(int fd, bool on) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0) return false;
  flags = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  return ::fcntl(fd, F_SETFL, flags) == 0;
}

}  // namespace ctrun
