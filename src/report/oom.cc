#include "report/oom.h"

#include <csignal>
#include <charconv>
#include <sstream>
#include <vector>

#include "sys/posix_util.h"

namespace ctrun {
namespace {

// "/a/b/c" -> {"/a/b/c", "/a/b", "/a", ""}: the cgroup and its parents, relative to the mount.
std::vector<std::string> SelfAndParents(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  if (path == "/") path.clear();
  std::vector<std::string> out;
  for (;;) {
    out.push_back(path);
    if (path.empty()) break;
    size_t slash = path.find_last_of('/');
    path = (slash == std::string::npos) ? "" : path.substr(0, slash);
  }
  return out;
}

// Rejects paths that could climb out of the mount ("..") — /proc/self/cgroup is trusted, but the
// root argument makes this a parser of arbitrary test input too.
bool SafeCgroupPath(const std::string& p) { return p.find("..") == std::string::npos; }

std::optional<OomKillSample> ReadFromCgroup(const std::string& mount, const std::string& cg_path,
                                            const char* file, const char* source) {
  if (!SafeCgroupPath(cg_path)) return std::nullopt;
  for (const std::string& dir : SelfAndParents(cg_path)) {
    std::string text;
    if (!ReadFile(mount + dir + "/" + file, &text)) continue;
    if (auto n = ParseOomKillCounter(text)) return OomKillSample{*n, source};
    return std::nullopt;  // the file exists but has no counter (kernel < 4.13): parents won't either
  }
  return std::nullopt;
}

}  // namespace

std::optional<uint64_t> ParseOomKillCounter(const std::string& file_text) {
  std::istringstream in(file_text);
  std::string line;
  while (std::getline(in, line)) {
    constexpr std::string_view kKey = "oom_kill ";
    if (line.compare(0, kKey.size(), kKey) != 0) continue;
    const char* first = line.data() + kKey.size();
    const char* last = line.data() + line.size();
    while (first < last && *first == ' ') ++first;
    while (last > first && (last[-1] == ' ' || last[-1] == '\r')) --last;
    uint64_t v = 0;
    auto [ptr, ec] = std::from_chars(first, last, v);
    if (ec == std::errc() && ptr == last && first != last) return v;
    return std::nullopt;
  }
  return std::nullopt;
}

std::optional<CgroupMemoryPath> ParseProcSelfCgroup(const std::string& file_text) {
  // Lines are "hierarchy-id:controller-list:path". A v1 memory line wins over the v2 "0::" line
  // (hybrid systems keep memory on v1).
  std::optional<CgroupMemoryPath> v2;
  std::istringstream in(file_text);
  std::string line;
  while (std::getline(in, line)) {
    size_t c1 = line.find(':');
    if (c1 == std::string::npos) continue;
    size_t c2 = line.find(':', c1 + 1);
    if (c2 == std::string::npos) continue;
    std::string id = line.substr(0, c1);
    std::string controllers = line.substr(c1 + 1, c2 - c1 - 1);
    std::string path = line.substr(c2 + 1);
    if (id == "0" && controllers.empty()) {
      v2 = CgroupMemoryPath{path, false};
      continue;
    }
    std::istringstream cs(controllers);
    std::string c;
    while (std::getline(cs, c, ',')) {
      if (c == "memory") return CgroupMemoryPath{path, true};
    }
  }
  return v2;
}

std::optional<OomKillSample> ReadOomKillSample(const std::string& root) {
  std::string self;
  if (ReadFile(root + "/proc/self/cgroup", &self)) {
    if (auto cg = ParseProcSelfCgroup(self)) {
      std::optional<OomKillSample> s;
      if (cg->v1) {
        s = ReadFromCgroup(root + "/sys/fs/cgroup/memory", cg->path, "memory.oom_control",
                           "cgroup memory.oom_control");
      } else {
        s = ReadFromCgroup(root + "/sys/fs/cgroup", cg->path, "memory.events",
                           "cgroup memory.events");
        if (!s) {
          s = ReadFromCgroup(root + "/sys/fs/cgroup/unified", cg->path, "memory.events",
                             "cgroup memory.events");
        }
      }
      if (s) return s;
    }
  }
  std::string vmstat;
  if (ReadFile(root + "/proc/vmstat", &vmstat)) {
    if (auto n = ParseOomKillCounter(vmstat)) return OomKillSample{*n, "/proc/vmstat"};
  }
  return std::nullopt;
}

std::optional<uint64_t> ReadOomKillCount(const std::string& root) {
  auto s = ReadOomKillSample(root);
  if (!s) return std::nullopt;
  return s->count;
}

bool LikelyOomKilled(const ExitStatus& status, bool stopped_by_ctrun,
                     const std::optional<OomKillSample>& before,
                     const std::optional<OomKillSample>& after) {
  if (stopped_by_ctrun || !status.signaled() || status.signal() != SIGKILL) return false;
  if (!before || !after || before->source != after->source) return false;
  return after->count > before->count;
}

}  // namespace ctrun
