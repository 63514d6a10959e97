#include "sys/pty.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <termios.h>

#include <cerrno>
#include <cstdlib>

#include "sys/posix_util.h"

namespace ctrun {

StatusOr<PtyPair> OpenPty(WindowSize size) {
  PtyPair p;
  p.master.reset(RetryOnEintr([] { return ::open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC); }));
  if (!p.master) return Status::Errno("open /dev/ptmx", errno);
  if (::grantpt(p.master.get()) != 0) return Status::Errno("grantpt", errno);
  if (::unlockpt(p.master.get()) != 0) return Status::Errno("unlockpt", errno);
#ifdef TIOCGPTPEER
  // Race-free (no path lookup) on Linux >= 4.13.
  p.slave.reset(::ioctl(p.master.get(), TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC));
#endif
  if (!p.slave) {
    char name[128];
    if (::ptsname_r(p.master.get(), name, sizeof name) != 0) return Status::Errno("ptsname", errno);
    p.slave.reset(RetryOnEintr([&] { return ::open(name, O_RDWR | O_NOCTTY | O_CLOEXEC); }));
    if (!p.slave) return Status::Errno(std::string("open ") + name, errno);
  }
  termios t;
  if (::tcgetattr(p.slave.get(), &t) != 0) return Status::Errno("tcgetattr", errno);
  t.c_oflag &= ~static_cast<tcflag_t>(OPOST);
  if (::tcsetattr(p.slave.get(), TCSANOW, &t) != 0) return Status::Errno("tcsetattr", errno);
  if (size.cols > 0 && !SetWindowSize(p.master.get(), size)) return Status::Errno("TIOCSWINSZ", errno);
  return p;
}

std::optional<WindowSize> GetWindowSize(int fd) {
  winsize ws{};
  if (::ioctl(fd, TIOCGWINSZ, &ws) != 0 || ws.ws_col == 0) return std::nullopt;
  return WindowSize{ws.ws_row, ws.ws_col};
}

bool SetWindowSize(int fd, WindowSize size) {
  winsize ws{};
  ws.ws_row = size.rows;
  ws.ws_col = size.cols;
  return ::ioctl(fd, TIOCSWINSZ, &ws) == 0;
}

}  // namespace ctrun
