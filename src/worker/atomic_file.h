// atomic_file.h — durable whole-file replacement, shared by the error file and the snapshot store
// of ctrun_worker and by the agent's report module (src/report/error_file.cc). Not installed.
//
// Contract: write_file_atomic(path, parts) writes the concatenation of `parts` to a new temp file
// "<dir>/.tmp-<name>-<host>-<pid>-<n>" (<host>: temp_host_token(), below; O_EXCL|O_CLOEXEC, mode
// 0644), fsyncs it, renames it over `path`,
// and fsyncs the directory, so `path` holds either its old content or all of the new one, also
// across a crash. With durable=false the two fsyncs are skipped (rename is still atomic for other
// processes). On failure the temp file is removed and the error text ("write <tmp>: No space
// left on device") is returned; success returns an empty string. All fds are RAII and CLOEXEC.
// A `path` that exists and is not a regular file or a symlink (a device such as /dev/null, a
// FIFO, a directory) is refused, never replaced. A temp name left by a dead writer that had this
// process's pid (a restarted container's fresh pid namespace) is stepped over, not failed on.
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
