#include "sys/cgroup.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <sstream>
#include <string_view>

#include "sys/high_fd.h"
#include "sys/pidfd.h"
#include "sys/posix_util.h"

namespace ctrun {
namespace {

constexpr std::string_view kWorkerCgroupPrefix = "ctrun-";

// ctrun-<pid>, and in a PID namespace other than the initial one ctrun-<pid>-ns<inode>: two
// ctruns in two namespaces (`unshare --pid` twice from one shell) can have the same pid under one
// parent cgroup, and the second removed the first one's directory as a stale one and took it.
std::string WorkersCgroupName() {
  constexpr ino_t kInitialPidNamespace = 0xEFFFFFFCu;  // the kernel's PROC_PID_INIT_INO
  std::string name = std::string(kWorkerCgroupPrefix) + std::to_string(::getpid());
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) == 0 && st.st_ino != kInitialPidNamespace)
    name += "-ns" + std::to_string(st.st_ino);
  return name;
}

bool WriteText(const std::string& path, const std::string& text) {
  UniqueFd fd(RetryOnEintr([&] { return ::open(path.c_str(), O_WRONLY | O_CLOEXEC); }));
  return fd && WriteAll(fd.get(), text.data(), text.size());
}

std::string RankDir(const std::string& dir, int rank) { return dir + "/rank-" + std::to_string(rank); }

bool Populated(const std::string& dir) {
  std::string events;
  if (!ReadFile(dir + "/cgroup.events", &events)) return false;
  return events.find("populated 1") != std::string::npos;
}

// The pids in cgroup `dir` itself (its cgroup.procs); nullopt when it cannot be read (no such
// cgroup).
std::optional<std::vector<pid_t>> ListedPids(const std::string& dir) {
  std::string procs;
  if (!ReadFile(dir + "/cgroup.procs", &procs)) return std::nullopt;
  std::vector<pid_t> pids;
  std::istringstream in(procs);
  long pid = 0;
  while (in >> pid) pids.push_back(static_cast<pid_t>(pid));
  return pids;
}

// Off only in tests of the fallback for kernels without cgroup.kill.
bool g_use_cgroup_kill = true;
// Tests only: runs between a listing of cgroup.procs and the kills that follow it.
std::function<void(const std::vector<pid_t>&)> g_after_listing_for_testing;

// SIGKILLs every process listed in `cgroup` itself; false when it cannot be read (no such cgroup).
// A listed pid may name a stranger by the time it is signalled: its process exited, its parent
// (in the cgroup) reaped it, and the number was taken again. So each is opened as a pidfd first
// and killed only when it is still listed after its pidfd was opened: a pidfd whose process was
// alive at that second listing names a process in the cgroup, and one that died before it makes
// the kill fail. Pidfds are opened in batches, to bound the fds held. A pid without a pidfd for
// another reason than being gone (Linux < 5.3, out of fds, a seccomp filter) is killed by number
// if the second listing still has it: the window shrinks to the time between the two.
bool KillListed(const std::string& cgroup) {
  constexpr size_t kBatch = 256;
  const std::optional<std::vector<pid_t>> pids = ListedPids(cgroup);
  if (!pids) return false;
  if (g_after_listing_for_testing) g_after_listing_for_testing(*pids);
  for (size_t begin = 0; begin < pids->size(); begin += kBatch) {
    std::vector<std::pair<pid_t, UniqueFd>> opened;  // an invalid fd: no pidfd, the process lives
    for (size_t i = begin; i < std::min(pids->size(), begin + kBatch); ++i) {
      UniqueFd fd = PidfdOpen((*pids)[i]);
      if (fd || errno != ESRCH) opened.emplace_back((*pids)[i], std::move(fd));
    }
    if (opened.empty()) continue;
    const std::vector<pid_t> now = ListedPids(cgroup).value_or(std::vector<pid_t>{});
    const std::set<pid_t> still(now.begin(), now.end());
    for (const auto& [pid, fd] : opened) {
      if (still.count(pid) == 0) continue;
      if (fd) (void)PidfdSignal(fd, SIGKILL);
      else ::kill(pid, SIGKILL);
    }
  }
  return true;
}

// SIGKILLs every process in the sub-tree `dir`. Returns true when the kernel did it in one step
// (cgroup.kill, Linux >= 5.14). Else every pid listed in dir's and its rank directories'
// cgroup.procs is killed (KillListed), and false says that a process forked after its parent was
// listed escaped this pass: WaitEmpty kills again.
bool KillSubtree(const std::string& dir) {
  if (g_use_cgroup_kill && WriteText(dir + "/cgroup.kill", "1")) return true;
  KillListed(dir);
  for (int r = 0; KillListed(RankDir(dir, r));) ++r;  // rank-0 upwards, to the first missing one
  return false;
}

// Waits (at most `budget`) until the sub-tree `dir` holds no process; true when it is empty.
// killed_whole: KillSubtree killed it in one step. Otherwise it is killed again every 10 ms of
// the wait, for what was forked during the last pass.
bool WaitEmpty(const std::string& dir, std::chrono::milliseconds budget, bool killed_whole) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = Clock::now() + budget;
  // cgroup.events raises POLLPRI on every change of "populated": no polling loop.
  UniqueFd events(RetryOnEintr([&] { return ::open((dir + "/cgroup.events").c_str(), O_RDONLY | O_CLOEXEC); }));
  while (Populated(dir)) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0 || !events) return false;
    pollfd p{events.get(), POLLPRI, 0};
    const int wait_ms = killed_whole ? static_cast<int>(left) : static_cast<int>(std::min<long long>(left, 10));
    const int ready = RetryOnEintr([&] { return ::poll(&p, 1, wait_ms); });
    if (ready == 0 && !killed_whole) {
      KillSubtree(dir);
      continue;
    }
    if (ready <= 0) return !Populated(dir);
    char buf[256];
    ::lseek(events.get(), 0, SEEK_SET);
    (void)::read(events.get(), buf, sizeof buf);  // re-arm
  }
  return true;
}

// Removes the rank directories (rank-0 upwards, to the first missing one), then dir.
void RemoveDirs(const std::string& dir) {
  for (int r = 0;; ++r)
    if (::rmdir(RankDir(dir, r).c_str()) != 0 && errno == ENOENT) break;
  ::rmdir(dir.c_str());
}

}  // namespace

void RemoveWorkerCgroup(const std::string& dir, std::chrono::milliseconds budget) {
  if (Populated(dir)) {
    const bool whole = KillSubtree(dir);
    (void)WaitEmpty(dir, budget, whole);  // bounded; a D-state survivor keeps its directory
  }
  RemoveDirs(dir);
}

std::optional<WorkerCgroupName> ParseWorkerCgroupName(std::string_view name) {
  const auto leading_digits = [](std::string_view s) { return std::min(s.find_first_not_of("0123456789"), s.size()); };
  if (!name.starts_with(kWorkerCgroupPrefix)) return std::nullopt;
  const std::string_view rest = name.substr(kWorkerCgroupPrefix.size());
  const size_t digits = leading_digits(rest);
  long pid = 0;
  if (digits == 0 || std::from_chars(rest.data(), rest.data() + digits, pid).ec != std::errc{} || pid <= 0)
    return std::nullopt;
  // Nothing after the pid, or -ns<digits>.
  const std::string_view suffix = rest.substr(digits);
  constexpr std::string_view kNs = "-ns";
  const bool ns_suffix = suffix.starts_with(kNs) && suffix.size() > kNs.size() &&
                         leading_digits(suffix.substr(kNs.size())) == suffix.size() - kNs.size();
  if (!suffix.empty() && !ns_suffix) return std::nullopt;
  return WorkerCgroupName{pid, suffix};
}

void RemoveStaleWorkerCgroups(const std::string& own_dir) {
  const size_t slash = own_dir.rfind('/');
  if (slash == std::string::npos) return;
  const std::string parent = own_dir.substr(0, slash), own = own_dir.substr(slash + 1);
  const std::optional<WorkerCgroupName> own_name = ParseWorkerCgroupName(own);
  if (!own_name) return;
  std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(parent.c_str()), &::closedir);
  if (!d) return;
  const auto now = std::chrono::system_clock::now();
  while (const dirent* e = ::readdir(d.get())) {
    const std::string name = e->d_name;
    const std::optional<WorkerCgroupName> parsed = ParseWorkerCgroupName(name);
    if (name == own || !parsed || parsed->suffix != own_name->suffix) continue;
    if (::kill(static_cast<pid_t>(parsed->pid), 0) == 0 || errno != ESRCH) continue;
    const std::string dir = parent + "/" + name;
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
    const auto changed = std::chrono::system_clock::from_time_t(st.st_mtim.tv_sec);
    if (now - changed < std::chrono::seconds(2) || Populated(dir)) continue;
    RemoveDirs(dir);
  }
}

std::optional<Cgroup2Mount> ParseCgroup2Mount(const std::string& mountinfo) {
  std::istringstream in(mountinfo);
  std::string line;
  while (std::getline(in, line)) {
    const size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream tail(line.substr(dash + 3));
    std::string fstype;
    tail >> fstype;
    if (fstype != "cgroup2") continue;
    std::istringstream head(line.substr(0, dash));
    std::string id, parent, devno, root, mount_point;
    if (!(head >> id >> parent >> devno >> root >> mount_point)) continue;
    return Cgroup2Mount{mount_point, root};
  }
  return std::nullopt;
}

std::string CgroupDirectory(const Cgroup2Mount& mount, const std::string& cgroup_path) {
  std::string rel = cgroup_path;
  if (mount.root != "/" && rel.rfind(mount.root, 0) == 0) rel = rel.substr(mount.root.size());
  while (!rel.empty() && rel.back() == '/') rel.pop_back();
  if (!rel.empty() && rel.front() != '/') rel = "/" + rel;
  return mount.mount_point + rel;
}

std::optional<std::string> ParseCgroup2Path(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("0::", 0) == 0) return line.substr(3);
  return std::nullopt;
}

StatusOr<std::unique_ptr<WorkerCgroups>> WorkerCgroups::Create(Layout layout) {
  std::string mountinfo, self;
  if (!ReadFile("/proc/self/mountinfo", &mountinfo) || !ReadFile("/proc/self/cgroup", &self))
    return Status::Error("cannot read /proc/self/mountinfo or /proc/self/cgroup");
  const std::optional<Cgroup2Mount> mount = ParseCgroup2Mount(mountinfo);
  const std::optional<std::string> path = ParseCgroup2Path(self);
  if (!mount || !path) return Status::Error("no cgroup v2 hierarchy");
  if (path->find("..") != std::string::npos) return Status::Error("odd cgroup path " + *path);
  const std::string dir = CgroupDirectory(*mount, *path) + "/" + WorkersCgroupName();
  if (::mkdir(dir.c_str(), 0755) != 0) {
    // Left by an earlier ctrun with this pid that died before it could remove it (only its
    // watchdog removes it after a SIGKILL, and a watchdog can be killed too). A populated one is
    // never touched: rmdir refuses it, and nothing is killed here.
    if (errno != EEXIST || Populated(dir)) return Status::Errno("mkdir " + dir, errno);
    RemoveDirs(dir);
    if (::mkdir(dir.c_str(), 0755) != 0) return Status::Errno("mkdir " + dir, errno);
  }
  std::unique_ptr<WorkerCgroups> cg(new WorkerCgroups(dir));
  // Per-rank memory.events need the memory controller below ctrun-<pid>; ctrun only takes what
  // its parent already offers (cgroup.controllers), it never enables anything above itself.
  std::string offered;
  if (ReadFile(dir + "/cgroup.controllers", &offered) && (" " + offered).find(" memory") != std::string::npos)
    cg->memory_ = WriteText(dir + "/cgroup.subtree_control", "+memory");
  cg->rank_dirs_ = cg->memory_ || layout == Layout::kRankDirs;
  return cg;
}

WorkerCgroups::~WorkerCgroups() {
  procs_.clear();
  dirs_.clear();
  RemoveWorkerCgroup(dir_, std::chrono::seconds(2));
}

std::string WorkerCgroups::LeafDir(int r) const { return rank_dirs_ ? RankDir(dir_, r) : dir_; }

Status WorkerCgroups::PrepareAttempt(int nproc) {
  const int leaves = rank_dirs_ ? nproc : std::min(nproc, 1);
  for (int r = static_cast<int>(procs_.size()); r < leaves; ++r) {
    const std::string rd = LeafDir(r);
    if (rank_dirs_ && ::mkdir(rd.c_str(), 0755) != 0 && errno != EEXIST) return Status::Errno("mkdir " + rd, errno);
    UniqueFd fd(RetryOnEintr([&] { return ::open((rd + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC); }));
    if (!fd) return Status::Errno("open " + rd + "/cgroup.procs", errno);
    UniqueFd dir(RetryOnEintr([&] { return ::open(rd.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC); }));
    if (!dir) return Status::Errno("open " + rd, errno);
    MoveHigh(&fd);  // kept for the whole job: out of every spawned child's copy of the fd table
    MoveHigh(&dir);
    procs_.push_back(std::move(fd));
    dirs_.push_back(std::move(dir));
  }
  events_before_.clear();
  for (int r = 0; r < nproc; ++r) events_before_.push_back(MemoryEvents(r));
  return Status::Ok();
}

std::optional<std::string> WorkerCgroups::MemoryEvents(int rank) const {
  std::string text;
  if (!memory_ || !ReadFile(RankDir(dir_, rank) + "/memory.events", &text)) return std::nullopt;
  return text;
}

int WorkerCgroups::procs_fd(int local_rank) const {
  return local_rank >= 0 && LeafIndex(local_rank) < procs_.size() ? procs_[LeafIndex(local_rank)].get() : -1;
}

int WorkerCgroups::dir_fd(int local_rank) const {
  if (killed_) return -1;
  return local_rank >= 0 && LeafIndex(local_rank) < dirs_.size() ? dirs_[LeafIndex(local_rank)].get() : -1;
}

bool WorkerCgroups::KillAll() {
  killed_ = true;  // even when the write fails: it may have reached part of the sub-tree
  return KillSubtree(dir_);
}

void UseCgroupKillForTesting(bool use) { g_use_cgroup_kill = use; }

void SetAfterCgroupListingForTesting(std::function<void(const std::vector<pid_t>&)> hook) {
  g_after_listing_for_testing = std::move(hook);
}

WorkerCgroups::AttemptEnd WorkerCgroups::EndAttempt(std::chrono::milliseconds budget) {
  AttemptEnd end;
  if (Populated(dir_)) {  // one read in the usual case: nothing was left behind
    for (size_t r = 0; r < procs_.size(); ++r)
      end.leftover += static_cast<int>(ListedPids(LeafDir(static_cast<int>(r))).value_or(std::vector<pid_t>{}).size());
    const bool whole = KillAll();
    end.emptied = WaitEmpty(dir_, budget, whole);
  }
  end.memory_events_before = events_before_;
  for (size_t r = 0; r < events_before_.size(); ++r) end.memory_events_after.push_back(MemoryEvents(static_cast<int>(r)));
  return end;
}

}  // namespace ctrun
