// LogDir: torchrun's per-run log directory layout (DefaultLogsSpecs.reify):
//
//   <base>/<run_id>_<random>/attempt_<n>/<local_rank>/{stdout.log,stderr.log,error.json}
//   <base>/<run_id>_<random>/attempt_<n>/filtered_{stdout,stderr}.log  (--duplicate-*-filters)
//
// - <base> is --log_dir; when absent, a fresh mkdtemp "$TMPDIR/torchelastic_XXXXXX" (torchrun's
//   default), so TORCHELASTIC_ERROR_FILE can always be set. LogDir removes no file, ever; the
//   runner says where log files went and removes a fresh base that holds nothing but directories
//   after a successful run without log files (RemoveTemporaryBase).
// - <run_id>_<random> is made once per agent (mkdtemp), attempt_<n> is removed and recreated on
//   each (re)start, and every per-rank directory exists even without redirects.
// - MakeAhead makes a coming attempt's directories early, on a thread of its own, under the hidden
//   name <run_dir>/.attempt_<n>; PrepareAttempt of that attempt then only renames the tree into
//   place. A restart's critical path holds one rename instead of nproc + 1 mkdirs: ext4 without
//   a journal skips, on every mkdir, each free inode deleted in the last minutes (0.1-0.5 ms per
//   mkdir on the development VM after a burst of removals, 8 ms of a 64-worker restart), and a
//   network file system costs a round trip each.
// - base == "/dev/null" turns files off: every path (error.json included) is "/dev/null" and no
//   directory is made, as in torchrun.
// - ReleaseRank removes a fresh base's empty directories early, on a thread of its own (see there).
// Not thread-safe (the ahead and release threads are private to it); one LogDir per agent. Paths
// are absolute when the base is.
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace ctrun::logs {

inline constexpr const char* kDevNull = "/dev/null";

struct RankPaths {
  std::string dir;         // <attempt>/<local_rank>, or /dev/null
  std::string stdout_log;  // <dir>/stdout.log
  std::string stderr_log;  // <dir>/stderr.log
  std::string error_file;  // <dir>/error.json: the value of TORCHELASTIC_ERROR_FILE ("" without files)
};

struct AttemptPaths {
  int attempt = 0;
  std::string dir;  // <run_dir>/attempt_<n>, or /dev/null
  std::vector<RankPaths> ranks;  // index = local rank
  std::string filtered_stdout;   // <dir>/filtered_stdout.log, or /dev/null
  std::string filtered_stderr;   // <dir>/filtered_stderr.log, or /dev/null
  bool files_enabled() const { return dir != kDevNull; }
};

class LogDir {
 public:
  // Creates <base> if missing (mkdir -p) and the <run_id>_XXXXXX run directory inside it. Without
  // a base, the fresh one goes where Python's tempfile would put it: $TMPDIR, $TEMP, $TMP, /tmp,
  // /var/tmp, /usr/tmp, the working directory, the first that works (notice() says when a
  // variable named one that did not).
  static StatusOr<LogDir> Create(const std::optional<std::string>& base, const std::string& run_id);
  // One line for the user about where the fresh base went; "" when nothing needs saying.
  const std::string& notice() const { return notice_; }

  // rm -rf attempt_<attempt>, then makes it and its nproc per-rank directories, or renames the
  // tree MakeAhead made for this attempt into place (waiting for its thread to finish). What
  // ReleaseRank removed is made again first.
  StatusOr<AttemptPaths> PrepareAttempt(int attempt, int nproc);

  // Starts making attempt_<attempt>'s directories for nproc ranks on a thread, under
  // <run_dir>/.attempt_<attempt>. Does nothing when files are off. A tree pending for another
  // attempt is dropped first. A failure is not reported here: PrepareAttempt then makes the
  // directories itself and reports its own error.
  void MakeAhead(int attempt, int nproc);
  // Waits for a pending MakeAhead and removes the tree no attempt took (at the end of a run, so
  // that a kept run directory holds only attempts that ran).
  Status DropAhead();

  const std::string& run_dir() const { return run_dir_; }
  bool files_enabled() const { return run_dir_ != kDevNull; }
  // The base was made here (no --log_dir): "$TMPDIR/torchelastic_XXXXXX".
  bool temporary_base() const { return !temp_base_.empty(); }
  // Removes that fresh base (after waiting for a pending MakeAhead) when it holds nothing but
  // directories: true when it is gone. A file anywhere in it (an error file of an earlier attempt,
  // a saved stack, anything a worker wrote there) is never removed: the base is kept whole, every
  // attempt directory with its rank directories in place (made again where they were removed),
  // and the result is false. False too when --log_dir was given (nothing is removed then).
  [[nodiscard]] StatusOr<bool> RemoveTemporaryBase();

  // Eager removal, for a fresh base that will hold no log file (the caller decides: a successful
  // run then removes the base whole). The rank directory of a worker that finished cleanly is
  // removed at once, on a thread of its own, while the other workers run on or end: on a disk each
  // rmdir waits (ext4 without a journal discards the directory's block synchronously: 0.15-0.3 ms
  // per rmdir on the development VM, 3.5 ms of a launch of 8 when all came at the end). Once every
  // rank of the attempt is released, the tree MakeAhead made, the attempt directory, the run
  // directory and the base follow. rmdir alone: a directory with anything in it (an error file, a
  // saved stack) stays, and so does everything above it. Only the current attempt's ranks count;
  // a rank released twice counts once. Nothing happens when files are off or the base was given.
  void ReleaseRank(int attempt, int local_rank);
  // Waits for the eager removal to finish, then makes again, parents first and empty as they were
  // (same modes), the directories it removed, but the MakeAhead tree (a kept run directory holds
  // only attempts that ran). For a run whose base is kept after all; PrepareAttempt calls it too.
  Status RestoreReleased();

 private:
  struct Ahead;
  struct AheadJoiner {
    void operator()(Ahead* a) const;  // joins the thread, then frees
  };
  LogDir(std::string run_dir, std::string temp_base) : run_dir_(std::move(run_dir)), temp_base_(std::move(temp_base)) {}
  // Makes again, where missing, the base, the run directory and every attempt directory made here
  // with its rank directories (what an interrupted removal took); clears released_.
  Status RemakeAttemptDirs();
  // Waits for the pending tree; true when it was made for (attempt, nproc) and is now `dir`.
  bool TakeAhead(int attempt, int nproc, const std::string& dir);
  std::string run_dir_;
  std::string temp_base_;  // "" unless the base was made by Create
  // Every attempt directory PrepareAttempt made (or began to) and its rank count, in order: what
  // RemoveTemporaryBase removes without walking the tree.
  std::vector<std::pair<std::string, int>> attempts_made_;
  std::string notice_;
  std::unique_ptr<Ahead, AheadJoiner> ahead_;  // the MakeAhead tree, with its thread

  struct Released {
    std::string path;
    mode_t mode;   // to make it again with
    bool restore;  // false for the MakeAhead tree
  };
  struct Releaser;
  struct ReleaserJoiner {
    void operator()(Releaser* r) const;  // lets the thread finish its queue, joins it, then frees
  };
  void Release(std::vector<Released> dirs);
  // Joins the release thread and adds what it removed to released_.
  void SettleReleases();
  std::unique_ptr<Releaser, ReleaserJoiner> releaser_;
  std::vector<Released> released_;  // removed by settled release threads, in removal order
  int release_attempt_ = -1;        // the attempt whose released ranks are counted
  std::vector<bool> rank_released_;
};

// Removes the trees MakeAhead made under run_dir (<run_dir>/.attempt_<n>, rank directories that no
// worker ever used) with rmdir alone: anything not empty stays. For the watchdog of an agent that
// died (SIGKILL) with one pending; the agent itself drops them through DropAhead. Single-threaded,
// best effort, silent.
void RemoveTreesMadeAhead(const std::string& run_dir);

// Whether anything but directories lies under `dir` (an error file, a saved stack, a log): false
// for a tree of empty directories, or when it cannot be read. Symlinks are not followed. For the
// end-of-run line that names a kept run directory.
bool HoldsAFile(const std::string& dir);
// The first such file found under `dir`, relative to it ("attempt_0/2/error.json"); "" when
// there is none. Which one comes first is the directory order's.
std::string FirstFileUnder(const std::string& dir);

// The last max_lines lines (and at most max_bytes) of a file; "" when unreadable. For the
// failure summary of a worker whose stderr went straight to a file.
std::string ReadFileTail(const std::string& path, size_t max_bytes = 8192, int max_lines = 20);
// The last max_lines lines of text (a trailing partial line counts as a line).
std::string LastLines(std::string_view text, int max_lines);

}  // namespace ctrun::logs
