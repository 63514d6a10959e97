// Small POSIX helpers: the single EINTR retry helper (no ad-hoc retry loops elsewhere), and
// fd flag helpers.
#pragma once

#include <cerrno>
#include <sys/resource.h>

#include <string>

struct sockaddr;

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
// The first bytes of a file, at most max_bytes (one read); "" when it cannot be opened or read.
// For sniffing what a file is (a #! line, an ELF header, text).
std::string ReadFileHead(const std::string& path, size_t max_bytes);
bool SetNonBlocking(int fd, bool on);

// Raises this process's soft RLIMIT_NOFILE to the hard limit (at most 1<<20): the agent holds a
// pidfd and up to two pipes per worker plus store connections, which a 1024 soft limit cannot
// take for large jobs. The original limit is remembered so workers get it back (some programs
// still use select()).
void RaiseFdLimit();
// Puts /dev/null, close-on-exec, on each of fds 0-2 that ctrun inherited closed, before ctrun
// opens anything: otherwise its own signalfd, epoll or watchdog pipe lands there, where code that
// sets up a child's stdio overwrites it. Close-on-exec keeps the slot closed for the workers, as
// it was for ctrun (every spawner treats a close-on-exec fd 0-2 as closed).
void OccupyClosedStdio();
// The soft/hard limits before RaiseFdLimit; false when it was not called or changed nothing.
bool OriginalFdLimit(struct rlimit* out);

// The numeric address of an AF_INET/AF_INET6 socket address ("10.0.0.1", "::1"); "" otherwise.
std::string NumericHost(const sockaddr* addr);

// 2 x `bytes` hex digits from the kernel's CSPRNG (getentropy, at most 256 bytes); "" when the
// kernel refuses.
std::string RandomHex(size_t bytes);

}  // namespace ctrun
