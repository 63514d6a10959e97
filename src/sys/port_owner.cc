#include "sys/port_owner.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <sstream>

#include "sys/posix_util.h"
#include "sys/proc_fs.h"

namespace ctrun {
namespace {

constexpr size_t kMaxCommand = 120;

bool HoldsInode(const std::string& proc_root, pid_t pid, unsigned long inode) {
  const std::string dir = proc_root + "/" + std::to_string(pid) + "/fd";
  const std::string want = "socket:[" + std::to_string(inode) + "]";
  for (pid_t fd : NumericEntries(dir)) {
    char buf[64];
    const ssize_t n = ::readlink((dir + "/" + std::to_string(fd)).c_str(), buf, sizeof buf);
    if (n > 0 && std::string(buf, static_cast<size_t>(n)) == want) return true;
  }
  return false;
}

// NUL-separated /proc files (cmdline, environ) as a list.
std::vector<std::string> NulList(const std::string& path) {
  std::string text;
  std::vector<std::string> out;
  if (!ReadFile(path, &text)) return out;
  size_t start = 0;
  while (start < text.size()) {
    size_t nul = text.find('\0', start);
    if (nul == std::string::npos) nul = text.size();
    out.push_back(text.substr(start, nul - start));
    start = nul + 1;
  }
  return out;
}

std::string RunIdOf(const std::string& proc_root, pid_t pid) {
  for (const std::string& kv : NulList(proc_root + "/" + std::to_string(pid) + "/environ"))
    if (kv.rfind("TORCHELASTIC_RUN_ID=", 0) == 0) return kv.substr(20);
  return "";
}

}  // namespace

std::vector<unsigned long> SocketInodesOnPort(const std::string& text, int port) {
  std::vector<unsigned long> listening, other;
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string sl, local, remote, st, queues, timer, retr, uid, timeout;
    unsigned long inode = 0;
    if (!(f >> sl >> local >> remote >> st >> queues >> timer >> retr >> uid >> timeout >> inode)) continue;
    const size_t colon = local.rfind(':');
    if (colon == std::string::npos) continue;
    const long p = std::strtol(local.c_str() + colon + 1, nullptr, 16);
    if (p != port || inode == 0) continue;
    (st == "0A" ? listening : other).push_back(inode);
  }
  listening.insert(listening.end(), other.begin(), other.end());
  return listening;
}

std::optional<PortHolder> FindPortHolder(int port, const std::string& proc_root) {
  std::vector<unsigned long> inodes;
  for (const char* file : {"/net/tcp", "/net/tcp6"}) {
    std::string text;
    if (!ReadFile(proc_root + file, &text)) continue;
    for (unsigned long i : SocketInodesOnPort(text, port)) inodes.push_back(i);
  }
  if (inodes.empty()) return std::nullopt;
  PortHolder h;
  const std::vector<pid_t> pids = NumericEntries(proc_root);
  for (pid_t pid : pids)
    if (HoldsInode(proc_root, pid, inodes.front())) {
      h.pid = pid;
      break;
    }
  if (h.pid == 0) return h;
  for (const std::string& arg : NulList(proc_root + "/" + std::to_string(h.pid) + "/cmdline"))
    h.command += (h.command.empty() ? "" : " ") + arg;
  // One line: a `python -c` program's newlines (and any other control character) become spaces.
  for (char& ch : h.command)
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = ' ';
  if (h.command.size() > kMaxCommand) h.command = h.command.substr(0, kMaxCommand - 3) + "...";
  h.run_id = RunIdOf(proc_root, h.pid);
  for (size_t i = 0; i < pids.size() && h.run_id.empty(); ++i)
    if (ParentPid(proc_root, pids[i]) == h.pid) h.run_id = RunIdOf(proc_root, pids[i]);
  return h;
}

std::string DescribePortHolder(const std::optional<PortHolder>& holder, const std::string& own_run_id,
                               const std::string& entrypoint_name, const std::string& port_flag, bool single_node) {
  const std::string pick = "pick another " + port_flag + (single_node ? ", or --standalone for a free one" : "");
  if (!holder) return "the port is in use: " + pick;
  if (holder->pid == 0) return "the port is in use by a process this user cannot see: " + pick;
  const std::string who = "pid " + std::to_string(holder->pid) + " (" + holder->command + ")";
  const bool same_id = !holder->run_id.empty() && holder->run_id == own_run_id;
  const bool same_job = same_id && (own_run_id != "none" || entrypoint_name.empty() ||
                                    holder->command.find(entrypoint_name) != std::string::npos);
  if (same_job)
    return "the port is held by " + who + ", a run of this same job (run id '" + own_run_id +
           "') that is still running: stop it (kill " + std::to_string(holder->pid) + ") or pick another " +
           port_flag;
  std::string text = "the port is held by " + who;
  if (!holder->run_id.empty()) text += ", a job with run id '" + holder->run_id + "'";
  return text + ": " + pick;
}

}  // namespace ctrun
