#include "install/install_util.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

namespace ctrun::testing {

std::string FindTool(const std::string& tool) {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  for (std::string extra : {"/usr/sbin", "/sbin"}) dirs += ":" + extra;  // update-alternatives, ldconfig
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    std::string dir = dirs.substr(start, end == std::string::npos ? std::string::npos : end - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + tool;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return "";
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

namespace {

// Whether this process may make a mount namespace and mount tmpfs in it.
bool CanHideTrees() {
  static const bool can = [] {
    std::string unshare = FindTool("unshare");
    if (unshare.empty()) return false;
    RunResult r = RunCommand({unshare, "-m", "--propagation", "private", "/bin/sh", "-c",
                              "mount -t tmpfs none " + ShellQuote(CTRUN_BUILD_DIR)});
    return r.exit_code == 0;
  }();
  return can;
}

}  // namespace

RunResult RunShell(const std::string& script, bool hide_trees, bool* hidden, std::chrono::milliseconds timeout) {
  bool hide = hide_trees && CanHideTrees();
  if (hidden) *hidden = hide;
  if (!hide) return RunCommand({"/bin/sh", "-c", script}, {}, timeout);
  // The build tree first: when it is inside the source tree, the second mount hides it again.
  std::string wrapped = "for d in " + ShellQuote(CTRUN_BUILD_DIR) + " " + ShellQuote(CTRUN_SOURCE_DIR) +
                        "; do if [ -d \"$d\" ]; then mount -t tmpfs none \"$d\" || exit 99; fi; done\n" + script;
  return RunCommand({FindTool("unshare"), "-m", "--propagation", "private", "/bin/sh", "-c", wrapped}, {}, timeout);
}

std::vector<std::string> ListTree(const std::string& root) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(root, ec)) {
    if (e.is_symlink() || e.is_regular_file()) files.push_back(e.path().lexically_relative(root).string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace ctrun::testing
