// Small helpers for the logs tests: a self-removing temp dir and file reading.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

#include "sys/posix_util.h"

namespace ctrun::logs::testing {

class TempDir {
 public:
  TempDir() {
    const char* t = std::getenv("TMPDIR");
    std::string tmpl = std::string(t && *t ? t : "/tmp") + "/ctrun_logs_test_XXXXXX";
    path_ = ::mkdtemp(tmpl.data()) ? tmpl : std::string();
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline std::string Slurp(const std::string& path) {
  std::string s;
  ReadFile(path, &s);
  return s;
}

}  // namespace ctrun::logs::testing
