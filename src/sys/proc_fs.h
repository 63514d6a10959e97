// Small readers of /proc shared by the descendant sweep (process/descendants.h) and the port
// holder lookup (sys/port_owner.h). proc_root is "/proc" except in tests.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace ctrun {

// The numeric names in a directory (/proc: every pid; /proc/<pid>/task: every tid).
std::vector<pid_t> NumericEntries(const std::string& dir);

// The head of /proc/<pid>/stat: "pid (comm) S ppid pgrp ...", read after the last ')' (comm may
// hold spaces and ')'). nullopt when the process is gone or the file is unreadable.
struct ProcStat {
  char state = '?';  // R, S, D, Z, T, ...
  pid_t ppid = 0;
  pid_t pgrp = 0;
};
std::optional<ProcStat> ReadProcStat(const std::string& proc_root, pid_t pid);

// The parent pid from ReadProcStat.
std::optional<pid_t> ParentPid(const std::string& proc_root, pid_t pid);

}  // namespace ctrun
