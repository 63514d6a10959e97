// WorkerCgroups: a cgroup v2 sub-tree for the workers, where ctrun may create one (root, or a
// cgroup delegated to the user such as a systemd scope with Delegate=yes):
//
//   <cgroup2 mount><ctrun's own cgroup>/ctrun-<pid>/rank-<local_rank>/
//
// The rank directories exist only when the memory controller could be enabled below ctrun-<pid>
// (per_rank_memory()): their memory.events are what they are for (rank_dirs()). Without it every worker lives
// in ctrun-<pid> itself, which kills and empties the same way and spares a launch one mkdir, two
// opens and one rmdir per rank (~1 ms for 8 ranks on the development VM).
//
// Each worker is created in its rank's cgroup (SpawnSpec::cgroup_dir_fd, clone3 CLONE_INTO_CGROUP)
// or, for big batches and where the kernel cannot, joins it between fork and exec (SpawnSpec::cgroup_procs_fd), so
// everything it ever starts (setsid children, daemons) stays inside, whatever process group or
// session it moves to. At the end of an attempt EndAttempt checks ctrun-<pid>/cgroup.events; when
// something is still inside, it writes cgroup.kill (every process below dies at once, no list to
// race with) and waits for "populated 0" (poll POLLPRI on cgroup.events, bounded). The rank
// directories live as long as the agent (creating and removing cgroups per attempt would cost a
// restart milliseconds), so OOM kills are counted as the difference of each rank's memory.events
// between the start and the end of the attempt, when the memory controller could be enabled for
// the sub-tree: exact per-rank OOM attribution. The destructor kills what is left and removes the
// directories; when ctrun is SIGKILLed, its watchdog does (process/watchdog.h). A ctrun-<pid> left
// by an earlier ctrun of the same pid (its watchdog killed too) is removed by Create when empty,
// and every ctrun removes the empty ones of dead pids once its first workers run
// (RemoveStaleWorkerCgroups).
// In a PID namespace other than the initial one the name is ctrun-<pid>-ns<inode of the
// namespace>, so ctruns of two namespaces under one parent cgroup never take each other's.
// Create fails (the caller falls back to process groups and the descendant sweep) when there is
// no cgroup2 mount or ctrun may not write there. ctrun's own cgroup is never changed: the
// memory controller is enabled only below ctrun-<pid>, and only when the parent already offers it.
// Not thread-safe; one per agent.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"

namespace ctrun {

// The cgroup2 mount point and the root of the hierarchy it shows, from /proc/self/mountinfo text;
// nullopt when there is none.
struct Cgroup2Mount {
  std::string mount_point;  // "/sys/fs/cgroup" or "/sys/fs/cgroup/unified"
  std::string root;         // "/" unless the mount shows a sub-tree (containers)
};
std::optional<Cgroup2Mount> ParseCgroup2Mount(const std::string& mountinfo);
// The directory of a cgroup v2 path ("0::<path>" of /proc/self/cgroup) under the mount.
std::string CgroupDirectory(const Cgroup2Mount& mount, const std::string& cgroup_path);
// The "0::" path of /proc/self/cgroup text; nullopt when there is none.
std::optional<std::string> ParseCgroup2Path(const std::string& proc_self_cgroup);

// Kills everything in the worker cgroup sub-tree `dir` (a WorkerCgroups::dir()), waits at most
// `budget` until it is empty, and removes its rank directories and itself. What the destructor
// does, and what the watchdog does after the agent was SIGKILLed (process/watchdog.h).
void RemoveWorkerCgroup(const std::string& dir, std::chrono::milliseconds budget);

// Tests only: false makes every kill of a sub-tree take the way of kernels before 5.14, which
// have no cgroup.kill (each listed pid is killed, again until the sub-tree is empty).
void UseCgroupKillForTesting(bool use);
// Tests only: `hook` runs in that pid-by-pid kill between the listing of a cgroup's pids and their
// kills (the window in which a listed pid can be taken by a stranger); empty removes it.
void SetAfterCgroupListingForTesting(std::function<void(const std::vector<pid_t>&)> hook);

// A workers' cgroup directory name (ctrun-<pid>, ctrun-<pid>-ns<inode>) split into the pid and
// what follows it; nullopt for any other name. The one place that knows the name's form.
struct WorkerCgroupName {
  long pid;
  std::string_view suffix;  // "" or "-ns<inode>"; points into the parsed name
};
std::optional<WorkerCgroupName> ParseWorkerCgroupName(std::string_view name);

// Removes the empty worker cgroups that dead ctruns left next to `own_dir` (a WorkerCgroups::dir()):
// its siblings named like it (ctrun-<pid>, with the same -ns<inode> suffix) whose pid is not alive
// in this PID namespace. A ctrun and its watchdog both SIGKILLed (`pkill -9`) leave one each.
// A populated one is never touched (its processes are not ours to kill), nor one changed in the
// last 2 s (a cgroup directory's mtime moves when its last process leaves, too): a new ctrun that
// took a dead one's pid may have made it a moment ago. Best effort.
void RemoveStaleWorkerCgroups(const std::string& own_dir);

class WorkerCgroups {
 public:
  // kRankDirs makes rank directories even without the memory controller (tests of that layout on
  // machines that lack it).
  enum class Layout { kAuto, kRankDirs };
  static StatusOr<std::unique_ptr<WorkerCgroups>> Create(Layout layout = Layout::kAuto);
  ~WorkerCgroups();
  WorkerCgroups(const WorkerCgroups&) = delete;
  WorkerCgroups& operator=(const WorkerCgroups&) = delete;

  // Makes the missing rank-0..rank-<nproc-1> directories (per_rank_memory(); otherwise ctrun-<pid>
  // is every rank's cgroup), opens their cgroup.procs for the spawner, and notes each rank's
  // memory.events as the attempt's baseline.
  Status PrepareAttempt(int nproc);
  // An open (O_WRONLY, CLOEXEC) cgroup.procs of the rank's cgroup; -1 when there is none.
  int procs_fd(int local_rank) const;
  // The rank's cgroup directory (O_PATH|O_DIRECTORY, CLOEXEC) for clone3's CLONE_INTO_CGROUP;
  // -1 when there is none, and -1 for good once the sub-tree has been through cgroup.kill: some
  // kernels (seen on 6.18.44) SIGKILL at birth every child cloned into a cgroup that was ever
  // killed (the fork compares the target's kill sequence with that of the parent's cgroup), so
  // the workers of later attempts join through cgroup.procs instead.
  int dir_fd(int local_rank) const;

  struct AttemptEnd {
    // Per local rank of the attempt, memory.events at its start and now (report/oom.h parses the
    // oom_kill lines); both nullopt when the memory controller is not enabled for the sub-tree.
    std::vector<std::optional<std::string>> memory_events_before, memory_events_after;
    int leftover = 0;     // processes still in the sub-tree when the attempt ended (all killed)
    bool emptied = true;  // false: something survived cgroup.kill for `budget` (D state)
  };
  // Kills everything still in the sub-tree and waits (at most `budget`) until it is empty.
  AttemptEnd EndAttempt(std::chrono::milliseconds budget);

  const std::string& dir() const { return dir_; }
  bool per_rank_memory() const { return memory_; }
  bool rank_dirs() const { return rank_dirs_; }

 private:
  explicit WorkerCgroups(std::string dir) : dir_(std::move(dir)) {}
  // True when the kernel killed the sub-tree in one step (cgroup.kill); see KillSubtree.
  bool KillAll();
  std::optional<std::string> MemoryEvents(int rank) const;
  // The cgroup directory workers of local rank `r` live in, and the index of its fds.
  std::string LeafDir(int r) const;
  size_t LeafIndex(int r) const { return rank_dirs_ ? static_cast<size_t>(r) : 0; }

  std::string dir_;
  bool memory_ = false;
  bool rank_dirs_ = false;  // memory_, or Layout::kRankDirs
  bool killed_ = false;  // cgroup.kill was written: no more CLONE_INTO_CGROUP (see dir_fd)
  std::vector<UniqueFd> procs_;                             // by LeafIndex
  std::vector<UniqueFd> dirs_;                              // by LeafIndex (O_PATH)
  std::vector<std::optional<std::string>> events_before_;  // by local rank, this attempt's baseline
};

}  // namespace ctrun
