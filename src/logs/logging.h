// ctrun's own diagnostics: one spdlog default logger named "ctrun" writing
//   [ctrun] I 12:00:00.123 message
// to stderr. While an OutputRelay routes diagnostics (ConsoleOptions::route_diagnostics, or
// RouteDiagnostics), each diagnostic goes through the relay's stderr ConsoleWriter as one whole
// line queued after the worker lines already accepted, so it never lands inside a worker's
// line and erases a TTY progress bar first. Otherwise it is written straight to fd 2.
// Thread-safe (spdlog's sink mutex, then the writer's mutex).
#pragma once

#include <spdlog/spdlog.h>

#include <string>
#include <string_view>

#include "base/status.h"

namespace ctrun::logs {

class ConsoleWriter;

// "trace", "debug", "info", "warning" (or "warn"), "error", "critical", "off"; case-insensitive.
StatusOr<spdlog::level::level_enum> ParseLogLevel(std::string_view level);
// Installs the "ctrun" default logger at `level`. Safe to call again (replaces the level).
Status SetupLogging(std::string_view level);

void RouteDiagnostics(ConsoleWriter* writer);
void UnrouteDiagnostics(ConsoleWriter* writer);  // no-op unless `writer` is the routed one

inline void LogWarning(const std::string& message) { spdlog::warn("{}", message); }

}  // namespace ctrun::logs
