// fork/exec for workers. Everything is prepared in the parent (argv/envp arrays, opened files,
// pipes); the child runs only async-signal-safe calls, like a signal handler (folly
// prepareChild). Signals stay blocked across fork so no handler can run in the child before the
// original mask is restored. With a rank cgroup the child is made by clone3(CLONE_INTO_CGROUP)
// instead of fork (same copy of the parent, same child code), where the kernel allows it.
#include <fcntl.h>
#include <sched.h>
#include <linux/close_range.h>
#include <linux/sched.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cerrno>
#include <csignal>
#include <cstring>

#include "process/spawner.h"
#include "process/exec_pipe.h"
#include "process/stdio_plumbing.h"
#include "sys/pidfd.h"
#include "sys/posix_util.h"
#include "sys/pty.h"
#include "sys/signals.h"

namespace ctrun {

void CloexecFrom3() {
#ifdef SYS_close_range
  if (::syscall(SYS_close_range, 3u, ~0u, CLOSE_RANGE_CLOEXEC) == 0) return;
#endif
  long max = ::sysconf(_SC_OPEN_MAX);
  if (max < 0 || max > 65536) max = 65536;
  for (int fd = 3; fd < max; ++fd) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
}

void ResetChildSignals(const sigset_t& mask) {
  // Dispositions set to SIG_IGN survive exec; give the worker defaults and the original mask.
  for (int s = 1; s < NSIG; ++s) {
    if (s == SIGKILL || s == SIGSTOP) continue;
    struct sigaction sa;
    if (::sigaction(s, nullptr, &sa) == 0 && sa.sa_handler == SIG_IGN) ::signal(s, SIG_DFL);
  }
  ::sigprocmask(SIG_SETMASK, &mask, nullptr);
}

namespace {

UniqueFd OpenTarget(const StdioTarget& t) {
  if (t.kind == StdioTarget::Kind::kDevNull)
    return UniqueFd(RetryOnEintr([] { return ::open("/dev/null", O_RDWR | O_CLOEXEC); }));
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | O_TRUNC;
  return UniqueFd(RetryOnEintr([&] { return ::open(t.path.c_str(), flags, 0644); }));
}

}  // namespace

// `input`: fd 0 (the parent keeps a pipe's write end instead of its read end).
bool PrepareStdio(const StdioTarget& t, bool input, StdioPlumbing* p, std::string* what) {
  switch (t.kind) {
    case StdioTarget::Kind::kInherit:
      return true;
    case StdioTarget::Kind::kPipe: {
      int fds[2];
      if (::pipe2(fds, O_CLOEXEC) != 0) {
        *what = "pipe2";
        return false;
      }
      p->parent_end.reset(fds[input ? 1 : 0]);
      p->child_end.reset(fds[input ? 0 : 1]);
      SetNonBlocking(p->parent_end.get(), true);  // the pipe's size is the relay's business (ConsoleOptions)
      return true;
    }
    case StdioTarget::Kind::kPty: {
      auto pty = OpenPty(WindowSize{t.rows, t.cols});
      if (!pty.ok()) {
        *what = pty.message();
        errno = EIO;  // the message names the failing step and its errno already
        return false;
      }
      p->parent_end = std::move(pty->master);
      p->child_end = std::move(pty->slave);
      return true;
    }
    case StdioTarget::Kind::kFile:
    case StdioTarget::Kind::kDevNull:
      p->child_end = OpenTarget(t);
      if (!p->child_end) {
        *what = "open " + (t.path.empty() ? std::string("/dev/null") : t.path);
        return false;
      }
      return true;
  }
  return true;
}

namespace {

// A CPU mask for sched_setaffinity, allocated in the parent (the child only reads it).
class CpuMask {
 public:
  explicit CpuMask(const std::vector<int>& cpus) {
    if (cpus.empty()) return;
    const int max = *std::max_element(cpus.begin(), cpus.end());
    set_ = CPU_ALLOC(max + 1);
    size_ = CPU_ALLOC_SIZE(max + 1);
    CPU_ZERO_S(size_, set_);
    for (int c : cpus)
      if (c >= 0) CPU_SET_S(static_cast<size_t>(c), size_, set_);
  }
  ~CpuMask() {
    if (set_) CPU_FREE(set_);
  }
  CpuMask(const CpuMask&) = delete;
  CpuMask& operator=(const CpuMask&) = delete;
  const cpu_set_t* set() const { return set_; }
  size_t size() const { return size_; }

 private:
  cpu_set_t* set_ = nullptr;
  size_t size_ = 0;
};

// Everything the child needs between fork and exec, computed in the parent. The child only reads
// it (plain values and pointers into the parent's memory, which the child has a copy of).
struct ChildPlan {
  const char* exe = nullptr;
  char* const* argv = nullptr;
  char* const* envp = nullptr;
  const sigset_t* mask = nullptr;
  const struct rlimit* nofile = nullptr;  // null: leave RLIMIT_NOFILE alone
  pid_t parent = -1;
  int in_fd = -1, out_fd = -1, err_fd = -1;
  int error_pipe = -1;
  int cgroup_procs_fd = -1;  // -1 also when the child was created in its cgroup (CLONE_INTO_CGROUP)
  int extra_fd = -1, extra_target = 3;
  const CpuMask* affinity = nullptr;
  bool stop_before_exec = false;
};

// The child's side: async-signal-safe calls only, then exec (or a record on the error pipe and
// _exit(127)). Called in a fork()ed child and in a clone3()d one alike.
[[noreturn]] void ExecChild(const ChildPlan& p) {
  int ew = p.error_pipe;
  if (::setpgid(0, 0) != 0) ReportChildFailure(ew, ChildStage::kSetpgid);
  // Joining the cgroup is best effort: without it the descendant sweep still finds what escapes.
  if (p.cgroup_procs_fd >= 0) (void)!::write(p.cgroup_procs_fd, "0", 1);
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) ReportChildFailure(ew, ChildStage::kPdeathsig);
  // The parent may have died between fork and prctl; then no signal will ever come.
  if (::getppid() != p.parent) ::_exit(128 + SIGKILL);
  if (p.in_fd >= 0 && ::dup2(p.in_fd, 0) < 0) ReportChildFailure(ew, ChildStage::kDup);
  if (p.out_fd >= 0 && ::dup2(p.out_fd, 1) < 0) ReportChildFailure(ew, ChildStage::kDup);
  if (p.err_fd >= 0 && ::dup2(p.err_fd, 2) < 0) ReportChildFailure(ew, ChildStage::kDup);
  // Second guard against leaks: whatever was not created CLOEXEC is closed at exec too.
  CloexecFrom3();
  if (p.extra_fd >= 0) {
    // The error pipe must survive the dup2 onto extra_target: move it out of the way first.
    if (ew == p.extra_target) {
      const int moved = ::fcntl(ew, F_DUPFD_CLOEXEC, p.extra_target + 1);
      if (moved < 0) ReportChildFailure(ew, ChildStage::kDup);
      ew = moved;
    }
    const int r = p.extra_fd == p.extra_target ? ::fcntl(p.extra_target, F_SETFD, 0) : ::dup2(p.extra_fd, p.extra_target);
    if (r < 0) ReportChildFailure(ew, ChildStage::kDup);
  }
  ResetChildSignals(*p.mask);
  if (p.nofile) ::setrlimit(RLIMIT_NOFILE, p.nofile);  // the user's limit, not ours
  if (p.affinity && p.affinity->set() && ::sched_setaffinity(0, p.affinity->size(), p.affinity->set()) != 0)
    ReportChildFailure(ew, ChildStage::kAffinity);
  if (p.stop_before_exec) ::raise(SIGSTOP);  // a debugger attaches, then continues us into exec
  ::execve(p.exe, p.argv, p.envp);
  ReportChildFailure(ew, ChildStage::kExec);
}

// clone3(CLONE_INTO_CGROUP | CLONE_PIDFD): a fork whose child starts life in the cgroup of
// `cgroup_dir_fd` (no write to cgroup.procs: that migration takes the kernel's cgroup threadgroup
// lock for writing, which waits for an RCU grace period, ~5-15 ms per batch of spawns on the
// development VM) and whose pidfd comes with it. Returns the pid (0 in the child, which must then
// only make async-signal-safe calls: glibc's fork bookkeeping did not run) or -1 with errno.
// Kernels before 5.7 answer ENOSYS, E2BIG or EINVAL; the caller then forks as before.
pid_t CloneIntoCgroup(int cgroup_dir_fd, int* pidfd) {
#if defined(SYS_clone3) && defined(CLONE_INTO_CGROUP)
  struct clone_args args {};
  args.flags = CLONE_INTO_CGROUP | CLONE_PIDFD;
  args.pidfd = reinterpret_cast<uintptr_t>(pidfd);
  args.exit_signal = SIGCHLD;
  args.cgroup = static_cast<uint64_t>(cgroup_dir_fd);
  return static_cast<pid_t>(::syscall(SYS_clone3, &args, sizeof args));
#else
  (void)cgroup_dir_fd;
  (void)pidfd;
  errno = ENOSYS;
  return -1;
#endif
}

// Whether clone3 with CLONE_INTO_CGROUP may work here; false after the kernel said it cannot.
std::atomic<bool> clone_into_cgroup_usable{true};

bool KernelLacksCloneIntoCgroup(int err) { return err == ENOSYS || err == E2BIG || err == EINVAL; }

}  // namespace

bool PosixSpawner::Fork(const SpawnSpec& spec, bool clone_into_cgroup, PendingChild* out, SpawnError* error) {
  auto fail = [&](const std::string& what, int err) {
    error->err = err;
    error->shell_code = 1;
    error->message = "cannot start " + (spec.argv.empty() ? std::string("worker") : spec.argv[0]) +
                     ": " + what + ": " + std::strerror(err);
    return false;
  };
  if (spec.argv.empty()) return fail("empty argv", EINVAL);

  // --- everything the child needs, built before fork -------------------------------------------
  const std::string& exe = spec.executable.empty() ? spec.argv[0] : spec.executable;
  std::vector<char*> argv;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  StdioPlumbing in_p, out_p, err_p;
  std::string what;
  if (!PrepareStdio(spec.stdin_target, /*input=*/true, &in_p, &what)) return fail(what, errno);
  if (!PrepareStdio(spec.stdout_target, /*input=*/false, &out_p, &what)) return fail(what, errno);
  if (!PrepareStdio(spec.stderr_target, /*input=*/false, &err_p, &what)) return fail(what, errno);
  int errpipe[2];
  if (::pipe2(errpipe, O_CLOEXEC) != 0) return fail("pipe2", errno);
  UniqueFd err_read(errpipe[0]), err_write(errpipe[1]);

  struct rlimit orig_nofile;
  ChildPlan plan;
  plan.exe = exe.c_str();
  plan.argv = argv.data();
  plan.envp = envp.data();
  plan.mask = &OriginalSignalMask();
  plan.nofile = OriginalFdLimit(&orig_nofile) ? &orig_nofile : nullptr;
  plan.parent = ::getpid();
  plan.in_fd = in_p.child_end.get();
  plan.out_fd = out_p.child_end.get();
  plan.err_fd = err_p.child_end.get();
  plan.error_pipe = err_write.get();
  plan.extra_fd = spec.extra_fd;
  plan.extra_target = spec.extra_fd_target;
  CpuMask affinity(spec.cpu_affinity);
  plan.affinity = &affinity;
  plan.stop_before_exec = spec.stop_before_exec;

  // Straight into the rank's cgroup when the kernel can; otherwise fork, and the child joins it.
  pid_t pid = -1;
  int pidfd = -1;
  bool placed = false;
  if (clone_into_cgroup && spec.cgroup_dir_fd >= 0 && clone_into_cgroup_usable.load(std::memory_order_relaxed)) {
    pid = CloneIntoCgroup(spec.cgroup_dir_fd, &pidfd);
    if (pid == 0) ExecChild(plan);
    placed = pid > 0;
    if (pid < 0 && KernelLacksCloneIntoCgroup(errno)) clone_into_cgroup_usable.store(false, std::memory_order_relaxed);
  }
  if (!placed) {
    plan.cgroup_procs_fd = spec.cgroup_procs_fd;
    pid = ::fork();
    if (pid < 0) return fail("fork", errno);
    if (pid == 0) ExecChild(plan);
  }

  // ---- parent ----
  ::setpgid(pid, pid);  // also from here: closes the race with killpg
  out->pid = pid;
  out->argv0 = spec.argv[0];
  out->stopped_before_exec = plan.stop_before_exec;
  out->error_pipe = std::move(err_read);
  out->proc.pid = pid;
  out->proc.pidfd = pidfd >= 0 ? UniqueFd(pidfd) : PidfdOpen(pid);
  out->proc.stdout_pipe = std::move(out_p.parent_end);
  out->proc.stderr_pipe = std::move(err_p.parent_end);
  out->proc.stdin_pipe = std::move(in_p.parent_end);
  return true;  // err_write and the child's stdio ends close here, in the parent
}

bool PosixSpawner::Collect(PendingChild& child, TimePoint deadline, SpawnedProcess* out, SpawnError* error) {
  if (child.stopped_before_exec) {  // it waits for a debugger: nothing to confirm yet
    *out = std::move(child.proc);
    return true;
  }
  ChildError ce{};
  switch (AwaitExec(child.error_pipe.get(), deadline, &ce)) {
    case ExecOutcome::kExeced:
      *out = std::move(child.proc);
      return true;
    case ExecOutcome::kUnconfirmed:
      // Stuck in exec (a hung file system?): the caller owns it like any started worker, so its
      // signals, grace period and SIGKILL apply; a late exec failure shows as exit code 127.
      *out = std::move(child.proc);
      out->exec_confirmed = false;
      return true;
    case ExecOutcome::kFailed:
      break;
  }
  // The child _exits right after its record. Reap it once it has closed its files (bounded: its
  // exit may flush to a hung file system); past the deadline the agent's reaper gets it instead.
  if (AwaitChildExit(child.error_pipe.get(), deadline)) {
    int st;
    RetryOnEintr([&] { return ::waitpid(child.pid, &st, 0); });
  }
  error->err = ce.err;
  if (ce.stage == ChildStage::kExec) {
    error->shell_code = (ce.err == ENOENT) ? 127 : 126;
    error->message = "cannot execute " + child.argv0 + ": " + std::strerror(ce.err);
  } else {
    error->shell_code = 1;
    error->message =
        "cannot start " + child.argv0 + ": " + ChildStageName(ce.stage) + ": " + std::strerror(ce.err);
  }
  return false;
}

bool PosixSpawner::Spawn(const SpawnSpec& spec, SpawnedProcess* out, SpawnError* error) {
  PendingChild child;
  return Fork(spec, /*clone_into_cgroup=*/true, &child, error) && Collect(child, ExecDeadline(), out, error);
}

void PosixSpawner::SpawnMany(const std::vector<SpawnSpec>& specs, std::vector<SpawnResult>* results) {
  // Fork everything first, then collect: the children's exec (and the kernel work of loading
  // them) overlaps the parent's next forks instead of running one after the other. One deadline
  // for the batch: n stuck execs cost exec_wait once, not n times.
  results->clear();
  results->resize(specs.size());
  std::vector<PendingChild> pending(specs.size());
  for (size_t i = 0; i < specs.size(); ++i)
    (*results)[i].ok = Fork(specs[i], specs.size() <= kCloneIntoCgroupMaxBatch, &pending[i], &(*results)[i].error);
  const TimePoint deadline = ExecDeadline();
  for (size_t i = 0; i < specs.size(); ++i)
    if ((*results)[i].ok)
      (*results)[i].ok = Collect(pending[i], deadline, &(*results)[i].process, &(*results)[i].error);
}

TimePoint PosixSpawner::ExecDeadline() const { return std::chrono::steady_clock::now() + exec_wait_; }

bool PosixSpawner::SignalGroup(pid_t pgid, int sig) { return ::killpg(pgid, sig) == 0; }

bool PosixSpawner::GroupAlive(pid_t pgid) { return ::killpg(pgid, 0) == 0 || errno == EPERM; }

}  // namespace ctrun
