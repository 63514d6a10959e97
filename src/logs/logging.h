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
#include "config/launch_config.h"

namespace ctrun::logs {

class ConsoleWriter;

// Installs the "ctrun" default logger at `level` (the CLI parsed the name). Safe to call again
// (replaces the level).
Status SetupLogging(LogLevel level);

void RouteDiagnostics(ConsoleWriter* writer);
void UnrouteDiagnostics(ConsoleWriter* writer);  // no-op unless `writer` is the routed one

inline void LogWarning(const std::string& message) { spdlog::warn("{}", message); }

}  // namespace ctrun::logs
