// Error files: the torchelastic JSON a worker leaves at $TORCHELASTIC_ERROR_FILE when it dies (torch's
// @record decorator writes it), and the one ctrun leaves at its own $TORCHELASTIC_ERROR_FILE for the
// scheduler above it, in the same format.
//
// Reader contract (a superset of torch's ProcessFailure.__post_init__, but never fatal):
//   * no file at the path (or not a regular file, or an empty path) -> nullopt: the normal case.
//   * {"message": {"message": M, "extraInfo": {"py_callstack": T, "timestamp": "<int>"}, "errorCode": C}}
//       -> message M, traceback T (else M, else "<N/A>"), timestamp, error code when present.
//   * {"message": "<text>", "timestamp": <int or "int">} -> message and traceback = text (traceback
//       "<N/A>" when the text is empty).
//   * anything else (bad JSON, no "message", larger than the cap, unreadable) -> an error Status whose
//     message is the reason; the caller shows it and treats the worker as having no error file.
//   torch requires extraInfo.timestamp and fails the whole agent without it; ctrun accepts the file
//   and leaves the timestamp empty (the detection time is used instead).
//
// Writer contract: every write is atomic (temp file in the same directory, fsync, rename, fsync of
// the directory), so a reader never sees a partial file. The output is always accepted by torch's
// reader: {"message": {"message": ..., "extraInfo": {"py_callstack": ..., "timestamp": "<int>"},
// "errorCode": <int>}}.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "base/status.h"

namespace ctrun {

// Files above this size are reported as unreadable rather than parsed (a worker that writes a
// gigabyte of "traceback" must not take the agent's memory with it).
inline constexpr size_t kMaxErrorFileBytes = 1 << 20;

struct ErrorFileContents {
  std::string message;                 // message.message, or the plain-string message
  std::string traceback;               // what the summary shows: py_callstack, else message
  std::optional<int64_t> timestamp;    // epoch seconds, when the file carries a usable one
  std::optional<int64_t> timestamp_ns; // extraInfo.ctrun_timestamp_ns (ctrun's worker library)
  std::optional<int> error_code;       // message.errorCode, when present (set by a parent agent)
  bool message_is_dict = false;        // the {"message": {...}} form (errorCode can be set)
  std::string raw;                     // the file's text, for copying it on to the parent
};

// See the reader contract above. max_bytes is for tests; callers use the default.
StatusOr<std::optional<ErrorFileContents>> ReadErrorFile(const std::string& path,
                                                         size_t max_bytes = kMaxErrorFileBytes);

// What ctrun writes when it describes a failure itself.
struct ErrorFileRecord {
  std::string message;        // one line, e.g. "Signal 9 (SIGKILL) received by PID 1234"
  std::string py_callstack;   // free text shown as the traceback (may be empty: message is used)
  int64_t timestamp = 0;      // epoch seconds
  std::optional<int> error_code;
};

// Atomically writes record in the torchelastic format to path.
Status WriteErrorFile(const std::string& path, const ErrorFileRecord& record);

// torch's @record / ErrorHandler.dump_error_file: copies a worker's error file to path, setting
// message.errorCode = error_code when message is a dict (a plain-string message is copied as is,
// like torch does). Atomic.
Status CopyErrorFile(const std::string& path, const ErrorFileContents& source, int error_code);

// The atomic write primitive used by both: temp file next to path, fsync, rename, fsync dir.
Status WriteFileAtomically(const std::string& path, const std::string& contents);

}  // namespace ctrun
