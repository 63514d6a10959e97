// LogDir: torchrun's per-run log directory layout (DefaultLogsSpecs.reify):
//
//   <base>/<run_id>_<random>/attempt_<n>/<local_rank>/{stdout.log,stderr.log,error.json}
//   <base>/<run_id>_<random>/attempt_<n>/filtered_{stdout,stderr}.log  (--duplicate-*-filters)
//
// - <base> is --log_dir; when absent, a fresh mkdtemp "$TMPDIR/torchelastic_XXXXXX" (torchrun's
//   default), so TORCHELASTIC_ERROR_FILE can always be set. LogDir removes nothing itself; the
//   runner says where log files went and removes a fresh base after a successful run without log
//   files (RemoveTemporaryBase).
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
// Not thread-safe (the ahead thread is private to it); one LogDir per agent. Paths are absolute
// when the base is.
#pragma once

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
  std::string error_file;  // <dir>/error.json: the value of TORCHELASTIC_ERROR_FILE
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
  // tree MakeAhead made for this attempt into place (waiting for its thread to finish).
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
  // rm -rf of that fresh base (after waiting for a pending MakeAhead); does nothing when --log_dir
  // was given. The directories made here go by rmdir alone when nothing else is in the tree.
  Status RemoveTemporaryBase();

 private:
  struct Ahead;
  struct AheadJoiner {
    void operator()(Ahead* a) const;  // joins the thread, then frees
  };
  LogDir(std::string run_dir, std::string temp_base) : run_dir_(std::move(run_dir)), temp_base_(std::move(temp_base)) {}
  // Waits for the pending tree; true when it was made for (attempt, nproc) and is now `dir`.
  bool TakeAhead(int attempt, int nproc, const std::string& dir);
  std::string run_dir_;
  std::string temp_base_;  // "" unless the base was made by Create
  // Every attempt directory PrepareAttempt made (or began to) and its rank count, in order: what
  // RemoveTemporaryBase removes without walking the tree.
  std::vector<std::pair<std::string, int>> attempts_made_;
  std::string notice_;
  std::unique_ptr<Ahead, AheadJoiner> ahead_;  // the MakeAhead tree, with its thread
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

// The last max_lines lines (and at most max_bytes) of a file; "" when unreadable. For the
// failure summary of a worker whose stderr went straight to a file.
std::string ReadFileTail(const std::string& path, size_t max_bytes = 8192, int max_lines = 20);
// The last max_lines lines of text (a trailing partial line counts as a line).
std::string LastLines(std::string_view text, int max_lines);

}  // namespace ctrun::logs
