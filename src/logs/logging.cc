#include "logs/logging.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>

#include <algorithm>
#include <cctype>
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

}  // namespace

StatusOr<spdlog::level::level_enum> ParseLogLevel(std::string_view level) {
  std::string l(level);
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return std::tolower(c); });
  using spdlog::level::level_enum;
  if (l == "trace") return level_enum::trace;
  if (l == "debug") return level_enum::debug;
  if (l == "info") return level_enum::info;
  if (l == "warning" || l == "warn") return level_enum::warn;
  if (l == "error") return level_enum::err;
  if (l == "critical") return level_enum::critical;
  if (l == "off") return level_enum::off;
  return Status::Error("--log-level: invalid value '" + std::string(level) +
                       "' (expected trace, debug, info, warning, error or off)");
}

Status SetupLogging(std::string_view level) {
  auto lvl = ParseLogLevel(level);
  if (!lvl.ok()) return lvl.status();
  try {
    auto existing = spdlog::get("ctrun");
    if (!existing) {
      auto sink = std::make_shared<DiagnosticSink>();
      existing = std::make_shared<spdlog::logger>("ctrun", sink);
      existing->set_pattern("[ctrun] %L %H:%M:%S.%e %v");
      spdlog::register_logger(existing);
      spdlog::set_default_logger(existing);
    }
    existing->set_level(*lvl);
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
