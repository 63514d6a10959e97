#include "report/error_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>

#include "base/unique_fd.h"
#include "sys/posix_util.h"
#include "worker/atomic_file.h"

namespace ctrun {
namespace {

using Json = nlohmann::json;

// torch stores the timestamp as a string of an int; Python's int() also accepts surrounding
// whitespace, a sign, and (from a number) a float. Anything else is "no timestamp".
std::optional<int64_t> ParseTimestamp(const Json& v) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (!std::isfinite(d) || std::fabs(d) > 9e18) return std::nullopt;
    return static_cast<int64_t>(d);
  }
  if (!v.is_string()) return std::nullopt;
  const std::string& s = v.get_ref<const std::string&>();
  size_t b = s.find_first_not_of(" \t\r\n");
  size_t e = s.find_last_not_of(" \t\r\n");
  if (b == std::string::npos) return std::nullopt;
  const char* first = s.data() + b;
  const char* last = s.data() + e + 1;
  if (*first == '+') ++first;
  int64_t out = 0;
  auto [ptr, ec] = std::from_chars(first, last, out);
  if (ec != std::errc() || ptr != last) return std::nullopt;
  return out;
}

std::string AsText(const Json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

// nlohmann's what() starts with "[json.exception.parse_error.101] "; the tag helps nobody here.
std::string ShortJsonError(const char* what) {
  std::string s = what;
  if (!s.empty() && s[0] == '[') {
    size_t close = s.find("] ");
    if (close != std::string::npos) s.erase(0, close + 2);
  }
  return s;
}

std::string SerializeRecord(const ErrorFileRecord& r) {
  Json msg = {{"message", r.message},
              {"extraInfo",
               {{"py_callstack", r.py_callstack.empty() ? r.message : r.py_callstack},
                {"timestamp", std::to_string(r.timestamp)}}}};
  if (r.error_code) msg["errorCode"] = *r.error_code;
  // error_handler_t::replace: worker output may hold invalid UTF-8; never throw on it.
  return Json{{"message", msg}}.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace

StatusOr<std::optional<ErrorFileContents>> ReadErrorFile(const std::string& path, size_t max_bytes) {
  if (path.empty()) return std::optional<ErrorFileContents>();
  // O_NONBLOCK: a FIFO planted at the path must not hang the agent in open(); it is then rejected
  // as not a regular file, like torch's os.path.isfile().
  UniqueFd fd(RetryOnEintr(
      [&] { return ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY); }));
  if (!fd) {
    int err = errno;
    if (err == ENOENT || err == ENOTDIR) return std::optional<ErrorFileContents>();
    return Status::Errno("cannot open", err);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::Errno("cannot stat", errno);
  if (!S_ISREG(st.st_mode)) return std::optional<ErrorFileContents>();
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return Status::Error("too large (" + std::to_string(st.st_size) + " bytes, limit " +
                         std::to_string(max_bytes) + ")");
  }

  // Read at most max_bytes + 1 so a file that grows after fstat is still caught.
  std::string text;
  text.resize(max_bytes + 1);
  size_t got = 0;
  while (got < text.size()) {
    ssize_t n = RetryOnEintr([&] { return ::read(fd.get(), text.data() + got, text.size() - got); });
    if (n < 0) return Status::Errno("cannot read", errno);
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got > max_bytes) {
    return Status::Error("too large (more than " + std::to_string(max_bytes) + " bytes)");
  }
  text.resize(got);
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) return Status::Error("empty file");

  Json data;
  try {
    data = Json::parse(text);
  } catch (const Json::exception& e) {
    return Status::Error("invalid JSON: " + ShortJsonError(e.what()));
  }
  if (!data.is_object()) return Status::Error("not a JSON object");
  auto msg_it = data.find("message");
  if (msg_it == data.end()) return Status::Error("no \"message\" field");

  ErrorFileContents out;
  const Json& msg = *msg_it;
  if (msg.is_string()) {
    out.message = msg.get<std::string>();
    if (auto ts = data.find("timestamp"); ts != data.end()) out.timestamp = ParseTimestamp(*ts);
  } else if (msg.is_object()) {
    out.message_is_dict = true;
    auto m = msg.find("message");
    if (m != msg.end() && !m->is_null()) out.message = AsText(*m);
    auto extra = msg.find("extraInfo");
    if (extra != msg.end() && extra->is_object()) {
      auto stack = extra->find("py_callstack");
      if (stack != extra->end() && stack->is_string()) out.traceback = stack->get<std::string>();
      if (auto ts = extra->find("timestamp"); ts != extra->end()) out.timestamp = ParseTimestamp(*ts);
      if (auto ns = extra->find("ctrun_timestamp_ns"); ns != extra->end()) out.timestamp_ns = ParseTimestamp(*ns);
    }
    auto code = msg.find("errorCode");
    if (code != msg.end() && code->is_number_integer()) {
      int64_t c = code->get<int64_t>();
      if (c >= std::numeric_limits<int>::min() && c <= std::numeric_limits<int>::max())
        out.error_code = static_cast<int>(c);
    }
  } else {
    return Status::Error("\"message\" is neither a string nor an object");
  }
  // Both forms: the summary always has a traceback to show.
  if (out.traceback.empty()) out.traceback = out.message.empty() ? "<N/A>" : out.message;
  out.raw = std::move(text);
  return std::optional<ErrorFileContents>(std::move(out));
}

Status WriteFileAtomically(const std::string& path, const std::string& contents) {
  if (path.empty()) return Status::Error("empty path");
  std::string err = worker::write_file_atomic(path, {{contents.data(), contents.size()}});
  return err.empty() ? Status::Ok() : Status::Error(err);
}

Status WriteErrorFile(const std::string& path, const ErrorFileRecord& record) {
  return WriteFileAtomically(path, SerializeRecord(record));
}

Status CopyErrorFile(const std::string& path, const ErrorFileContents& source, int error_code) {
  Json data;
  try {
    data = Json::parse(source.raw);
  } catch (const Json::exception& e) {
    return Status::Error("cannot re-parse the source error file: " + ShortJsonError(e.what()));
  }
  // Same rule as torch's override_error_code_in_rootcause_data: only a dict message gets it, and
  // dump_error_file skips a zero code.
  if (error_code != 0 && data.is_object()) {
    auto it = data.find("message");
    if (it != data.end() && it->is_object()) (*it)["errorCode"] = error_code;
  }
  return WriteFileAtomically(path, data.dump(-1, ' ', false, Json::error_handler_t::replace));
}

}  // namespace ctrun
