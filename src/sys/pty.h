// Pseudo-terminals for workers' output, and the window-size ioctls.
//
// Contract:
//  - OpenPty returns both ends CLOEXEC and O_NOCTTY: opening them never gives ctrun (or anyone)
//    a controlling terminal. The slave's output processing (OPOST) is off, so the bytes a worker
//    writes reach the master unchanged ("\n" stays "\n", no "\r\n"): the relay's line cutting and
//    the log files see exactly what a pipe would have carried.
//  - Reading the master returns the buffered output first, then fails with EIO once every slave
//    fd is closed (the worker and all its descendants are gone): EIO is a pty's end of file.
#pragma once

#include <optional>

#include "base/status.h"
#include "base/unique_fd.h"

namespace ctrun {

struct WindowSize {
  unsigned short rows = 0;
  unsigned short cols = 0;
  bool operator==(const WindowSize&) const = default;
};

struct PtyPair {
  UniqueFd master;
  UniqueFd slave;
};

// A fresh pty with the given window size (0 x 0: left as the kernel makes it).
StatusOr<PtyPair> OpenPty(WindowSize size);

// TIOCGWINSZ on fd; nullopt when fd is not a terminal or reports 0 columns.
std::optional<WindowSize> GetWindowSize(int fd);
// TIOCSWINSZ on fd (a pty master or slave). False on error.
bool SetWindowSize(int fd, WindowSize size);

}  // namespace ctrun
