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
#include <memory>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "process/spawner.h"
#include "process/exec_pipe.h"
#include "process/spawn_thread.h"
#include "process/vfork_clone.h"
#include "process/watchdog.h"
#include "process/stdio_plumbing.h"
#include "sys/high_fd.h"
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

sigset_t IgnoredSignals() {
  sigset_t ignored;
  ::sigemptyset(&ignored);
  for (int s = 1; s < NSIG; ++s) {
    if (s == SIGKILL || s == SIGSTOP) continue;
    struct sigaction sa;
    if (::sigaction(s, nullptr, &sa) == 0 && sa.sa_handler == SIG_IGN) ::sigaddset(&ignored, s);
  }
  return ignored;
}

void ResetChildSignals(const sigset_t& ignored, const sigset_t& mask) {
  // Dispositions set to SIG_IGN survive exec; give the worker defaults and the original mask.
  // An ignored signal raised in the child before this, while blocked, was queued all the same (a
  // write to a watchdog killed by hand raises SIGPIPE): with its default back it would kill the
  // child once the mask is restored (every restart died of SIGPIPE). Setting SIG_IGN again
  // discards it first.
  sigset_t pending;
  if (::sigpending(&pending) != 0) ::sigemptyset(&pending);
  for (int s = 1; s < NSIG; ++s) {
    if (::sigismember(&ignored, s) != 1) continue;
    if (::sigismember(&pending, s) == 1) ::signal(s, SIG_IGN);
    ::signal(s, SIG_DFL);
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
      // A fresh pipe end has no status flag but its access mode, which F_SETFL leaves alone: no
      // F_GETFL needed. The pipe's size is the relay's business (ConsoleOptions).
      ::fcntl(p->parent_end.get(), F_SETFL, O_NONBLOCK);
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

// Everything the child needs between its creation and exec, computed in the parent. The child only
// reads it.
struct ChildPlan {
  const char* exe = nullptr;
  char* const* argv = nullptr;
  char* const* envp = nullptr;
  const sigset_t* mask = nullptr;
  const sigset_t* ignored = nullptr;  // IgnoredSignals() of the parent
  const struct rlimit* nofile = nullptr;  // null: leave RLIMIT_NOFILE alone
  pid_t parent = -1;
  int in_fd = -1, out_fd = -1, err_fd = -1;
  int error_pipe = -1;
  int watchdog_fd = -1;
  int cgroup_procs_fd = -1;  // -1 also when the child was created in its cgroup (CLONE_INTO_CGROUP)
  int extra_fd = -1, extra_target = 3;
  const CpuMask* affinity = nullptr;
  bool stop_before_exec = false;
  bool stop_at_entry = false;  // tests: stop first of all (as a child the kernel is slow to run, or a hung exec)
  // Made with CLONE_FILES (a vfork-style child whose descriptors all lie below the high-fd line):
  // first of all it takes a table of its own with the agent's low fds alone (sys/high_fd.h).
  bool unshare_files = false;
};

// Whether a child with this plan may share the agent's fd table until it takes its own below the
// line: every descriptor it uses lies below it.
bool MayShareFiles(const ChildPlan& p) {
  if (!HighFdsReserved()) return false;
  for (int fd : {p.in_fd, p.out_fd, p.err_fd, p.error_pipe, p.watchdog_fd, p.cgroup_procs_fd, p.extra_fd})
    if (fd >= kHighFdLine) return false;
  return true;
}

// The child's side: async-signal-safe calls only, then exec (or a record on the error pipe and
// exit 127). Called in a fork()ed child, a clone3()d one and a vfork-style one (which shares our
// memory: it writes nothing but its own stack and errno) alike.
[[noreturn]] void ExecChild(const ChildPlan& p) {
  int ew = p.error_pipe;
  if (p.stop_at_entry) ::raise(SIGSTOP);
  if (p.unshare_files && !ChildUnshareBelowLine()) ReportChildFailure(ew, ChildStage::kUnshareFiles);
  if (::setpgid(0, 0) != 0) ReportChildFailure(ew, ChildStage::kSetpgid);
  // Before anything of the worker runs (and while we hold the pipe, so the watchdog cannot have
  // seen EOF yet): from here a SIGKILL of ctrun takes the whole group.
  AnnounceGroup(p.watchdog_fd, ::getpid());
  // Joining the cgroup is best effort: without it the descendant sweep still finds what escapes.
  if (p.cgroup_procs_fd >= 0) (void)!::write(p.cgroup_procs_fd, "0", 1);
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) ReportChildFailure(ew, ChildStage::kPdeathsig);
  // The parent may have died between fork and prctl; then no signal will ever come.
  if (::getppid() != p.parent) ExitChild(128 + SIGKILL);
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
  ResetChildSignals(*p.ignored, *p.mask);
  if (p.nofile) ::setrlimit(RLIMIT_NOFILE, p.nofile);  // the user's limit, not ours
  if (p.affinity && p.affinity->set() && ::sched_setaffinity(0, p.affinity->size(), p.affinity->set()) != 0)
    ReportChildFailure(ew, ChildStage::kAffinity);
  if (p.stop_before_exec && !p.stop_at_entry) ::raise(SIGSTOP);  // a debugger attaches, then continues us into exec
  ::execve(p.exe, p.argv, p.envp);
  ReportChildFailure(ew, ChildStage::kExec);
}

[[noreturn]] void ExecChildTrampoline(void* plan) { ExecChild(*static_cast<const ChildPlan*>(plan)); }

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
// Whether vfork-style clones may work here; false after the kernel said it cannot.
std::atomic<bool> vfork_usable{true};

bool KernelLacksCloneIntoCgroup(int err) { return err == ENOSYS || err == E2BIG || err == EINVAL; }

// A vfork-style child's stack. ExecChild needs a few hundred bytes; sanitizers' frames and glibc's
// wrappers get ample room.
constexpr size_t kChildStackSize = 256 * 1024;

}  // namespace

namespace {

// A set-up step in the parent failed: "cannot start ARGV0: WHAT: strerror", shell code 1.
bool StartFailed(const std::string& argv0, const std::string& what, int err, SpawnError* error) {
  error->err = err;
  error->shell_code = 1;
  error->message = "cannot start " + argv0 + ": " + what + ": " + std::strerror(err);
  return false;
}

}  // namespace

// One child to be: its plan and everything the plan points at, in memory of its own (never the
// caller's SpawnSpec: a vfork-style child whose exec hangs may read it after SpawnMany returned),
// and the parent's ends of its plumbing.
struct PosixSpawner::ChildImage {
  std::string argv0;
  std::vector<char> strings;  // the executable's path, then argv's and envp's strings
  std::vector<char*> argv, envp;
  std::unique_ptr<CpuMask> affinity;
  struct rlimit nofile {};
  sigset_t ignored;
  ChildPlan plan;
  StdioPlumbing in, out, err;
  UniqueFd err_read, err_write;
  // The image's own copy of the spec's extra_fd: the caller may close its fd once Spawn returns,
  // while a vfork-style child still in its clone shares our fd table and has yet to dup2 it.
  UniqueFd extra;
  int cgroup_dir_fd = -1;
  int spec_cgroup_procs_fd = -1;  // the spec's, for a fork after all (plan's is -1 when vfork-style)
  bool pending_fork = false;      // not cloned vfork-style: Batch::Finish forks it
  // Written when a vfork-style clone made it (the pid and pidfd by the kernel, before the child
  // runs); read by the agent's thread under VforkBatch::mu.
  pid_t pid = 0;
  int pidfd = -1;
  bool cloned = false;  // the clone call returned (result in clone_result / clone_errno)
  pid_t clone_result = -1;
  int clone_errno = 0;

  // The child's ends of its stdio and of the error pipe, which the parent closes once the child
  // has its own (after the clone: a forked child; after its exec or exit: a vfork-style one).
  void CloseChildEnds() {
    in.child_end.reset();
    out.child_end.reset();
    err.child_end.reset();
    err_write.reset();
    extra.reset();
  }
};

// Fills *image from spec: copies of the strings, pipes, ptys and files, the error pipe. On failure
// returns false with *error filled (shell code 1).
bool PosixSpawner::PrepareChild(const SpawnSpec& spec, const sigset_t& ignored, ChildImage* image,
                                SpawnError* error) {
  auto fail = [&](const std::string& what, int err) {
    return StartFailed(spec.argv.empty() ? std::string("worker") : spec.argv[0], what, err, error);
  };
  if (spec.argv.empty()) return fail("empty argv", EINVAL);
  image->argv0 = spec.argv[0];
  const std::string& exe = spec.executable.empty() ? spec.argv[0] : spec.executable;
  size_t bytes = exe.size() + 1;
  for (const auto& a : spec.argv) bytes += a.size() + 1;
  for (const auto& e : spec.env) bytes += e.size() + 1;
  image->strings.resize(bytes);
  char* at = image->strings.data();
  auto copy = [&](const std::string& str) {
    char* begin = at;
    std::memcpy(at, str.c_str(), str.size() + 1);
    at += str.size() + 1;
    return begin;
  };
  image->plan.exe = copy(exe);
  for (const auto& a : spec.argv) image->argv.push_back(copy(a));
  image->argv.push_back(nullptr);
  for (const auto& e : spec.env) image->envp.push_back(copy(e));
  image->envp.push_back(nullptr);

  std::string what;
  if (!PrepareStdio(spec.stdin_target, /*input=*/true, &image->in, &what)) return fail(what, errno);
  if (!PrepareStdio(spec.stdout_target, /*input=*/false, &image->out, &what)) return fail(what, errno);
  if (!PrepareStdio(spec.stderr_target, /*input=*/false, &image->err, &what)) return fail(what, errno);
  if (spec.extra_fd >= 0) {
    image->extra.reset(::fcntl(spec.extra_fd, F_DUPFD_CLOEXEC, 3));
    if (!image->extra) return fail("dup of fd " + std::to_string(spec.extra_fd), errno);
  }
  int errpipe[2];
  if (::pipe2(errpipe, O_CLOEXEC) != 0) return fail("pipe2", errno);
  image->err_read.reset(errpipe[0]);
  image->err_write.reset(errpipe[1]);
  // The agent's ends live above the high-fd line, out of every later child's copy of the table.
  MoveHigh(&image->in.parent_end);
  MoveHigh(&image->out.parent_end);
  MoveHigh(&image->err.parent_end);
  MoveHigh(&image->err_read);

  ChildPlan& plan = image->plan;
  plan.argv = image->argv.data();
  plan.envp = image->envp.data();
  plan.mask = &OriginalSignalMask();
  image->ignored = ignored;
  plan.ignored = &image->ignored;
  plan.nofile = OriginalFdLimit(&image->nofile) ? &image->nofile : nullptr;
  plan.parent = ::getpid();
  plan.in_fd = image->in.child_end.get();
  plan.out_fd = image->out.child_end.get();
  plan.err_fd = image->err.child_end.get();
  plan.error_pipe = image->err_write.get();
  plan.extra_fd = image->extra.get();
  plan.extra_target = spec.extra_fd_target;
  image->affinity = std::make_unique<CpuMask>(spec.cpu_affinity);
  plan.affinity = image->affinity.get();
  plan.stop_before_exec = spec.stop_before_exec;
  plan.cgroup_procs_fd = image->spec_cgroup_procs_fd = spec.cgroup_procs_fd;
  plan.watchdog_fd = spec.watchdog_fd;
  image->cgroup_dir_fd = spec.cgroup_dir_fd;
  return true;
}

// The vfork-style children of one batch, shared between the agent's thread, which adds images
// while the job on the SpawnThread clones them, and that job, which may outlive the batch (a hung
// exec, see SpawnThread). Everything but `stack` is under `mu`; an image is not touched by the
// agent's thread once added, until the job is done with it (cloned, or the batch cancelled).
// While a child is cloned, the agent's thread makes the next images' pipes: a child that shares
// the agent's fd table takes its own copy of the part below the high-fd line first of all
// (sys/high_fd.h); its own descriptors there were made before its clone and are closed by the
// agent only after it has exec'd or exited, and whatever the agent opens meanwhile is copied too
// and closed by the exec (CLOEXEC).
struct PosixSpawner::VforkBatch {
  std::vector<ChildImage*> children;  // the images to clone, in order; owned by `images`
  std::vector<std::unique_ptr<ChildImage>> images;
  ChildStack stack{kChildStackSize};
  std::mutex mu;
  std::condition_variable added;  // a child was added, or the batch closed or was cancelled
  size_t next = 0;             // the next child the job clones
  ChildImage* in_clone = nullptr;  // the child being cloned right now
  bool closed = false;         // no child comes any more: the job ends when all are cloned
  bool cancelled = false;      // the agent gave up waiting: clone nothing more
  bool adopted = false;        // the agent took in_clone over (its exec hangs)
  Duration clone_delay{};      // tests (Method::kVforkSlowClone): a wait before each clone

  void Add(std::unique_ptr<ChildImage> image) {
    {
      std::lock_guard<std::mutex> lock(mu);
      children.push_back(image.get());
      images.push_back(std::move(image));
    }
    added.notify_one();
  }
  void Close() {
    {
      std::lock_guard<std::mutex> lock(mu);
      closed = true;
    }
    added.notify_one();
  }

  // The job: clones the children one after the other as they come, until the batch is closed
  // and all are cloned, or it is cancelled. A child the kernel made after the agent gave up on
  // it (and so does not know of) is killed here; the agent's reaper collects it as an unknown pid.
  void CloneAll() {
    for (;;) {
      ChildImage* c;
      {
        std::unique_lock<std::mutex> lock(mu);
        added.wait(lock, [this] { return cancelled || closed || next < children.size(); });
        if (cancelled || next == children.size()) return;
        c = in_clone = children[next++];
      }
      if (clone_delay > Duration::zero()) std::this_thread::sleep_for(clone_delay);
      VforkCloneArgs args;
      args.cgroup_dir_fd = c->cgroup_dir_fd;
      args.pidfd = &c->pidfd;
      args.pid = &c->pid;
      args.share_files = c->plan.unshare_files = MayShareFiles(c->plan);
      const pid_t r = VforkClone(args, stack, ExecChildTrampoline, &c->plan);
      const int err = errno;
      std::lock_guard<std::mutex> lock(mu);
      in_clone = nullptr;
      if (cancelled) {
        if (!adopted) {
          if (r > 0) ::kill(r, SIGKILL);
          if (c->pidfd >= 0) ::close(c->pidfd);
        }
        // The agent left this child's descriptors to us: until its exec (or exit), which has
        // just happened, it may have shared our fd table, where a close is its close too (and a
        // number reused meanwhile would be dup2'd onto its stdio).
        c->CloseChildEnds();
        return;
      }
      c->cloned = true;
      c->clone_result = r;
      c->clone_errno = err;
    }
  }
};

bool PosixSpawner::VforkEligible(const SpawnSpec& spec) const {
  if (method_ == Method::kFork || !VforkCloneBuilt() || !vfork_usable.load(std::memory_order_relaxed)) return false;
  // A child stopped before exec would hold the spawn thread until a debugger continues it.
  if (spec.stop_before_exec && method_ != Method::kVforkEvenStopped && method_ != Method::kVforkStoppedAtEntry)
    return false;
  // Joining a cgroup through cgroup.procs waits for an RCU grace period: children forked together
  // wait for one together, vfork-style ones would wait one each, one after the other.
  if (spec.cgroup_dir_fd >= 0) return clone_into_cgroup_usable.load(std::memory_order_relaxed);
  return spec.cgroup_procs_fd < 0;
}

// The parent's side after the child exists: the process record and the pipe to confirm its exec.
void PosixSpawner::Adopt(ChildImage& image, pid_t pid, int pidfd, PendingChild* out) {
  out->pid = pid;
  out->argv0 = image.argv0;
  out->exe = image.plan.exe;
  out->stopped_before_exec = image.plan.stop_before_exec;
  out->error_pipe = std::move(image.err_read);
  out->proc.pid = pid;
  out->proc.pidfd = pidfd >= 0 ? UniqueFd(pidfd) : PidfdOpen(pid);
  MoveHigh(&out->proc.pidfd);
  out->proc.stdout_pipe = std::move(image.out.parent_end);
  out->proc.stderr_pipe = std::move(image.err.parent_end);
  out->proc.stdin_pipe = std::move(image.in.parent_end);
}

bool PosixSpawner::Fork(ChildImage& image, bool clone_into_cgroup, PendingChild* out, SpawnError* error) {
  // As planned for a child of its own (a vfork-style one's plan differs in these).
  image.plan.cgroup_procs_fd = image.spec_cgroup_procs_fd;
  image.plan.stop_at_entry = false;
  image.plan.unshare_files = false;
  // Straight into the rank's cgroup when the kernel can; otherwise fork, and the child joins it.
  pid_t pid = -1;
  int pidfd = -1;
  bool placed = false;
  if (clone_into_cgroup && image.cgroup_dir_fd >= 0 && clone_into_cgroup_usable.load(std::memory_order_relaxed)) {
    const int procs_fd = image.plan.cgroup_procs_fd;
    image.plan.cgroup_procs_fd = -1;
    pid = CloneIntoCgroup(image.cgroup_dir_fd, &pidfd);
    if (pid == 0) ExecChild(image.plan);
    placed = pid > 0;
    if (pid < 0 && KernelLacksCloneIntoCgroup(errno)) clone_into_cgroup_usable.store(false, std::memory_order_relaxed);
    image.plan.cgroup_procs_fd = procs_fd;
  }
  if (!placed) {
    pid = ::fork();
    if (pid < 0) {
      const int err = errno;
      image.CloseChildEnds();
      return StartFailed(image.argv0, "fork", err, error);
    }
    if (pid == 0) ExecChild(image.plan);
  }
  ::setpgid(pid, pid);  // also from here: closes the race with killpg
  Adopt(image, pid, pidfd, out);
  image.CloseChildEnds();  // the child has its own copies now
  return true;
}

namespace {

// The SpawnError of a child's failure record.
SpawnError DescribeChildError(const ChildError& ce, const std::string& argv0, const std::string& exe) {
  SpawnError error;
  error.err = ce.err;
  if (ce.stage == ChildStage::kExec) {
    error.shell_code = (ce.err == ENOENT) ? 127 : 126;
    error.message = "cannot execute " + argv0 + ": " + ExplainExecError(exe, ce.err);
  } else {
    error.shell_code = 1;
    error.message = "cannot start " + argv0 + ": " + ChildStageName(ce.stage) + ": " + std::strerror(ce.err);
  }
  return error;
}

}  // namespace

std::optional<SpawnError> LateExecFailure(const UnconfirmedExec& exec) {
  ChildError ce{};
  if (!exec.pipe.valid() || AwaitExec(exec.pipe.get(), std::chrono::steady_clock::now(), &ce) != ExecOutcome::kFailed)
    return std::nullopt;
  return DescribeChildError(ce, exec.argv0, exec.exe);
}

bool PosixSpawner::Collect(PendingChild& child, TimePoint deadline, SpawnedProcess* out, SpawnError* error) {
  auto hand_over_unconfirmed = [&] {
    *out = std::move(child.proc);
    out->unconfirmed = UnconfirmedExec{std::move(child.error_pipe), child.argv0, child.exe};
    return true;
  };
  // It waits for a debugger: nothing to confirm yet.
  if (child.stopped_before_exec) return hand_over_unconfirmed();
  ChildError ce{};
  switch (AwaitExec(child.error_pipe.get(), deadline, &ce)) {
    case ExecOutcome::kExeced:
      *out = std::move(child.proc);
      return true;
    case ExecOutcome::kUnconfirmed:
      // Stuck in exec (a hung file system?): the caller owns it like any started worker, so its
      // signals, grace period and SIGKILL apply; a late exec failure exits 127 with its record.
      hand_over_unconfirmed();
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
  *error = DescribeChildError(ce, child.argv0, child.exe);
  return false;
}

bool PosixSpawner::Spawn(const SpawnSpec& spec, SpawnedProcess* out, SpawnError* error) {
  std::vector<SpawnResult> results;
  SpawnMany({spec}, &results);
  if (!results[0].ok) {
    *error = std::move(results[0].error);
    return false;
  }
  *out = std::move(results[0].process);
  return true;
}

// BeginBatch's batch. Vfork-style children go to the spawn thread as they are added (the first
// Add posts the job); the rest, and those the kernel refused to clone vfork-style, are forked at
// Finish, which then waits for every exec with one deadline: n stuck execs cost exec_wait once.
class PosixSpawner::Batch final : public SpawnBatch {
 public:
  explicit Batch(PosixSpawner& owner) : owner_(owner), ignored_(owner.Ignored()) {}
  ~Batch() override {
    if (!finished_) {
      std::vector<SpawnResult> ignored;
      Finish(&ignored);
    }
  }

  void Add(const SpawnSpec& spec) override {
    const size_t i = results_.size();
    results_.emplace_back();
    pending_.emplace_back();
    auto image = std::make_unique<ChildImage>();
    if (!PrepareChild(spec, ignored_, image.get(), &results_[i].error)) return;  // ok stays false
    if (owner_.VforkEligible(spec) && StartVfork()) {
      image->plan.cgroup_procs_fd = -1;  // made in its cgroup or none (VforkEligible)
      image->plan.stop_at_entry = (owner_.method_ == Method::kVforkStoppedAtEntry && spec.stop_before_exec) ||
                                  owner_.method_ == Method::kVforkHungExec;
      vfork_index_.push_back(i);
      vfork_->Add(std::move(image));
      return;
    }
    forked_.emplace_back(i, image.get());
    own_.push_back(std::move(image));
  }

  void Finish(std::vector<SpawnResult>* results) override {
    finished_ = true;
    if (vfork_) AdoptVforked();
    // In Add order, whichever way they came here.
    std::sort(forked_.begin(), forked_.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    const bool clone_into_cgroup = results_.size() <= kCloneIntoCgroupMaxBatch;
    for (auto& [i, image] : forked_)
      results_[i].ok = owner_.Fork(*image, clone_into_cgroup, &pending_[i], &results_[i].error);
    const TimePoint deadline = owner_.ExecDeadline();
    for (size_t i = 0; i < results_.size(); ++i)
      if (results_[i].ok)
        results_[i].ok = owner_.Collect(pending_[i], i == held_ ? TimePoint{} : deadline, &results_[i].process,
                                        &results_[i].error);
    *results = std::move(results_);
  }

 private:
  // The spawn thread's job, posted at the first vfork-style child; false when there is no thread
  // (or no stack for the children): the child is forked instead.
  bool StartVfork() {
    if (vfork_) return true;
    if (vfork_failed_) return false;
    thread_ = SpawnThread::Current();
    auto batch = std::make_shared<VforkBatch>();
    if (thread_ == nullptr || !batch->stack.ok()) {
      vfork_failed_ = true;
      return false;
    }
    if (owner_.method_ == Method::kVforkSlowClone) batch->clone_delay = 2 * owner_.exec_wait_;
    vfork_ = std::move(batch);
    thread_->Post([batch = vfork_] { batch->CloneAll(); });
    return true;
  }

  // Closes the vfork batch and waits for its clones (bounded), then takes each child in: a
  // started one becomes pending; one not reached, or whose clone failed, goes to forked_, where
  // Fork tries again its way and either places the child (a cgroup clone3 refuses, a kernel
  // before 5.7) or reports why it cannot (EAGAIN, ENOMEM).
  void AdoptVforked() {
    vfork_->Close();
    const bool finished = thread_->Wait(owner_.ExecDeadline());
    VforkBatch& batch = *vfork_;
    std::lock_guard<std::mutex> lock(batch.mu);
    batch.cancelled = true;
    for (size_t k = 0; k < batch.children.size(); ++k) {
      ChildImage& c = *batch.children[k];
      const size_t i = vfork_index_[k];
      if (!finished && &c == batch.in_clone && __atomic_load_n(&c.pid, __ATOMIC_RELAXED) <= 0) {
        // Its clone has not made the child yet (the kernel holds it): never fork the image a
        // second time while the clone still reads it. The job kills the child if the clone makes
        // one after all (cancelled, not adopted), and closes the image's descriptors.
        results_[i].error.err = ETIMEDOUT;
        results_[i].error.shell_code = 1;
        results_[i].error.message = "cannot start " + c.argv0 + ": the kernel did not create the process within " +
                                    std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(owner_.exec_wait_).count()) +
                                    " ms";
        continue;
      }
      if (!finished && &c == batch.in_clone) {
        // Not exec'd yet (a hung exec, or a child the kernel has not run on a busy machine): a
        // started worker whose exec is unconfirmed, like a forked one's.
        batch.adopted = true;
        Adopt(c, c.pid, c.pidfd, &pending_[i]);
        results_[i].ok = true;
        held_ = i;  // its exec wait is spent: Collect only looks (a past deadline), it does not wait again
        continue;
      }
      if (!c.cloned || c.clone_result < 0) {
        if (c.cloned && c.clone_errno == ENOSYS) vfork_usable.store(false, std::memory_order_relaxed);  // < 5.3
        c.pending_fork = true;
        forked_.emplace_back(i, &c);  // the job is done with it: cancelled, and not in its clone
        continue;
      }
      Adopt(c, c.clone_result, c.pidfd, &pending_[i]);
      results_[i].ok = true;
    }
    // The children's ends of their pipes and the error pipes' write ends close with the images of
    // a finished batch; an abandoned batch lives on with its job, so close them here, except those
    // of the child in its clone (adopted or to be killed): it may still share our fd table, and
    // CloneAll closes them once it has exec'd or exited.
    for (auto& image : batch.images)
      if (image.get() != batch.in_clone && !image->pending_fork) image->CloseChildEnds();
  }

  PosixSpawner& owner_;
  const sigset_t& ignored_;
  std::vector<SpawnResult> results_;                   // one per Add
  std::vector<PendingChild> pending_;                  // one per Add
  std::vector<std::pair<size_t, ChildImage*>> forked_;  // (index, image) to fork at Finish
  std::vector<std::unique_ptr<ChildImage>> own_;        // the images never meant for the spawn thread
  std::vector<size_t> vfork_index_;                    // vfork batch child -> index
  size_t held_ = SIZE_MAX;                             // the child adopted in its clone, if any
  std::shared_ptr<VforkBatch> vfork_;
  SpawnThread* thread_ = nullptr;
  bool vfork_failed_ = false;
  bool finished_ = false;
};

std::unique_ptr<SpawnBatch> PosixSpawner::BeginBatch() { return std::make_unique<Batch>(*this); }

void PosixSpawner::SpawnMany(const std::vector<SpawnSpec>& specs, std::vector<SpawnResult>* results) {
  Batch batch(*this);
  for (const SpawnSpec& spec : specs) batch.Add(spec);
  batch.Finish(results);
}

const sigset_t& PosixSpawner::Ignored() {
  if (!ignored_) ignored_ = IgnoredSignals();
  return *ignored_;
}

TimePoint PosixSpawner::ExecDeadline() const { return std::chrono::steady_clock::now() + exec_wait_; }

bool PosixSpawner::SignalGroup(pid_t pgid, int sig) { return ::killpg(pgid, sig) == 0; }

bool PosixSpawner::GroupAlive(pid_t pgid) { return ::killpg(pgid, 0) == 0 || errno == EPERM; }

}  // namespace ctrun
