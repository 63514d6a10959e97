// atomic_file.h — durable whole-file replacement, shared by the error file and the snapshot store
// of ctrun_worker and by the agent's report module (src/report/error_file.cc). Not installed.
//
// Contract: write_file_atomic(path, parts) writes the concatenation of `parts` to a temp file in
// path's directory, fsyncs it, gives it the temp name "<dir>/.tmp-<name>-<host>-<pid>-<n>"
// (<host>: temp_host_token(), below), renames it over `path`, and fsyncs the directory, so
// `path` holds either its old content or all of the new one, also across a crash. The file is
// mode 0644 less the umask (or as the directory's default ACL says), its fds CLOEXEC.
// On Linux the temp file is unnamed while it is written (O_TMPFILE) and gets its name only at
// the end (linkat): a writer killed before that (SIGKILL mid-write, the long part) leaves
// nothing; only one killed between the link and the rename leaves its temp file. Where O_TMPFILE
// is refused (an old kernel, a file system without it such as NFS) or the file cannot be
// named that way (no /proc), the data goes into the named temp file from the start (O_EXCL),
// silently, and a writer killed before the rename leaves it (a snapshot store removes those of
// dead writers when it opens its directory).
// With durable=false the two fsyncs are skipped (rename is still atomic for other processes).
// On failure no temp file is left and the error text, naming the temp path ("write <tmp>: No
// space left on device"; an unnamed file's first name it would have got), is returned; success
// returns an empty string. All fds are RAII and CLOEXEC.
// A `path` that exists and is not a regular file or a symlink (a device such as /dev/null, a
// FIFO, a directory) is refused, never replaced. A temp name left by a dead writer that had this
// process's pid (a restarted container's fresh pid namespace) is stepped over, not failed on.
// A temp name is in flight (temp_in_flight) from before it exists until the write returns.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ctrun::worker {

struct ConstBuf {
  const void* data;
  size_t size;
};

inline constexpr const char* kTempPrefix = ".tmp-";

std::string write_file_atomic(const std::string& path, std::initializer_list<ConstBuf> parts,
                              bool durable = true);

// Test-only switches of write_file_atomic: null/false by default and never set outside tests.
// They are read without a lock: set them only while no write runs.
struct AtomicWriteTestHooks {
  // Called once the data is written (and fsync'ed), right before the file gets its temp name
  // (unnamed file) or is closed and renamed (named temp), with the first temp name it will try,
  // which is in flight then (temp_in_flight). A test raises SIGKILL here.
  void (*before_name)(const std::string& tmp) = nullptr;
  bool named_temp_only = false;    // write as where O_TMPFILE is refused: the named temp file
  bool link_through_proc = false;  // name it as without CAP_DAC_READ_SEARCH: via /proc/self/fd
};
extern AtomicWriteTestHooks atomic_write_test_hooks;
// The <host> of temp names: this host's name (gethostname: a container's own when it has its own
// UTS namespace) with each byte outside [A-Za-z0-9._-] replaced by '_', or "unknown-host" when it
// has none. Read once per process. It tells a reader of a shared directory (an evaluator on
// another node, say) whether the <pid> of a temp name is one of the pids it can check: the name
// is assumed to identify one pid namespace, so writers that share a host name but not a pid
// namespace (containers given the host's name) are not told apart.
const std::string& temp_host_token();

// The writer a temp name records, from the part after ".tmp-<name>-": "<host>-<pid>-<n>", the
// fields taken from the right (a host name may hold dashes). A name of the older form
// "<pid>-<n>" (written before temp names carried the host) gives an empty host. nullopt when
// the part has neither form.
struct TempWriter {
  std::string host;
  pid_t pid = 0;
};
std::optional<TempWriter> parse_temp_writer(std::string_view tail);

// Whether `tmp` (a full temp path) is being written by write_file_atomic in this process now:
// a temp file with this process's pid that is not is a dead writer's.
bool temp_in_flight(const std::string& tmp);
// Whole file into *out; returns an error text, or empty on success.
std::string read_whole_file(const std::string& path, std::vector<std::byte>* out);
// fsync of a directory; error text or empty.
std::string fsync_dir(const std::string& dir);
// mkdir -p that makes what it creates durable: right after each mkdir that creates a component,
// the component's parent is fsync'ed (once), so the new entry survives a crash as the files later
// made durable inside it do. Components that exist are left alone (one that is not a directory
// is an error: ENOTDIR); a concurrent creator is fine (EEXIST). durable=false skips the fsyncs.
// Mode 0777 & ~umask, as mkdir -p. Error text ("mkdir <path>: Permission denied"), or empty.
std::string make_dirs(const std::string& dir, bool durable = true);
std::string dir_of(const std::string& path);
std::string base_of(const std::string& path);

}  // namespace ctrun::worker
