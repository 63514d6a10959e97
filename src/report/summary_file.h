// --summary-file: the outcome of the run as one JSON document (schema in docs/ci.md),
// written atomically (temp file, fsync, rename) when ctrun ends, whatever the way it ends, so a CI
// step reads either the previous file or this run's whole file, never half of one.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "base/status.h"
#include "report/run_outcome.h"

namespace ctrun {

// The schema's version string; bumped only on incompatible changes (fields may be added).
inline constexpr const char* kSummarySchema = "ctrun.summary/1";

// The document (keys in the documented order).
nlohmann::ordered_json SummaryJson(const RunOutcome& outcome, const RunIdentity& identity);

// Writes SummaryJson(...) (pretty-printed, ending in '\n') to path atomically.
Status WriteSummaryFile(const std::string& path, const RunOutcome& outcome, const RunIdentity& identity);

// The fields of a worker's ending, shared by the summary's ranks and the worker_exit event:
// exit_code (null when killed by a signal), signal and signal_name (null when it exited),
// core_dumped.
void AddExitStatusFields(const ExitStatus& status, nlohmann::ordered_json* out);
void AddExitStatusFields(const ExitStatus& status, nlohmann::json* out);

}  // namespace ctrun
