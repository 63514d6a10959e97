// --duplicate-stdout-filters / --duplicate-stderr-filters (torchrun's flags): every line of a
// relayed worker stream that contains any of the filter strings (a plain substring test, as in
// torchrun) is also written to one file per attempt and stream kind, shared by all ranks:
// <attempt dir>/filtered_stdout.log and filtered_stderr.log (LogDir).
//
// Contract:
//  - A line ends at '\n' or '\r' (a progress update is a line of its own); empty lines are never
//    copied. A line longer than max_line is tested and copied in max_line pieces. The partial
//    last line of a stream is tested at its end (Finish): a crashing rank's last words count.
//  - Each copied line is written as "<prefix><line>\n" in one write(2), so lines of different
//    ranks never mix; the prefix is the rank's plain console prefix (no colour), "" when none.
//  - A write error is logged once and turns the file off; the relay goes on.
//  - Loop thread only, like the relay that feeds it.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/unique_fd.h"

namespace ctrun::logs {

class DuplicateFile {
 public:
  DuplicateFile(UniqueFd fd, std::vector<std::string> filters, std::string what)
      : fd_(std::move(fd)), filters_(std::move(filters)), what_(std::move(what)) {}
  bool Matches(std::string_view line) const;
  void Write(std::string_view prefix, std::string_view line);

 private:
  UniqueFd fd_;
  std::vector<std::string> filters_;
  std::string what_;  // the file's path, for the error message
  std::string buf_;
};

// Cuts one stream into lines for a DuplicateFile.
class DuplicateTap {
 public:
  DuplicateTap(std::shared_ptr<DuplicateFile> file, std::string prefix, size_t max_line)
      : file_(std::move(file)), prefix_(std::move(prefix)), max_line_(max_line == 0 ? 1 : max_line) {}
  void Feed(std::string_view data);
  void Finish();

 private:
  void Emit(std::string_view line);

  std::shared_ptr<DuplicateFile> file_;
  std::string prefix_;
  size_t max_line_;
  std::string partial_;
};

}  // namespace ctrun::logs
