// The end of a run for machines: the run_end event, --summary-file and, under GitHub Actions, the
// root cause as an ::error annotation. Called once, by main, for every way a run ends (usage
// errors included), with the RunOutcome decided in agent/job_outcome.h.
#pragma once

#include <cstdio>
#include <string>

#include "base/status.h"
#include "report/events.h"
#include "report/run_outcome.h"

namespace ctrun {

struct RunEndTargets {
  std::string summary_file;        // "" = none
  EventSink* events = nullptr;     // null = none
  bool github_actions = false;     // print the annotation (UnderGithubActions)
  std::FILE* annotation_out = stdout;  // where the runner reads workflow commands
  // ctrun's own TORCHELASTIC_ERROR_FILE ("" = none). Written here for a set-up or rendezvous error,
  // as torchrun's @record on its main writes the exception that ends it; a worker failure's
  // record was written by the failure report already.
  std::string agent_error_file;
};

// Reports `outcome` to every target and returns outcome.exit_code. A summary file that cannot be
// written is a warning on stderr, never a different exit code.
int ReportRunEnd(const RunOutcome& outcome, const RunIdentity& identity, const RunEndTargets& targets);

// The annotation's title, e.g. "ctrun: worker_failure (exit 3)".
std::string AnnotationTitle(const RunOutcome& outcome);

// Fails with a one-line reason when --summary-file's directory does not exist or is not writable,
// so a bad path is a usage error before the run, not a lost report after it.
Status CheckSummaryPath(const std::string& path);

}  // namespace ctrun
