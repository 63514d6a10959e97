// Events: what happens during a run, as it happens, for machines (--events-file).
//
// Modules report through an EventSink: Emit(name, fields) with one of the names below and a JSON
// object of fields. The sink owns the framing: the file sink (OpenEventsFile) writes one JSON
// object per line,
//   {"event":"worker_exit","seq":7,"mono_ns":123,"wall":"2026-11-30T14:20:01.123456Z",
//    "host":"h","run_id":"r", <fields>...}
// with one write(2) per line on an O_APPEND fd, so each line reaches the file whole and in the
// order of Emit, also when several agents of a multi-node job share the file on a local file
// system. The fields of every event are listed in docs/ci.md (the schema; keep it in step).
//
// Emit never fails and never blocks for long: a write error is reported once through spdlog and
// the sink goes quiet (events are a record, not a reason to stop a job). Sinks are used from the
// agent's thread only.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"

namespace ctrun {

namespace events {
// Emitted today (docs/ci.md gives the fields of each).
inline constexpr std::string_view kRunStart = "run_start";
inline constexpr std::string_view kRendezvousRound = "rendezvous_round";
inline constexpr std::string_view kAttemptStart = "attempt_start";
inline constexpr std::string_view kWorkerStart = "worker_start";
inline constexpr std::string_view kStartError = "start_error";
inline constexpr std::string_view kWorkerExit = "worker_exit";
inline constexpr std::string_view kMaxRunTime = "max_run_time";
inline constexpr std::string_view kStop = "stop";
inline constexpr std::string_view kRestart = "restart";
inline constexpr std::string_view kRunEnd = "run_end";
// Hang detection and the restart policy (agent/agent.cc); fields in docs/ci.md.
inline constexpr std::string_view kHeartbeatMiss = "heartbeat_miss";
inline constexpr std::string_view kStackCapture = "stack_capture";
inline constexpr std::string_view kHangBlame = "hang_blame";
inline constexpr std::string_view kBackoff = "backoff";
inline constexpr std::string_view kLateExit = "late_exit";
}  // namespace events

class EventSink {
 public:
  virtual ~EventSink() = default;
  // fields: a JSON object (or null for none); its keys must not be the framing's.
  virtual void Emit(std::string_view event, const nlohmann::json& fields) = 0;
};

// Drops everything: what modules hold when no --events-file was given.
class NullEventSink final : public EventSink {
 public:
  void Emit(std::string_view, const nlohmann::json&) override {}
};
EventSink& NullEvents();

// Passes every event to each sink, in order.
class TeeEventSink final : public EventSink {
 public:
  explicit TeeEventSink(std::vector<EventSink*> sinks) : sinks_(std::move(sinks)) {}
  void Emit(std::string_view event, const nlohmann::json& fields) override {
    for (EventSink* s : sinks_) s->Emit(event, fields);
  }

 private:
  std::vector<EventSink*> sinks_;
};

// The framing fields every line carries besides the event's own.
struct EventStamp {
  uint64_t seq = 0;  // 0, 1, 2, ... per sink
  std::chrono::steady_clock::time_point mono;
  std::chrono::system_clock::time_point wall;
};
struct EventOrigin {
  std::string host;
  std::string run_id;
};

// One line of the events file, '\n' included (pure: the file sink and the tests use it).
std::string FormatEventLine(std::string_view event, const nlohmann::json& fields, const EventStamp& stamp,
                            const EventOrigin& origin);
// "2026-11-30T14:20:01.123456Z".
std::string FormatWallTime(std::chrono::system_clock::time_point t);

// Appends lines to a file (created 0644 when missing, never truncated: a job's runs and its nodes
// can share one file; run_id and host tell them apart).
class FileEventSink final : public EventSink {
 public:
  static StatusOr<std::unique_ptr<FileEventSink>> Open(const std::string& path, EventOrigin origin);
  void Emit(std::string_view event, const nlohmann::json& fields) override;

 private:
  FileEventSink(UniqueFd fd, std::string path, EventOrigin origin)
      : fd_(std::move(fd)), path_(std::move(path)), origin_(std::move(origin)) {}
  UniqueFd fd_;
  std::string path_;
  EventOrigin origin_;
  uint64_t seq_ = 0;
  bool failed_ = false;
};

}  // namespace ctrun
