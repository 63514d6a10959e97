#include "sys/proc_fs.h"

#include <dirent.h>

#include <cstdio>
#include <cstdlib>

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

std::optional<ProcStat> ReadProcStat(const std::string& proc_root, pid_t pid) {
  std::string stat;
  if (!ReadFile(proc_root + "/" + std::to_string(pid) + "/stat", &stat)) return std::nullopt;
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  ProcStat st;
  int ppid = 0, pgrp = 0;
  if (std::sscanf(stat.c_str() + close + 1, " %c %d %d", &st.state, &ppid, &pgrp) != 3) return std::nullopt;
  st.ppid = static_cast<pid_t>(ppid);
  st.pgrp = static_cast<pid_t>(pgrp);
  return st;
}

std::optional<pid_t> ParentPid(const std::string& proc_root, pid_t pid) {
  const std::optional<ProcStat> st = ReadProcStat(proc_root, pid);
  if (!st) return std::nullopt;
  return st->ppid;
}

}  // namespace ctrun
