#include "process/descendants.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <sstream>

#include "base/unique_fd.h"
#include "sys/pidfd.h"
#include "sys/posix_util.h"
#include "sys/proc_fs.h"

namespace ctrun {
namespace {

// The children of pid from /proc/<pid>/task/*/children; false when the kernel lacks the file.
bool ChildrenOf(const std::string& proc_root, pid_t pid, std::vector<pid_t>* out) {
  const std::string task_dir = proc_root + "/" + std::to_string(pid) + "/task";
  bool any_file = false;
  for (pid_t tid : NumericEntries(task_dir)) {
    std::string text;
    if (!ReadFile(task_dir + "/" + std::to_string(tid) + "/children", &text)) continue;
    any_file = true;
    std::istringstream in(text);
    long child = 0;
    while (in >> child) out->push_back(static_cast<pid_t>(child));
  }
  return any_file;
}

// One entry per descendant, parents before their children.
struct Entry {
  pid_t pid = 0;
  pid_t ppid = 0;
};

std::vector<Entry> ScanEdges(pid_t root, const std::string& proc_root) {
  std::map<pid_t, pid_t> parent_of;
  for (pid_t pid : NumericEntries(proc_root))
    if (std::optional<pid_t> ppid = ParentPid(proc_root, pid)) parent_of[pid] = *ppid;
  std::vector<Entry> out;
  for (pid_t d : DescendantsFromParents(root, parent_of)) out.push_back({d, parent_of[d]});
  return out;
}

std::vector<Entry> DescendantEdges(pid_t root, const std::string& proc_root) {
  std::vector<Entry> out;
  std::vector<pid_t> frontier{root};
  std::set<pid_t> seen{root};
  while (!frontier.empty()) {
    std::vector<pid_t> next;
    for (pid_t p : frontier) {
      std::vector<pid_t> kids;
      if (!ChildrenOf(proc_root, p, &kids)) {
        if (p == root) return ScanEdges(root, proc_root);  // no children files in this kernel
        continue;  // p is gone (or exited meanwhile): its children are reparented, seen next round
      }
      for (pid_t c : kids)
        if (seen.insert(c).second) {
          out.push_back({c, p});
          next.push_back(c);
        }
    }
    frontier = std::move(next);
  }
  return out;
}

}  // namespace

std::vector<pid_t> DescendantsFromParents(pid_t root, const std::map<pid_t, pid_t>& parent_of) {
  std::map<pid_t, std::vector<pid_t>> children;
  for (const auto& [pid, ppid] : parent_of)
    if (pid != ppid) children[ppid].push_back(pid);
  std::vector<pid_t> out;
  std::set<pid_t> seen{root};
  std::vector<pid_t> frontier{root};
  while (!frontier.empty()) {
    std::vector<pid_t> next;
    for (pid_t p : frontier)
      for (pid_t c : children[p])
        if (seen.insert(c).second) {
          out.push_back(c);
          next.push_back(c);
        }
    frontier = std::move(next);
  }
  return out;
}

std::vector<pid_t> ListDescendants(pid_t root, const std::string& proc_root) {
  std::vector<pid_t> out;
  for (const Entry& e : DescendantEdges(root, proc_root)) out.push_back(e.pid);
  return out;
}

bool ProcIsOurs() {
  char buf[32];
  const ssize_t n = ::readlink("/proc/self", buf, sizeof buf - 1);
  if (n <= 0) return false;
  buf[n] = '\0';
  return std::to_string(::getpid()) == buf;
}

SweepResult KillDescendants(const std::vector<pid_t>& keep, std::chrono::milliseconds budget) {
  if (!ProcIsOurs()) return {};
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = Clock::now() + budget;
  const pid_t self = ::getpid();
  SweepResult result;
  std::set<pid_t> killed;
  for (;;) {
    std::set<pid_t> spared(keep.begin(), keep.end());
    std::vector<Entry> victims;
    for (const Entry& e : DescendantEdges(self, "/proc")) {
      if (spared.count(e.pid) > 0 || spared.count(e.ppid) > 0) {
        spared.insert(e.pid);
      } else {
        victims.push_back(e);
      }
    }
    if (victims.empty() || Clock::now() >= deadline) {
      for (const Entry& v : victims) result.survivors.push_back(v.pid);
      break;
    }
    // pidfds first: a pidfd names this very process, so neither the kill nor the wait can hit a
    // recycled pid (the ones that are not ctrun's children can be reaped by their own parents).
    // The pid was listed before its pidfd was opened, though: a victim reaped by its parent in
    // between may have left its number to a stranger. The pidfd's process still has the parent
    // the listing saw, or it is not killed (if the pid is recycled after the check, the pidfd
    // names the dead process and the kill fails). Without a pidfd the parent is checked all the
    // same, just before a kill by number (a far smaller window than since the listing).
    std::vector<UniqueFd> fds;
    std::vector<pollfd> pfds;
    for (const Entry& v : victims) {
      const pid_t p = v.pid;
      // A child of ctrun that is already a zombie (e.g. killed with its cgroup) is only reaped.
      siginfo_t info{};
      if (::waitid(P_PID, static_cast<id_t>(p), &info, WEXITED | WNOHANG) == 0 && info.si_pid == p) continue;
      UniqueFd fd = PidfdOpen(p);
      const int open_errno = errno;
      if (!fd && open_errno == ESRCH) continue;  // gone since the listing
      if (ParentPid("/proc", p) != std::optional<pid_t>(v.ppid)) continue;
      if (fd) {
        (void)PidfdSignal(fd, SIGKILL);
        pfds.push_back({fd.get(), POLLIN, 0});
        fds.push_back(std::move(fd));
      } else {
        ::kill(p, SIGKILL);  // no pidfd (Linux < 5.3, or out of fds): by number, after the check
      }
      if (killed.insert(p).second) result.killed.push_back(p);
    }
    // Wait for every pidfd to turn readable (the process exited), within the budget.
    size_t open = pfds.size();
    while (open > 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) break;
      const int n = RetryOnEintr([&] { return ::poll(pfds.data(), pfds.size(), static_cast<int>(left)); });
      if (n <= 0) break;
      for (pollfd& p : pfds)
        if (p.fd >= 0 && p.revents != 0) {
          p.fd = -p.fd - 1;  // poll ignores negative fds
          --open;
        }
    }
    // Reap what is ours; grandchildren reparented to ctrun as their parents died are found (as
    // zombies) and reaped by the next round.
    for (const Entry& v : victims) {
      int st = 0;
      RetryOnEintr([&] { return ::waitpid(v.pid, &st, WNOHANG); });
    }
  }
  return result;
}

}  // namespace ctrun
