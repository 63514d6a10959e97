#include "logs/log_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "base/unique_fd.h"
#include "sys/posix_util.h"
#include "sys/remove_tree.h"
#include "sys/safe_path.h"

namespace ctrun::logs {
namespace fs = std::filesystem;

namespace {

// MakeAhead's trees: <run_dir>/.attempt_<n>.
constexpr std::string_view kAheadPrefix = ".attempt_";

// The names in the directory open as `dirfd` but "." and ".." (none when it cannot be read).
std::vector<std::string> NamesIn(int dirfd) {
  std::vector<std::string> names;
  const int fd = ::fcntl(dirfd, F_DUPFD_CLOEXEC, 0);
  DIR* d = fd >= 0 ? ::fdopendir(fd) : nullptr;
  if (d == nullptr) {
    if (fd >= 0) ::close(fd);
    return names;
  }
  while (const dirent* e = ::readdir(d))
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
  ::closedir(d);
  return names;
}

StatusOr<std::string> MakeTempDir(const std::string& tmpl) {
  std::string buf = tmpl;
  if (::mkdtemp(buf.data()) == nullptr) return Status::Errno("mkdtemp " + tmpl, errno);
  return buf;
}

// torchrun's default base: mkdtemp("torchelastic_") in Python's tempfile.gettempdir(), the first
// of $TMPDIR, $TEMP, $TMP, /tmp, /var/tmp, /usr/tmp and the working directory where one can be
// made. A variable that names a symlink planted by another user is an error, never followed
// (sys/safe_path.h). *notice: one line when a variable named a directory that could not be used.
StatusOr<std::string> MakeTemporaryBase(std::string* notice) {
  std::vector<std::pair<std::string, std::string>> candidates;  // (variable or "", directory)
  for (const char* var : {"TMPDIR", "TEMP", "TMP"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && *v != '\0') candidates.emplace_back(var, v);
  }
  for (const char* dir : {"/tmp", "/var/tmp", "/usr/tmp"}) candidates.emplace_back("", dir);
  std::error_code ec;
  const fs::path cwd = fs::current_path(ec);
  if (!ec) candidates.emplace_back("", cwd.string());
  Status first_error = Status::Error("no temporary directory");
  for (size_t i = 0; i < candidates.size(); ++i) {
    const auto& [var, dir] = candidates[i];
    if (std::string why = PlantedSymlink(dir); !why.empty())
      return Status::Error((var.empty() ? dir : var + " " + dir) + ": not followed: " + why);
    auto made = MakeTempDir(dir + "/torchelastic_XXXXXX");
    if (made.ok()) {
      if (i > 0 && !candidates[0].first.empty())
        *notice = candidates[0].first + "=" + candidates[0].second + " cannot be used (" + first_error.message() +
                  "); the log directory goes to " + dir + " instead, as Python's tempfile would";
      return made;
    }
    if (i == 0) first_error = made.status();
  }
  return first_error;
}

Status MakeDirs(const std::string& path) {
  if (std::string why = PlantedSymlink(path); !why.empty()) return Status::Error(path + ": not followed: " + why);
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) return Status::Error("mkdir -p " + path + ": " + ec.message());
  return Status::Ok();
}

// mkdir -p `dir` (the run directory too, should something have removed it under a long job),
// then its rank directories 0..nproc-1 relative to it: no path walk per rank, and no symlink
// swapped in for `dir` after it was made is followed.
Status MakeRankDirs(const std::string& dir, int nproc) {
  if (Status s = MakeDirs(dir); !s.ok()) return s;
  UniqueFd fd(RetryOnEintr([&] { return ::open(dir.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC); }));
  if (!fd) return Status::Errno("open " + dir, errno);
  for (int r = 0; r < nproc; ++r) {
    const std::string name = std::to_string(r);
    if (::mkdirat(fd.get(), name.c_str(), 0777) != 0) return Status::Errno("mkdir " + dir + "/" + name, errno);
  }
  return Status::Ok();
}

// rmdir of `dir`; true when it is gone (removed, or was not there).
bool RemoveEmptyDir(const std::string& dir) { return ::rmdir(dir.c_str()) == 0 || errno == ENOENT; }

// rmdir of `dir` and of every directory under it, deepest first; nothing else is ever removed, and
// no symlink is followed. True when `dir` is gone (or was not there).
bool RemoveEmptyTree(const std::string& dir) {
  if (RemoveEmptyDir(dir)) return true;
  if (errno != ENOTEMPTY && errno != EEXIST) return false;
  UniqueFd fd(RetryOnEintr([&] { return ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC); }));
  if (!fd) return false;
  for (const std::string& name : NamesIn(fd.get())) {
    struct stat st {};
    if (::fstatat(fd.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode))
      (void)RemoveEmptyTree(dir + "/" + name);
  }
  return RemoveEmptyDir(dir);
}

// rmdir of the rank directories 0..nproc-1 of an attempt directory, then of the directory itself;
// true when all of them are gone. Stops at the first that is not (a file or directory inside).
bool RemoveRankDirs(const std::string& dir, int nproc) {
  for (int r = nproc; r-- > 0;)
    if (!RemoveEmptyDir(dir + "/" + std::to_string(r))) return false;
  return RemoveEmptyDir(dir);
}

}  // namespace

// A tree being made by MakeAhead. The thread writes `made` and nothing else; join() orders that
// write before every read of it.
struct LogDir::Ahead {
  int attempt = 0;
  int nproc = 0;
  std::string dir;  // <run_dir>/.attempt_<attempt>
  Status made = Status::Ok();
  std::thread thread;
};

void LogDir::AheadJoiner::operator()(Ahead* a) const {
  if (a->thread.joinable()) a->thread.join();
  delete a;
}

// The eager removal's thread: one rmdir per directory handed to it, in order; it records those it
// removed. `queue`, `removed` and `closing` are shared under `mu`; Finish orders the thread's last
// write before the caller's reads.
struct LogDir::Releaser {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Released> queue;
  std::vector<Released> removed;
  bool closing = false;
  std::thread thread;

  void Run() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [this] { return closing || !queue.empty(); });
      if (queue.empty()) return;  // closing, and everything asked for is done
      Released dir = std::move(queue.front());
      queue.pop_front();
      lock.unlock();
      const bool gone = ::rmdir(dir.path.c_str()) == 0;
      lock.lock();
      if (gone) removed.push_back(std::move(dir));
    }
  }
  // Lets the thread finish its queue, then joins it.
  void Finish() {
    {
      std::lock_guard<std::mutex> lock(mu);
      closing = true;
    }
    cv.notify_one();
    if (thread.joinable()) thread.join();
  }
};

void LogDir::ReleaserJoiner::operator()(Releaser* r) const {
  r->Finish();
  delete r;
}

StatusOr<LogDir> LogDir::Create(const std::optional<std::string>& base, const std::string& run_id) {
  if (base && *base == kDevNull) return LogDir(kDevNull, "");
  std::string root;
  std::string notice;
  const bool temporary = !base || base->empty();
  if (!temporary) {
    root = *base;
    if (Status s = MakeDirs(root); !s.ok()) return s;
  } else {
    auto made = MakeTemporaryBase(&notice);
    if (!made.ok()) return made.status();
    root = std::move(*made);
  }
  std::error_code ec;
  fs::path abs = fs::absolute(root, ec);
  if (!ec) root = abs.lexically_normal().string();
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  std::string id = run_id.empty() ? "none" : run_id;
  for (char& c : id) {
    if (c == '/') c = '_';  // a run id is a name, never a path
  }
  auto run_dir = MakeTempDir(root + "/" + id + "_XXXXXX");
  if (!run_dir.ok()) return run_dir.status();
  LogDir made(std::move(*run_dir), temporary ? root : "");
  made.notice_ = std::move(notice);
  return made;
}

StatusOr<bool> LogDir::RemoveTemporaryBase() {
  if (temp_base_.empty()) return false;
  SettleReleases();  // what it removed reads as gone below (ENOENT)
  // The usual end of a successful run: the base holds nothing but the empty directories made
  // here. They go one rmdir each, deepest first, without a walk of the tree (8 ranks: 11 calls;
  // 2.6 -> 1.9 ms on the development VM's ext4, where each rmdir waits 0.1-0.2 ms). Anything else
  // in it (an error file of a failed attempt, a directory a worker made) stops that, and rm -rf
  // takes what is left.
  bool gone = true;
  if (ahead_) {
    const std::string dir = ahead_->dir;
    const int nproc = ahead_->nproc;
    ahead_.reset();  // joins its thread: the tree is inside the base
    gone = RemoveRankDirs(dir, nproc);
  }
  for (auto it = attempts_made_.rbegin(); gone && it != attempts_made_.rend(); ++it)
    gone = RemoveRankDirs(it->first, it->second);
  if (gone && RemoveEmptyDir(run_dir_) && RemoveEmptyDir(temp_base_)) return true;
  // Something else is in the tree. A file is never removed, whoever wrote it (an error file of an
  // earlier attempt, a saved stack, whatever a worker put next to its error file): the tree is
  // kept whole, with torchrun's layout. Directories alone (a worker's empty scratch directory)
  // go by rmdir.
  if (!HoldsAFile(temp_base_) && RemoveEmptyTree(temp_base_)) return true;
  if (Status s = RemakeAttemptDirs(); !s.ok()) return s;
  return false;
}

Status LogDir::RemakeAttemptDirs() {
  SettleReleases();
  released_.clear();  // every directory it removed is made again below
  Status result = Status::Ok();
  auto make = [&result](const std::string& dir, mode_t mode) {
    if (::mkdir(dir.c_str(), mode) != 0 && errno != EEXIST && result.ok())
      result = Status::Errno("cannot make " + dir + " again", errno);
  };
  make(temp_base_, 0700);  // modes as made: mkdtemp, then mkdir 0777 under the umask
  make(run_dir_, 0700);
  for (const auto& [dir, nproc] : attempts_made_) {
    make(dir, 0777);
    for (int r = 0; r < nproc; ++r) make(dir + "/" + std::to_string(r), 0777);
  }
  return result;
}

StatusOr<AttemptPaths> LogDir::PrepareAttempt(int attempt, int nproc) {
  AttemptPaths p;
  p.attempt = attempt;
  if (!files_enabled()) {
    p.dir = p.filtered_stdout = p.filtered_stderr = kDevNull;
    // TORCHELASTIC_ERROR_FILE is empty, as under torchrun: a worker then records no error file
    // (a writer that replaced /dev/null with its JSON file would break the machine).
    p.ranks.assign(static_cast<size_t>(nproc), RankPaths{kDevNull, kDevNull, kDevNull, ""});
    return p;
  }
  p.dir = run_dir_ + "/attempt_" + std::to_string(attempt);
  p.filtered_stdout = p.dir + "/filtered_stdout.log";
  p.filtered_stderr = p.dir + "/filtered_stderr.log";
  if (Status s = RestoreReleased(); !s.ok()) return s;
  release_attempt_ = attempt;
  rank_released_.assign(static_cast<size_t>(nproc), false);
  std::error_code ec;
  fs::remove_all(p.dir, ec);
  if (ec) return Status::Error("rm -rf " + p.dir + ": " + ec.message());
  for (int r = 0; r < nproc; ++r) {
    RankPaths rp;
    rp.dir = p.dir + "/" + std::to_string(r);
    rp.stdout_log = rp.dir + "/stdout.log";
    rp.stderr_log = rp.dir + "/stderr.log";
    rp.error_file = rp.dir + "/error.json";
    p.ranks.push_back(std::move(rp));
  }
  attempts_made_.emplace_back(p.dir, nproc);
  if (TakeAhead(attempt, nproc, p.dir)) return p;
  if (Status s = MakeRankDirs(p.dir, nproc); !s.ok()) return s;
  return p;
}

void LogDir::MakeAhead(int attempt, int nproc) {
  if (!files_enabled()) return;
  if (Status s = DropAhead(); !s.ok()) spdlog::debug("{}", s.message());
  std::unique_ptr<Ahead, AheadJoiner> a(new Ahead);
  a->attempt = attempt;
  a->nproc = nproc;
  a->dir = run_dir_ + "/" + std::string(kAheadPrefix) + std::to_string(attempt);
  Ahead* raw = a.get();
  // The thread inherits the caller's signal mask (ctrun's blocked signals stay blocked in it). It
  // runs niced: it starts beside the spawn of the attempt that asked for it, which it must not
  // slow, and is needed only by the next restart.
  try {
    a->thread = std::thread([raw] {
      ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 19);
      raw->made = MakeRankDirs(raw->dir, raw->nproc);
    });
  } catch (const std::system_error& e) {  // no thread: PrepareAttempt makes them itself
    spdlog::debug("cannot make attempt_{}'s directories ahead: {}", attempt, e.what());
    return;
  }
  ahead_ = std::move(a);
}

bool LogDir::TakeAhead(int attempt, int nproc, const std::string& dir) {
  if (!ahead_) return false;
  ahead_->thread.join();
  const Ahead& a = *ahead_;
  if (a.made.ok() && a.attempt == attempt && a.nproc == nproc &&
      ::renameat2(AT_FDCWD, a.dir.c_str(), AT_FDCWD, dir.c_str(), RENAME_NOREPLACE) == 0) {
    ahead_.reset();
    return true;
  }
  (void)DropAhead();  // of no use; the caller makes the directories itself and reports its errors
  return false;
}

Status LogDir::DropAhead() {
  if (!ahead_) return Status::Ok();
  const std::string dir = ahead_->dir;
  ahead_.reset();  // joins its thread
  return RemoveTree(dir);
}

void LogDir::ReleaseRank(int attempt, int local_rank) {
  if (temp_base_.empty() || attempts_made_.empty() || attempt != release_attempt_ || local_rank < 0 ||
      static_cast<size_t>(local_rank) >= rank_released_.size() || rank_released_[static_cast<size_t>(local_rank)])
    return;
  rank_released_[static_cast<size_t>(local_rank)] = true;
  const std::string& dir = attempts_made_.back().first;
  // Modes as made: rank and attempt directories by mkdir 0777, the run directory and the base by
  // mkdtemp (0700); the umask applies again when they are made again.
  std::vector<Released> dirs{{dir + "/" + std::to_string(local_rank), 0777, true}};
  if (std::all_of(rank_released_.begin(), rank_released_.end(), [](bool b) { return b; })) {
    if (ahead_) {
      const std::string ahead_dir = ahead_->dir;
      const int ahead_nproc = ahead_->nproc;
      ahead_.reset();  // joins its thread
      for (int r = ahead_nproc; r-- > 0;) dirs.push_back({ahead_dir + "/" + std::to_string(r), 0777, false});
      dirs.push_back({ahead_dir, 0777, false});
    }
    dirs.push_back({dir, 0777, true});
    dirs.push_back({run_dir_, 0700, true});
    dirs.push_back({temp_base_, 0700, true});
  }
  Release(std::move(dirs));
}

void LogDir::Release(std::vector<Released> dirs) {
  if (!releaser_) {
    std::unique_ptr<Releaser, ReleaserJoiner> r(new Releaser);
    // The thread inherits the caller's signal mask (ctrun's blocked signals stay blocked in it).
    try {
      r->thread = std::thread([raw = r.get()] { raw->Run(); });
    } catch (const std::system_error& e) {  // no thread: the end of the run removes them
      spdlog::debug("cannot remove log directories early: {}", e.what());
      return;
    }
    releaser_ = std::move(r);
  }
  {
    std::lock_guard<std::mutex> lock(releaser_->mu);
    for (Released& d : dirs) releaser_->queue.push_back(std::move(d));
  }
  releaser_->cv.notify_one();
}

void LogDir::SettleReleases() {
  if (!releaser_) return;
  releaser_->Finish();
  for (Released& d : releaser_->removed) released_.push_back(std::move(d));
  releaser_.reset();
}

Status LogDir::RestoreReleased() {
  SettleReleases();
  Status result = Status::Ok();
  // Parents first. A name that exists again was made by someone else meanwhile: not ours to use.
  for (auto it = released_.rbegin(); it != released_.rend(); ++it)
    if (it->restore && ::mkdir(it->path.c_str(), it->mode) != 0 && result.ok())
      result = Status::Errno("cannot make " + it->path + " again", errno);
  released_.clear();
  return result;
}

void RemoveTreesMadeAhead(const std::string& run_dir) {
  UniqueFd run(RetryOnEintr([&] { return ::open(run_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC); }));
  if (!run) return;
  for (const std::string& name : NamesIn(run.get())) {
    if (name.size() <= kAheadPrefix.size() || !name.starts_with(kAheadPrefix) ||
        name.find_first_not_of("0123456789", kAheadPrefix.size()) != std::string::npos)
      continue;
    UniqueFd tree(RetryOnEintr([&] { return ::openat(run.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC); }));
    if (!tree) continue;
    for (const std::string& rank : NamesIn(tree.get())) (void)::unlinkat(tree.get(), rank.c_str(), AT_REMOVEDIR);
    (void)::unlinkat(run.get(), name.c_str(), AT_REMOVEDIR);
  }
}

std::string FirstFileUnder(const std::string& dir) {
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (!it->is_directory(ec) || it->is_symlink(ec)) return it->path().lexically_relative(dir).string();
  return "";
}

bool HoldsAFile(const std::string& dir) { return !FirstFileUnder(dir).empty(); }

std::string LastLines(std::string_view text, int max_lines) {
  if (max_lines <= 0) return {};
  size_t end = text.size();
  if (end > 0 && text[end - 1] == '\n') --end;  // a final newline does not start a new line
  size_t pos = end;
  int lines = 0;
  while (pos > 0) {
    size_t nl = text.rfind('\n', pos - 1);
    ++lines;
    if (nl == std::string_view::npos) {
      pos = 0;
      break;
    }
    if (lines == max_lines) {
      pos = nl + 1;
      break;
    }
    pos = nl;
  }
  return std::string(text.substr(pos));
}

std::string ReadFileTail(const std::string& path, size_t max_bytes, int max_lines) {
  UniqueFd fd(RetryOnEintr([&] { return ::open(path.c_str(), O_RDONLY | O_CLOEXEC); }));
  if (!fd) return {};
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return {};
  off_t size = st.st_size;
  off_t start = size > static_cast<off_t>(max_bytes) ? size - static_cast<off_t>(max_bytes) : 0;
  std::string buf(static_cast<size_t>(size - start), '\0');
  size_t got = 0;
  while (got < buf.size()) {
    ssize_t n = RetryOnEintr(
        [&] { return ::pread(fd.get(), buf.data() + got, buf.size() - got, start + static_cast<off_t>(got)); });
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  buf.resize(got);
  std::string_view view(buf);
  if (start > 0) {  // drop the first, probably cut, line
    size_t nl = view.find('\n');
    if (nl != std::string_view::npos && nl + 1 < view.size()) view.remove_prefix(nl + 1);
  }
  return LastLines(view, max_lines);
}

}  // namespace ctrun::logs
