// ctrun/error_file.h — report a worker's fatal error to the launcher, as torchelastic does.
//
// Contract: record_error() writes, ATOMICALLY (temp file in the same directory, fsync, rename,
// fsync of the directory), the JSON that torch's ErrorHandler writes and ProcessFailure reads:
//   {"message": {"message": "<message>",
//                "extraInfo": {"py_callstack": "<callstack>", "timestamp": "<epoch seconds>"}}}
// to $TORCHELASTIC_ERROR_FILE (or to an explicit path). With an empty callstack the
// "py_callstack" key is left out: torch's reader (ChildFailedError) shows py_callstack whenever
// the key exists, so an empty one would print an empty traceback, and falls back to the message
// only when the key is missing (ctrun's reader does the same). The timestamp is an integer written as a
// string, as the Python reader requires. extraInfo also carries "ctrun_timestamp_ns" (epoch
// nanoseconds, a string; torch ignores it): ctrun orders failures that happen within the same
// second by it, so the rank that failed first is named as the root cause, not a peer that died of
// "connection closed" a millisecond later. A reader never sees a partial file. Without
// TORCHELASTIC_ERROR_FILE (or with it empty) record_error() does nothing and returns false.
// record_error() never throws; it returns whether the file was written.
// Size: message and callstack are each capped at kMaxErrorTextBytes; a longer one keeps its head
// and its tail (cut on UTF-8 character boundaries) around "\n... [<n> bytes cut] ...\n", n the
// bytes left out. JSON escaping makes a byte at most 6 ("\u0001"), so the whole file stays under
// 800 KB, inside the 1 MiB that ctrun (and a sane reader) reads of an error file; uncapped, a
// message over ~512 KB, written twice (message and the callstack's last line), made ctrun drop
// the file and its message.
//
// install_terminate_handler() makes an uncaught C++ exception (or std::terminate) record
// "<demangled type>: <what()>" with a native backtrace as the callstack, then chain to the
// previous handler (abort, so the launcher sees SIGABRT). run_recorded(fn) is the equivalent of
// Python's @record: it runs fn, and on an exception records it and returns 1.
#pragma once

#include <cstddef>
#include <ctime>
#include <exception>
#include <functional>
#include <string>

namespace ctrun::worker {

inline constexpr size_t kMaxErrorTextBytes = 64 * 1024;

// The JSON document, for tests and for callers that want to write it elsewhere.
// timestamp_ns < 0: derived from timestamp (whole seconds).
std::string error_file_json(const std::string& message, const std::string& callstack,
                            std::time_t timestamp, long long timestamp_ns = -1);

bool record_error(const std::string& message, const std::string& callstack = {});
bool record_error_to(const std::string& path, const std::string& message,
                     const std::string& callstack = {});
// Records "<type>: <what>" for an exception pointer (nullptr: "unknown error"), then one
// "\ncaused by: <type>: <what>" line per exception nested in it (std::throw_with_nested), outermost
// first.
bool record_exception(std::exception_ptr e);

// A native backtrace (one frame per line), best effort.
std::string native_backtrace(int skip_frames = 1);

void install_terminate_handler();
int run_recorded(const std::function<int()>& fn);

}  // namespace ctrun::worker
