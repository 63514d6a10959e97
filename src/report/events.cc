#include "report/events.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <time.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "sys/posix_util.h"

namespace ctrun {

EventSink& NullEvents() {
  static NullEventSink sink;
  return sink;
}

std::string FormatWallTime(std::chrono::system_clock::time_point t) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
  const time_t secs = static_cast<time_t>(us / 1000000);
  tm parts{};
  gmtime_r(&secs, &parts);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ", parts.tm_year + 1900, parts.tm_mon + 1,
                parts.tm_mday, parts.tm_hour, parts.tm_min, parts.tm_sec, static_cast<int>(us % 1000000));
  return buf;
}

std::string FormatEventLine(std::string_view event, const nlohmann::json& fields, const EventStamp& stamp,
                            const EventOrigin& origin) {
  // nlohmann's ordered_json keeps insertion order: the framing first, then the event's fields.
  nlohmann::ordered_json line;
  line["event"] = std::string(event);
  line["seq"] = stamp.seq;
  line["mono_ns"] = std::chrono::duration_cast<std::chrono::nanoseconds>(stamp.mono.time_since_epoch()).count();
  line["wall"] = FormatWallTime(stamp.wall);
  line["host"] = origin.host;
  line["run_id"] = origin.run_id;
  if (fields.is_object())
    for (const auto& [key, value] : fields.items())
      if (!line.contains(key)) line[key] = value;
  // Invalid UTF-8 (a worker's message) is replaced, never thrown on: one line must always come out.
  return line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

StatusOr<std::unique_ptr<FileEventSink>> FileEventSink::Open(const std::string& path, EventOrigin origin) {
  UniqueFd fd(RetryOnEintr([&] { return ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644); }));
  if (!fd) return Status::Errno("cannot open the events file " + path, errno);
  return std::unique_ptr<FileEventSink>(new FileEventSink(std::move(fd), path, std::move(origin)));
}

void FileEventSink::Emit(std::string_view event, const nlohmann::json& fields) {
  if (failed_) return;
  EventStamp stamp{seq_++, std::chrono::steady_clock::now(), std::chrono::system_clock::now()};
  const std::string line = FormatEventLine(event, fields, stamp, origin_);
  // One write per line: with O_APPEND the kernel places it at the end atomically, so lines of
  // several writers never interleave. A short write (disk full) is completed or reported.
  const ssize_t n = RetryOnEintr([&] { return ::write(fd_.get(), line.data(), line.size()); });
  if (n == static_cast<ssize_t>(line.size())) return;
  if (n >= 0 && WriteAll(fd_.get(), line.data() + n, line.size() - static_cast<size_t>(n))) return;
  failed_ = true;
  spdlog::warn("cannot write to the events file {}: {}; no more events are written", path_, std::strerror(errno));
}

}  // namespace ctrun
