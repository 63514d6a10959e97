#include "logs/duplicate_filter.h"

#include <cerrno>
#include <cstring>

#include "logs/logging.h"
#include "sys/posix_util.h"

namespace ctrun::logs {

bool DuplicateFile::Matches(std::string_view line) const {
  for (const auto& f : filters_)
    if (line.find(f) != std::string_view::npos) return true;
  return false;
}

void DuplicateFile::Write(std::string_view prefix, std::string_view line) {
  if (!fd_) return;
  buf_.assign(prefix);
  buf_.append(line);
  buf_.push_back('\n');
  if (!WriteAll(fd_.get(), buf_.data(), buf_.size())) {
    int err = errno;
    LogWarning(what_ + ": write: " + std::strerror(err) + "; no more filtered lines go to it");
    fd_.reset();
  }
}

void DuplicateTap::Emit(std::string_view line) {
  if (!line.empty() && file_->Matches(line)) file_->Write(prefix_, line);
}

void DuplicateTap::Feed(std::string_view data) {
  while (!data.empty()) {
    size_t end = data.find_first_of("\n\r");
    if (end == std::string_view::npos) {
      partial_.append(data);
      while (partial_.size() >= max_line_) {
        Emit(std::string_view(partial_).substr(0, max_line_));
        partial_.erase(0, max_line_);
      }
      return;
    }
    if (partial_.empty()) {
      Emit(data.substr(0, end));
    } else {
      partial_.append(data.substr(0, end));
      Emit(partial_);
      partial_.clear();
    }
    data.remove_prefix(end + 1);
  }
}

void DuplicateTap::Finish() {
  Emit(partial_);
  partial_.clear();
}

}  // namespace ctrun::logs
