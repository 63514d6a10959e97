#include "atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>
#include <string_view>
#include <utility>

#include "base/unique_fd.h"
#include "sys/posix_util.h"

namespace ctrun::worker {
namespace {

std::string ErrnoText(const std::string& what, const std::string& path, int err) {
  return what + " " + path + ": " + std::strerror(err);
}

// The temp paths this process is writing now.
std::mutex g_in_flight_mu;
std::set<std::string>& InFlight() {
  static std::set<std::string>* s = new std::set<std::string>;  // never destroyed: atexit order
  return *s;
}

struct InFlightEntry {
  std::string path;
  explicit InFlightEntry(std::string p) : path(std::move(p)) {
    std::lock_guard lock(g_in_flight_mu);
    InFlight().insert(path);
  }
  ~InFlightEntry() {
    std::lock_guard lock(g_in_flight_mu);
    InFlight().erase(path);
  }
};

// A path whose existing entry must not be replaced by a file.
bool NotReplaceable(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return false;
  return !S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode);
}

bool WriteFully(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    // Large writes are split by the kernel anyway; cap each call so progress is visible.
    size_t chunk = n < (size_t{1} << 30) ? n : (size_t{1} << 30);
    ssize_t w = RetryOnEintr([&] { return ::write(fd, p, chunk); });
    if (w < 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool WriteParts(int fd, std::initializer_list<ConstBuf> parts) {
  for (const ConstBuf& b : parts) {
    if (b.size > 0 && !WriteFully(fd, b.data, b.size)) return false;
  }
  return true;
}

// The next temp name for `path`: "<dir>/.tmp-<name>-<host>-<pid>-<n>", n counting this
// process's writes (and its tries over names a dead writer with our pid left).
std::string NextTempName(const std::string& path) {
  static std::atomic<unsigned> counter{0};
  return dir_of(path) + "/" + kTempPrefix + base_of(path) + "-" + temp_host_token() + "-" +
         std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
}

// The last steps of both ways, once `fd` (all data written, fsync'ed when durable) is named
// `tmp`: close, rename over `path`, fsync of the directory. The temp file is removed when the
// close or the rename fails.
std::string Publish(UniqueFd fd, const std::string& tmp, const std::string& path, bool durable) {
  // close() can report a deferred write error (NFS); check it before publishing the file.
  if (::close(fd.release()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoText("close", tmp, err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoText("rename to " + path + " from", tmp, err);
  }
  if (durable) return fsync_dir(dir_of(path));
  return {};
}

// The fallback, and the only way where O_TMPFILE is missing: the data goes into a named temp
// file from the start, so a writer killed before the rename leaves it behind (a snapshot store
// removes dead writers' temp files when it opens its directory).
std::string WriteNamed(const std::string& path, std::initializer_list<ConstBuf> parts, bool durable) {
  std::string tmp;
  UniqueFd fd;
  // A name taken can only be a dead writer's with our pid: the next number is free of it.
  std::optional<InFlightEntry> in_flight;  // from before the file exists: a store's start-up
                                          // never takes it for a dead writer's
  for (int tries = 0; tries < 64 && !fd; ++tries) {
    tmp = NextTempName(path);
    in_flight.emplace(tmp);
    fd.reset(RetryOnEintr([&] { return ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644); }));
    if (!fd && errno != EEXIST) break;
  }
  if (!fd) return ErrnoText("create", tmp, errno);
  auto fail = [&](const std::string& what) {
    int err = errno;
    fd.reset();
    ::unlink(tmp.c_str());
    return ErrnoText(what, tmp, err);
  };
  if (!WriteParts(fd.get(), parts)) return fail("write");
  if (durable && ::fsync(fd.get()) != 0) return fail("fsync");
  if (atomic_write_test_hooks.before_name) atomic_write_test_hooks.before_name(tmp);
  return Publish(std::move(fd), tmp, path, durable);
}

// This process's umask, from /proc/self/status ("Umask:\t0022", Linux >= 4.7): umask() reads it
// only by setting it, which races with other threads creating files. nullopt when unreadable.
std::optional<mode_t> CurrentUmask() {
  UniqueFd fd(RetryOnEintr([] { return ::open("/proc/self/status", O_RDONLY | O_CLOEXEC); }));
  if (!fd) return std::nullopt;
  std::string text = "\n";  // so that the key matches on the first line too
  char buf[4096];
  for (;;) {
    const ssize_t n = RetryOnEintr([&] { return ::read(fd.get(), buf, sizeof buf); });
    if (n < 0) return std::nullopt;
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  constexpr std::string_view kKey = "\nUmask:\t";
  const size_t at = text.find(kKey);
  if (at == std::string::npos) return std::nullopt;
  const char* first = text.data() + at + kKey.size();
  unsigned mask = 0;
  auto [end, ec] = std::from_chars(first, text.data() + text.size(), mask, 8);
  if (ec != std::errc() || end == first || mask > 0777) return std::nullopt;
  return static_cast<mode_t>(mask);
}

// An unnamed regular file in `dir` (O_TMPFILE), with the mode the named temp file would get:
// 0644 less the umask, or what the directory's default ACL gives (kernels before 5.19 skip the
// umask for O_TMPFILE on file systems without ACLs, so it is applied here). An invalid fd when
// the kernel or file system refuses O_TMPFILE (EOPNOTSUPP, EISDIR, EINVAL), on any other error
// (the named temp file then reports it, as before O_TMPFILE was used), or when the umask cannot
// be read (no /proc: the file could not be named through it either).
UniqueFd OpenUnnamed(const std::string& dir) {
#if defined(__linux__) && defined(O_TMPFILE)
  if (atomic_write_test_hooks.named_temp_only) return {};
  const std::optional<mode_t> mask = CurrentUmask();
  if (!mask) return {};
  UniqueFd fd(RetryOnEintr([&] { return ::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644); }));
  struct stat st {};
  if (!fd || ::fstat(fd.get(), &st) != 0) return {};
  const mode_t want = 0644 & ~*mask;
  if ((st.st_mode & 07777) == want) return fd;
  const bool default_acl = ::getxattr(dir.c_str(), "system.posix_acl_default", nullptr, 0) >= 0;
  if (!default_acl && ::fchmod(fd.get(), want) != 0) return {};
  return fd;
#else
  (void)dir;
  return {};
#endif
}

// Gives the unnamed file `fd` the name `tmp`: linkat(AT_EMPTY_PATH) first, which may need
// CAP_DAC_READ_SEARCH (ENOENT without it), then through /proc/self/fd, which needs none.
// 0, or the errno of the last try.
int LinkUnnamed(int fd, const std::string& tmp) {
  if (!atomic_write_test_hooks.link_through_proc) {
    if (::linkat(fd, "", AT_FDCWD, tmp.c_str(), AT_EMPTY_PATH) == 0) return 0;
    if (errno == EEXIST) return EEXIST;
  }
  const std::string proc = "/proc/self/fd/" + std::to_string(fd);
  if (::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, tmp.c_str(), AT_SYMLINK_FOLLOW) == 0) return 0;
  return errno;
}

// Link errors that mean this way of naming is unavailable here (no /proc, a restricted one, a
// file system that links no files), which the named temp file does not need. Others (ENOSPC,
// EDQUOT, EROFS, ...) it would hit as well: they are reported.
bool NamedTempAvoids(int err) {
  switch (err) {
    case ENOENT: case ENOTDIR: case EACCES: case EPERM: case ELOOP: case EXDEV: case EOPNOTSUPP: case EINVAL:
      return true;
    default:
      return false;
  }
}

// The data goes into the unnamed file `fd`, which gets its temp name only once complete, right
// before the rename: a writer killed before that leaves nothing. nullopt when naming it failed
// in a way the named temp file avoids (NamedTempAvoids); the caller then writes that instead.
// Errors before the file has a name are reported under the first name it would have got.
std::optional<std::string> WriteUnnamed(UniqueFd fd, const std::string& path,
                                        std::initializer_list<ConstBuf> parts, bool durable) {
  std::string tmp = NextTempName(path);
  if (!WriteParts(fd.get(), parts)) return ErrnoText("write", tmp, errno);
  if (durable && ::fsync(fd.get()) != 0) return ErrnoText("fsync", tmp, errno);
  // In flight before the name exists: a store's start-up in this process never takes it for a
  // dead writer's (another process's store sees our pid alive). A name taken can only be a dead
  // writer's with our pid: the next number is free of it.
  std::optional<InFlightEntry> in_flight(std::in_place, tmp);
  if (atomic_write_test_hooks.before_name) atomic_write_test_hooks.before_name(tmp);
  int err = LinkUnnamed(fd.get(), tmp);
  for (int tries = 1; tries < 64 && err == EEXIST; ++tries) {
    tmp = NextTempName(path);
    in_flight.emplace(tmp);
    err = LinkUnnamed(fd.get(), tmp);
  }
  if (err != 0 && NamedTempAvoids(err)) return std::nullopt;
  if (err != 0) return ErrnoText("link", tmp, err);
  return Publish(std::move(fd), tmp, path, durable);
}

}  // namespace

AtomicWriteTestHooks atomic_write_test_hooks;

const std::string& temp_host_token() {
  static const std::string token = [] {
    char name[256] = {};
    std::string t;
    if (::gethostname(name, sizeof name - 1) == 0) t = name;
    for (char& c : t) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                      c == '_' || c == '-';
      if (!ok) c = '_';
    }
    return t.empty() ? std::string("unknown-host") : t;
  }();
  return token;
}

std::optional<TempWriter> parse_temp_writer(std::string_view tail) {
  auto number = [](std::string_view text, auto* out) {
    if (text.empty()) return false;
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
    return ec == std::errc() && p == text.data() + text.size();
  };
  const size_t last = tail.rfind('-');
  unsigned long long n = 0;
  if (last == std::string_view::npos || !number(tail.substr(last + 1), &n)) return std::nullopt;
  const std::string_view head = tail.substr(0, last);
  const size_t dash = head.rfind('-');
  TempWriter w;
  if (!number(dash == std::string_view::npos ? head : head.substr(dash + 1), &w.pid) || w.pid <= 0)
    return std::nullopt;
  if (dash != std::string_view::npos) w.host = std::string(head.substr(0, dash));
  return w;
}

std::string dir_of(const std::string& path) {
  auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string base_of(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string fsync_dir(const std::string& dir) {
  UniqueFd fd(RetryOnEintr([&] { return ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); }));
  if (!fd) return ErrnoText("open", dir, errno);
  if (::fsync(fd.get()) != 0) return ErrnoText("fsync", dir, errno);
  return {};
}

std::string make_dirs(const std::string& dir, bool durable) {
  if (dir.empty()) return "mkdir: empty directory name";
  std::string path = dir[0] == '/' ? "/" : "";  // the components made so far
  for (size_t pos = 0; pos < dir.size();) {
    size_t slash = dir.find('/', pos);
    if (slash == std::string::npos) slash = dir.size();
    const std::string component = dir.substr(pos, slash - pos);
    pos = slash + 1;
    if (component.empty()) continue;  // a leading, doubled or trailing '/'
    const std::string parent = path.empty() ? "." : path;
    path = path.empty() ? component : path == "/" ? "/" + component : path + "/" + component;
    if (::mkdir(path.c_str(), 0777) == 0) {
      if (durable) {
        if (std::string err = fsync_dir(parent); !err.empty()) return err;
      }
      continue;
    }
    if (errno != EEXIST) return ErrnoText("mkdir", path, errno);
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return ErrnoText("stat", path, errno);
    if (!S_ISDIR(st.st_mode)) return ErrnoText("mkdir", path, ENOTDIR);
  }
  return {};
}

std::string write_file_atomic(const std::string& path, std::initializer_list<ConstBuf> parts,
                              bool durable) {
  if (NotReplaceable(path)) return ErrnoText("replace", path, EEXIST) + " (not a regular file)";
  const std::string dir = dir_of(path);
  if (UniqueFd fd = OpenUnnamed(dir)) {
    std::optional<std::string> result = WriteUnnamed(std::move(fd), path, parts, durable);
    if (result) return *result;
  }
  return WriteNamed(path, parts, durable);
}

bool temp_in_flight(const std::string& tmp) {
  std::lock_guard lock(g_in_flight_mu);
  return InFlight().count(tmp) > 0;
}

std::string read_whole_file(const std::string& path, std::vector<std::byte>* out) {
  UniqueFd fd(RetryOnEintr([&] { return ::open(path.c_str(), O_RDONLY | O_CLOEXEC); }));
  if (!fd) return ErrnoText("open", path, errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ErrnoText("stat", path, errno);
  out->resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < out->size()) {
    ssize_t r = RetryOnEintr([&] { return ::read(fd.get(), out->data() + got, out->size() - got); });
    if (r < 0) return ErrnoText("read", path, errno);
    if (r == 0) break;  // shrank while reading
    got += static_cast<size_t>(r);
  }
  out->resize(got);
  return {};
}

}  // namespace ctrun::worker
