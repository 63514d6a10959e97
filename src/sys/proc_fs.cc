#include "sys/proc_fs.h"

#include <dirent.h>

#include <cstdlib>
#include <sstream>

#include "sys/posix_util.h"

namespace ctrun {

std::vector<pid_t> NumericEntries(const std::string& dir) {
  std::vector<pid_t> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    const long v = std::strtol(e->d_name, &end, 10);
    if (end != e->d_name && *end == '\0' && v > 0) out.push_back(static_cast<pid_t>(v));
  }
  ::closedir(d);
  return out;
}

std::optional<pid_t> ParentPid(const std::string& proc_root, pid_t pid) {
  std::string stat;
  if (!ReadFile(proc_root + "/" + std::to_string(pid) + "/stat", &stat)) return std::nullopt;
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream in(stat.substr(close + 1));
  std::string state;
  long ppid = 0;
  if (!(in >> state >> ppid)) return std::nullopt;
  return static_cast<pid_t>(ppid);
}

}  // namespace ctrun
