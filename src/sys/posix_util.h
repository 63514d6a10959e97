// Small POSIX helpers: the single EINTR retry helper (no ad-hoc retry loops elsewhere), and
// fd flag helpers.
#pragma once

#include <cerrno>
#include <string>

namespace ctrun {

// Retries fn() while it returns -1 with errno == EINTR. Returns the last result; errno preserved.
template <typename Fn>
auto RetryOnEintr(Fn&& fn) -> decltype(fn()) {
  decltype(fn()) r;
  do {
    r = fn();
  } while (r == -1 && errno == EINTR);
  return r;
}

// Writes all of buf (blocking fd) or returns false with errno set.
bool WriteAll(int fd, const void* buf, size_t len);
// Reads a whole (small) file; false if it cannot be opened.
bool ReadFile(const std::string& path, std::string* out);
bool SetNonBlocking(int fd, bool on);

}  // namespace ctrun
