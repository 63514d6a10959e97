#include "atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>

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

}  // namespace

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
  static std::atomic<unsigned> counter{0};
  if (NotReplaceable(path)) return ErrnoText("replace", path, EEXIST) + " (not a regular file)";
  const std::string dir = dir_of(path);
  std::string tmp;
  UniqueFd fd;
  // A name taken can only be a dead writer's with our pid: the next number is free of it.
  std::optional<InFlightEntry> in_flight;  // from before the file exists: a store's start-up
                                          // never takes it for a dead writer's
  for (int tries = 0; tries < 64 && !fd; ++tries) {
    tmp = dir + "/" + kTempPrefix + base_of(path) + "-" + temp_host_token() + "-" + std::to_string(::getpid()) +
          "-" + std::to_string(counter.fetch_add(1));
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
  for (const ConstBuf& b : parts) {
    if (b.size > 0 && !WriteFully(fd.get(), b.data, b.size)) return fail("write");
  }
  if (durable && ::fsync(fd.get()) != 0) return fail("fsync");
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
  if (durable) return fsync_dir(dir);
  return {};
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
