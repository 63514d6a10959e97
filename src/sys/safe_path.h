// PlantedSymlink: the check the kernel makes itself under fs.protected_symlinks=1 (often 0 in
// containers and older systems), for paths ctrun and the worker library create files under.
//
// Contract: walks the components of `path` (relative paths start at the working directory) that
// exist and returns, for the first symlink that sits in a sticky, world-writable directory (a
// /tmp-like place) and is owned by neither this process's effective uid nor that directory's owner,
// "<component> is a symlink owned by uid N in the sticky, world-writable directory <dir>"; "" when
// there is none. Such a link was planted by another user: following it would let them choose where
// our files go (or which of our files get replaced). Header-only (used by the agent and by the
// worker library, which links nothing of the agent). A race with a link planted after the check
// remains; the check closes the common case of a link planted in advance.
#pragma once

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

namespace ctrun {

inline std::string PlantedSymlink(const std::string& path) {
  std::string dir;
  if (path.empty() || path[0] != '/') {
    char cwd[PATH_MAX];
    if (::getcwd(cwd, sizeof cwd) == nullptr) return "";
    dir = cwd;
  }
  size_t pos = 0;
  while (pos < path.size()) {
    size_t end = path.find('/', pos);
    if (end == std::string::npos) end = path.size();
    const std::string comp = path.substr(pos, end - pos);
    pos = end + 1;
    if (comp.empty() || comp == ".") continue;
    const std::string cur = (dir == "/" ? "" : dir) + "/" + comp;
    struct stat lst {};
    if (::lstat(cur.c_str(), &lst) != 0) return "";  // the rest does not exist yet: we create it
    if (S_ISLNK(lst.st_mode)) {
      struct stat parent {};
      const std::string parent_dir = dir.empty() ? "/" : dir;
      if (::stat(parent_dir.c_str(), &parent) == 0 && (parent.st_mode & S_ISVTX) && (parent.st_mode & S_IWOTH) &&
          lst.st_uid != ::geteuid() && lst.st_uid != parent.st_uid) {
        return cur + " is a symlink owned by uid " + std::to_string(lst.st_uid) +
               " in the sticky, world-writable directory " + parent_dir;
      }
      char real[PATH_MAX];
      if (::realpath(cur.c_str(), real) == nullptr) return "";
      dir = real;
    } else {
      dir = cur;
    }
  }
  return "";
}

}  // namespace ctrun
