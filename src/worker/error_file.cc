#include <ctime>
#include "ctrun/error_file.h"

#include <cxxabi.h>
#include <execinfo.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <typeinfo>

#include "atomic_file.h"

namespace ctrun::worker {
namespace {

// Appends s as a JSON string body. Invalid UTF-8 bytes become U+FFFD so the document always
// decodes (Python opens the file as UTF-8 text).
void AppendJsonString(std::string* out, const std::string& s) {
  out->push_back('"');
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    unsigned char c = p[i];
    if (c < 0x80) {
      switch (c) {
        case '"': *out += "\\\""; break;
        case '\\': *out += "\\\\"; break;
        case '\n': *out += "\\n"; break;
        case '\r': *out += "\\r"; break;
        case '\t': *out += "\\t"; break;
        case '\b': *out += "\\b"; break;
        case '\f': *out += "\\f"; break;
        default:
          if (c < 0x20 || c == 0x7f) {
            static const char kHex[] = "0123456789abcdef";
            *out += "\\u00";
            out->push_back(kHex[c >> 4]);
            out->push_back(kHex[c & 0xf]);
          } else {
            out->push_back(static_cast<char>(c));
          }
      }
      ++i;
      continue;
    }
    // Multi-byte sequence: validate length, continuation bytes, overlongs and surrogates.
    size_t len = 0;
    uint32_t cp = 0;
    if ((c & 0xe0) == 0xc0) { len = 2; cp = c & 0x1f; }
    else if ((c & 0xf0) == 0xe0) { len = 3; cp = c & 0x0f; }
    else if ((c & 0xf8) == 0xf0) { len = 4; cp = c & 0x07; }
    bool ok = len != 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) ok = false;
      else cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    if (ok) {
      static const uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
      ok = cp >= kMin[len] && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff);
    }
    if (ok) {
      out->append(s, i, len);
      i += len;
    } else {
      *out += "\xef\xbf\xbd";
      ++i;
    }
  }
  out->push_back('"');
}

bool IsUtf8Continuation(char c) { return (static_cast<unsigned char>(c) & 0xc0) == 0x80; }

// s itself when it fits kMaxErrorTextBytes; else its head and tail around a marker that says how
// many bytes were cut, both cut on a UTF-8 character boundary (a character of at most 4 bytes is
// never split, so valid UTF-8 stays valid), the whole at most kMaxErrorTextBytes.
std::string CapErrorText(const std::string& s) {
  if (s.size() <= kMaxErrorTextBytes) return s;
  constexpr size_t kMarkerRoom = 64;  // "\n... [<up to 20 digits> bytes cut] ...\n" is 42 bytes
  const size_t half = (kMaxErrorTextBytes - kMarkerRoom) / 2;
  size_t head = half;  // bytes kept at the front: s[head] must start a character
  for (int k = 0; k < 3 && head > 0 && IsUtf8Continuation(s[head]); ++k) --head;
  size_t tail = s.size() - half;  // first byte kept at the back: must start a character
  for (int k = 0; k < 3 && tail < s.size() && IsUtf8Continuation(s[tail]); ++k) ++tail;
  return s.substr(0, head) + "\n... [" + std::to_string(tail - head) + " bytes cut] ...\n" + s.substr(tail);
}

std::string Demangle(const char* name) {
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> d(abi::__cxa_demangle(name, nullptr, nullptr, &status),
                                                &std::free);
  return status == 0 && d ? std::string(d.get()) : std::string(name);
}

std::string ErrorFilePath() {
  const char* p = std::getenv("TORCHELASTIC_ERROR_FILE");
  return p ? std::string(p) : std::string();
}

std::terminate_handler g_previous_terminate = nullptr;

[[noreturn]] void OnTerminate() {
  static std::atomic<bool> recorded{false};
  if (!recorded.exchange(true)) {
    if (auto e = std::current_exception()) {
      record_exception(e);
    } else {
      record_error("std::terminate called without an active exception", native_backtrace(2));
    }
  }
  if (g_previous_terminate != nullptr) g_previous_terminate();
  std::abort();
}

}  // namespace

std::string error_file_json(const std::string& message, const std::string& callstack,
                            std::time_t timestamp, long long timestamp_ns) {
  if (timestamp_ns < 0) timestamp_ns = static_cast<long long>(timestamp) * 1000000000LL;
  std::string out = "{\"message\": {\"message\": ";
  AppendJsonString(&out, CapErrorText(message));
  out += ", \"extraInfo\": {";
  // No callstack, no key: torch's reader shows py_callstack whenever the key exists (an empty one
  // is an empty traceback) and falls back to the message only when it is missing.
  if (!callstack.empty()) {
    out += "\"py_callstack\": ";
    AppendJsonString(&out, CapErrorText(callstack));
    out += ", ";
  }
  out += "\"timestamp\": \"" + std::to_string(static_cast<long long>(timestamp)) + "\"";
  out += ", \"ctrun_timestamp_ns\": \"" + std::to_string(timestamp_ns) + "\"}}}\n";
  return out;
}

bool record_error_to(const std::string& path, const std::string& message,
                     const std::string& callstack) {
  if (path.empty()) return false;
  try {
    timespec now{};
    ::clock_gettime(CLOCK_REALTIME, &now);
    const std::string doc = error_file_json(message, callstack, now.tv_sec,
                                            static_cast<long long>(now.tv_sec) * 1000000000LL + now.tv_nsec);
    return write_file_atomic(path, {{doc.data(), doc.size()}}).empty();
  } catch (...) {  // bad_alloc while dying: nothing better to do
    return false;
  }
}

bool record_error(const std::string& message, const std::string& callstack) {
  return record_error_to(ErrorFilePath(), message, callstack);
}

namespace {

// "<type>: <what>" of `e`, then one "\ncaused by: <type>: <what>" per exception nested in it
// (std::throw_with_nested), outermost first, at most kMaxNested of them.
std::string DescribeException(std::exception_ptr e) {
  constexpr int kMaxNested = 16;
  std::string message;
  for (int depth = 0; e && depth <= kMaxNested; ++depth) {
    std::exception_ptr inner;
    if (depth > 0) message += "\ncaused by: ";
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      std::string type = Demangle(typeid(ex).name());
      if (auto* nested = dynamic_cast<const std::nested_exception*>(&ex)) {
        inner = nested->nested_ptr();
        // libstdc++ throws std::_Nested_exception<T> for throw_with_nested(T): name T.
        const std::string wrapper = "std::_Nested_exception<";
        if (type.rfind(wrapper, 0) == 0 && type.back() == '>')
          type = type.substr(wrapper.size(), type.size() - wrapper.size() - 1);
      }
      message += type + ": " + ex.what();
    } catch (...) {
      const std::type_info* t = abi::__cxa_current_exception_type();
      message += (t ? Demangle(t->name()) : std::string("unknown exception")) + ": <no what()>";
    }
    e = inner;
  }
  return message;
}

}  // namespace

bool record_exception(std::exception_ptr e) {
  const std::string message = e ? DescribeException(e) : "unknown error";
  std::string stack = "Traceback (native, most recent call first):\n" + native_backtrace(2) + message;
  return record_error(message, stack);
}

std::string native_backtrace(int skip_frames) {
  void* frames[64];
  int n = ::backtrace(frames, 64);
  std::unique_ptr<char*, decltype(&std::free)> syms(::backtrace_symbols(frames, n), &std::free);
  std::string out;
  for (int i = skip_frames; i < n; ++i) {
    std::string line = syms ? syms.get()[i] : "?";
    // "binary(_ZN...+0x1a) [0x...]" -> demangle the symbol part.
    auto open = line.find('(');
    auto plus = line.find('+', open == std::string::npos ? 0 : open);
    if (open != std::string::npos && plus != std::string::npos && plus > open + 1) {
      line = line.substr(0, open + 1) + Demangle(line.substr(open + 1, plus - open - 1).c_str()) +
             line.substr(plus);
    }
    out += "  #" + std::to_string(i - skip_frames) + " " + line + "\n";
  }
  return out;
}

void install_terminate_handler() {
  std::terminate_handler prev = std::set_terminate(&OnTerminate);
  if (prev != &OnTerminate) g_previous_terminate = prev;
}

int run_recorded(const std::function<int()>& fn) {
  try {
    return fn();
  } catch (...) {
    record_exception(std::current_exception());
    try {
      throw;
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "ctrun::worker: uncaught exception: %s\n", ex.what());
    } catch (...) {
      std::fprintf(stderr, "ctrun::worker: uncaught non-standard exception\n");
    }
    return 1;
  }
}

}  // namespace ctrun::worker
