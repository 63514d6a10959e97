// Spawner: starts worker processes from a SpawnSpec and signals their process groups. The agent
// sees only this interface; spawner_posix.cc makes real children (vfork-style on a spawn thread
// where it can, fork otherwise), tests/fakes/fake_spawner.h records.
//
// Contract:
//  - Spawn returns once the child has exec'd, is known to have failed, or its exec was not
//    confirmed within a bounded wait (PosixSpawner's exec_wait, for the whole of a SpawnMany).
//    An exec failure comes back as a SpawnError (with errno and the shell's 126/127 code); the
//    failed child has been reaped, or, if it did not finish exiting within the same wait, is left
//    to the caller's reaper (the agent reaps every child and ignores unknown pids). An unconfirmed
//    exec comes back as a started process with exec_confirmed = false: the caller owns it like
//    any worker, and LateExecFailure tells, after it exited, whether its exec failed after all.
//    No live child is ever left without an owner.
//  - The caller (the agent's reaper) is the only code that reaps successfully spawned children.
//  - A batch (BeginBatch) may start each child as it is added; its Finish obeys SpawnMany's
//    contract, one exec wait for the whole batch.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "process/spawn_spec.h"

namespace ctrun {

// A child whose exec the spawner did not see succeed or fail: the read end of its error pipe, and
// what explains a failure found there later.
struct UnconfirmedExec {
  UniqueFd pipe;
  std::string argv0;
  std::string exe;
};

struct SpawnedProcess {
  pid_t pid = -1;          // also its process group id (every worker leads its own group)
  UniqueFd pidfd;          // may be invalid on kernels without pidfd_open
  UniqueFd stdout_pipe;    // read end, when stdout_target is kPipe (non-blocking, CLOEXEC); the
                           // pty master (blocking, CLOEXEC) when it is kPty
  UniqueFd stderr_pipe;    // likewise for stderr_target
  UniqueFd stdin_pipe;     // write end, when stdin_target is kPipe (non-blocking, CLOEXEC)
  bool exec_confirmed = true;  // false: still in exec when the wait ran out (see the contract)
  // Set when exec_confirmed is false, and for a child stopped before exec (SpawnSpec::
  // stop_before_exec): once the child has exited, LateExecFailure tells whether it never started.
  std::optional<UnconfirmedExec> unconfirmed;
};

struct SpawnError {
  int err = 0;             // errno of the failing step
  int shell_code = 127;    // 127: not found; 126: found but not executable; 1: other set-up error
  std::string message;     // "cannot execute ./train: No such file or directory"
};

struct SpawnResult {
  bool ok = false;
  SpawnedProcess process;  // when ok
  SpawnError error;        // when !ok
};

// After the child of `exec` exited: why its exec failed (its record on the error pipe, the same
// SpawnError an early failure gets), or nothing when it exec'd. Does not block.
std::optional<SpawnError> LateExecFailure(const UnconfirmedExec& exec);

// Workers started as their specs come: Add hands one over, and the spawner may start it while
// the caller prepares the next (PosixSpawner's spawn thread clones meanwhile); Finish waits for
// all and gives the results, in Add order, as SpawnMany would have for the same specs. Finish
// once, and only after the last Add; a batch destroyed unfinished finishes itself (its children
// are then unknown to the caller, which reaps them as strangers).
class SpawnBatch {
 public:
  virtual ~SpawnBatch() = default;
  virtual void Add(const SpawnSpec& spec) = 0;
  virtual void Finish(std::vector<SpawnResult>* results) = 0;
};

class Spawner {
 public:
  virtual ~Spawner() = default;
  // On failure returns false and fills *error; on success fills *out.
  virtual bool Spawn(const SpawnSpec& spec, SpawnedProcess* out, SpawnError* error) = 0;
  // Starts every spec; (*results)[i] tells how specs[i] went. Each result obeys Spawn's contract.
  // The default spawns one after the other.
  virtual void SpawnMany(const std::vector<SpawnSpec>& specs, std::vector<SpawnResult>* results) {
    results->clear();
    results->resize(specs.size());
    for (size_t i = 0; i < specs.size(); ++i)
      (*results)[i].ok = Spawn(specs[i], &(*results)[i].process, &(*results)[i].error);
  }
  // A batch (see SpawnBatch). The default collects the specs and calls SpawnMany at Finish.
  virtual std::unique_ptr<SpawnBatch> BeginBatch();
  // killpg(pgid, sig). Returns false when the group no longer exists (ESRCH).
  virtual bool SignalGroup(pid_t pgid, int sig) = 0;
  // Whether any process is left in the group (killpg(pgid, 0)).
  virtual bool GroupAlive(pid_t pgid) = 0;
};

namespace spawner_detail {
// Spawner::BeginBatch's default: SpawnMany of everything added, at Finish.
class CollectingBatch final : public SpawnBatch {
 public:
  explicit CollectingBatch(Spawner& spawner) : spawner_(spawner) {}
  ~CollectingBatch() override {
    if (!finished_) {
      std::vector<SpawnResult> ignored;
      Finish(&ignored);
    }
  }
  void Add(const SpawnSpec& spec) override { specs_.push_back(spec); }
  void Finish(std::vector<SpawnResult>* results) override {
    finished_ = true;
    spawner_.SpawnMany(specs_, results);
  }

 private:
  Spawner& spawner_;
  std::vector<SpawnSpec> specs_;
  bool finished_ = false;
};
}  // namespace spawner_detail

inline std::unique_ptr<SpawnBatch> Spawner::BeginBatch() {
  return std::make_unique<spawner_detail::CollectingBatch>(*this);
}

class PosixSpawner final : public Spawner {
 public:
  // How long Spawn/SpawnMany wait for the children's exec to succeed or fail. An exec takes
  // milliseconds; one stuck on a hung file system must not hold the caller longer than this.
  static constexpr std::chrono::seconds kDefaultExecWait{5};

  // Forked batches up to this size are cloned straight into their cgroups (clone3
  // CLONE_INTO_CGROUP); bigger ones fork and join through cgroup.procs. (Vfork-style children are
  // always made in their cgroup: one clone at a time holds the mutex only briefly.) Measured on the 2-core VM: the cgroup.procs
  // way costs one RCU grace period per batch (5-15 ms, the children wait on it together), while
  // each CLONE_INTO_CGROUP holds the global cgroup_mutex through the parent's clone, ~1 ms apiece
  // while other jobs churn cgroups (64 clones: >= 73 ms against >= 10 ms for 64 forks): the
  // break-even lies at 5-15 children; 8 is a node's usual GPU count.
  static constexpr size_t kCloneIntoCgroupMaxBatch = 8;

  // How children are made.
  enum class Method {
    kVfork,  // vfork-style (process/vfork_clone.h) on the SpawnThread wherever the build, the
             // kernel and the spec allow (not: stop_before_exec, a cgroup joined through
             // cgroup.procs); fork/clone3 for the rest
    kFork,   // always fork (or clone3 into the cgroup): the parent's page tables are copied
    kVforkEvenStopped,  // tests: kVfork, stop_before_exec included, so that a stopped child holds
                        // the spawn thread the way an exec on a hung file system does
    kVforkStoppedAtEntry,  // tests: kVforkEvenStopped, but the child stops as it begins, while it
                           // may still share the agent's fd table (a child the kernel is slow to run)
    kVforkSlowClone,       // tests: kVfork, but the spawn thread waits twice the exec wait before
                           // each clone (a clone3 the kernel holds, on cgroup_mutex say)
    kVforkHungExec,        // tests: kVfork, but every vfork-style child stops as it begins, as an
                           // exec on a hung file system holds it (its exec stays unconfirmed)
  };
  explicit PosixSpawner(Duration exec_wait = kDefaultExecWait, Method method = Method::kVfork)
      : exec_wait_(exec_wait), method_(method) {}
  bool Spawn(const SpawnSpec& spec, SpawnedProcess* out, SpawnError* error) override;
  void SpawnMany(const std::vector<SpawnSpec>& specs, std::vector<SpawnResult>* results) override;
  // Vfork-style children are cloned on the spawn thread as they are added, while the caller
  // prepares the next; the others are forked at Finish.
  std::unique_ptr<SpawnBatch> BeginBatch() override;
  bool SignalGroup(pid_t pgid, int sig) override;
  bool GroupAlive(pid_t pgid) override;

 private:
  // A forked child whose exec is not confirmed yet.
  struct PendingChild {
    pid_t pid = -1;
    std::string argv0;
    std::string exe;  // the path exec'd, for the explanation of a failure
    UniqueFd error_pipe;  // read end of the CLOEXEC error pipe
    bool stopped_before_exec = false;  // SpawnSpec::stop_before_exec: its exec is not waited for
    SpawnedProcess proc;
  };
  struct ChildImage;  // one child's plan, in memory of its own (spawner_posix.cc)
  struct VforkBatch;  // the vfork-style children of one batch, shared with the spawn thread
  class Batch;        // BeginBatch's (spawner_posix.cc)

  static bool PrepareChild(const SpawnSpec& spec, const sigset_t& ignored, ChildImage* image, SpawnError* error);
  static void Adopt(ChildImage& image, pid_t pid, int pidfd, PendingChild* out);
  // Whether spec's child may be made vfork-style (see the constructor).
  bool VforkEligible(const SpawnSpec& spec) const;
  const sigset_t& Ignored();
  // Forks the child of a prepared image (one the spawn thread did not clone, or never was to);
  // its child ends are closed after. `clone_into_cgroup`: whether the image's cgroup_dir_fd may be
  // used (see kCloneIntoCgroupMaxBatch).
  bool Fork(ChildImage& image, bool clone_into_cgroup, PendingChild* out, SpawnError* error);
  bool Collect(PendingChild& child, TimePoint deadline, SpawnedProcess* out, SpawnError* error);
  TimePoint ExecDeadline() const;

  Duration exec_wait_;
  Method method_;
  // The signals this process ignores, which every child resets to the default: read at the first
  // batch (64 sigaction calls), since ctrun sets its dispositions before any worker starts and
  // never changes them afterwards.
  std::optional<sigset_t> ignored_;
};

}  // namespace ctrun
