#include "sys/signals.h"

#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>

#include "sys/posix_util.h"

namespace ctrun {
namespace {
sigset_t g_original_mask;
bool g_mask_saved = false;
}  // namespace

Status BlockAgentSignals(const std::vector<int>& signals) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  for (int s : signals) sigaddset(&set, s);
  sigset_t old;
  if (sigprocmask(SIG_BLOCK, &set, &old) != 0) return Status::Errno("sigprocmask", errno);
  if (!g_mask_saved) {
    g_original_mask = old;
    g_mask_saved = true;
  }
  ::signal(SIGPIPE, SIG_IGN);
  // An inherited SIG_IGN (or SA_NOCLDWAIT) for SIGCHLD makes the kernel reap ctrun's children
  // itself: no exit status, no pidfd event ever reports them.
  ::signal(SIGCHLD, SIG_DFL);
  return Status::Ok();
}

const sigset_t& OriginalSignalMask() {
  if (!g_mask_saved) {
    sigemptyset(&g_original_mask);
    g_mask_saved = true;
  }
  return g_original_mask;
}

StatusOr<SignalFd> SignalFd::Create(const std::vector<int>& signals) {
  sigset_t set;
  sigemptyset(&set);
  for (int s : signals) sigaddset(&set, s);
  int fd = ::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (fd < 0) return Status::Errno("signalfd", errno);
  return SignalFd(UniqueFd(fd));
}

std::vector<ReadSignal> SignalFd::ReadPending() {
  std::vector<ReadSignal> out;
  signalfd_siginfo info[16];
  for (;;) {
    ssize_t n = RetryOnEintr([&] { return ::read(fd_.get(), info, sizeof info); });
    if (n <= 0) break;
    for (size_t i = 0; i < static_cast<size_t>(n) / sizeof(signalfd_siginfo); ++i) {
      const signalfd_siginfo& si = info[i];
      const bool user = si.ssi_code == SI_USER || si.ssi_code == SI_QUEUE || si.ssi_code == SI_TKILL;
      out.push_back({static_cast<int>(si.ssi_signo), user && si.ssi_pid != 0, static_cast<pid_t>(si.ssi_pid)});
    }
  }
  return out;
}

bool RepeatedSignalFilter::IsRepeat(const ReadSignal& s, std::chrono::steady_clock::time_point now) {
  const bool same_sender =
      s.from_process && last_ && last_->from_process && last_->sender == s.sender && last_->signo == s.signo;
  const bool forwarded = last_ && (FromParent(s) || FromParent(*last_));
  const bool repeat = last_ && now - last_at_ <= window_ && (same_sender || forwarded);
  if (!repeat) {
    last_ = s;
    last_at_ = now;
  }
  return repeat;
}

}  // namespace ctrun
