#include "logs/logging.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>

#include <exception>
#include <memory>
#include <mutex>

#include "logs/console_writer.h"
#include "sys/posix_util.h"

namespace ctrun::logs {
namespace {

std::mutex g_route_mu;
ConsoleWriter* g_route = nullptr;  // guarded by g_route_mu

class DiagnosticSink final : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t buf;
    formatter_->format(msg, buf);
    std::string_view line(buf.data(), buf.size());
    std::lock_guard<std::mutex> lock(g_route_mu);
    if (g_route != nullptr) {
      g_route->WriteDiagnostic(line);
    } else {
      (void)WriteAll(2, line.data(), line.size());
    }
  }
  void flush_() override {}
};

spdlog::level::level_enum SpdlogLevel(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return spdlog::level::trace;
    case LogLevel::kDebug: return spdlog::level::debug;
    case LogLevel::kInfo: return spdlog::level::info;
    case LogLevel::kWarning: return spdlog::level::warn;
    case LogLevel::kError: return spdlog::level::err;
    case LogLevel::kOff: break;
  }
  return spdlog::level::off;
}

}  // namespace

Status SetupLogging(LogLevel level) {
  try {
    auto existing = spdlog::get("ctrun");
    if (!existing) {
      auto sink = std::make_shared<DiagnosticSink>();
      existing = std::make_shared<spdlog::logger>("ctrun", sink);
      existing->set_pattern("[ctrun] %L %H:%M:%S.%e %v");
      spdlog::register_logger(existing);
      spdlog::set_default_logger(existing);
    }
    existing->set_level(SpdlogLevel(level));
    existing->flush_on(spdlog::level::trace);
  } catch (const std::exception& e) {
    return Status::Error(std::string("logging setup: ") + e.what());
  }
  return Status::Ok();
}

void RouteDiagnostics(ConsoleWriter* writer) {
  std::lock_guard<std::mutex> lock(g_route_mu);
  g_route = writer;
}

void UnrouteDiagnostics(ConsoleWriter* writer) {
  std::lock_guard<std::mutex> lock(g_route_mu);
  if (g_route == writer) g_route = nullptr;
}

}  // namespace ctrun::logs
