// The end-of-run failure report: which workers failed, which one is the root cause, the text
// printed on final failure, ctrun's exit code, and the agent's own error file.
//
// The text keeps the layout of torch's ChildFailedError (what torchrun prints on failure) so log
// scrapers keep working: a border of '=' (width = min(60, widest line)), "<name> FAILED", a line
// of '-', "Failures:" with the other failures or "  <NO_OTHER_FAILURES>", a line of '-',
// "Root Cause (first observed failure):", the root block, a closing border. Each block starts with
// torch's six fields in torch's format ("exitcode  : -9 (pid: 1234)" convention).
// ctrun adds, inside the blocks:
//   * the signal name after a negative exit code: "exitcode  : -9 (SIGKILL) (pid: 1234)";
//   * "cause     : failed on its own" / "stopped by ctrun after rank N failed", or for a rank
//     ctrun found hung "cause     : hung: no heartbeat for 92 s (last beat at step 1200)" and
//     "stacks    : stacks of 2 processes saved in <dir> (...)" (or why they were not);
//   * "note      : likely killed by the kernel OOM killer: ..." for probable OOM victims;
//   * for workers without an error file: the last lines of their stderr instead of torch's
//     "To enable traceback see: ..." line, which is kept once, after the root cause;
//   * an unreadable error file: "error_file: <path> (unreadable: <reason>)", then as if none.
// Deliberate differences: multi-line tracebacks have trailing newlines trimmed (torch leaves a
// line of two spaces), and every traceback is indented, string-message ones included.
// Numbering and sections follow torch: [idx] counts the workers that failed on their own (torch
// only collects those), in rank order, and "Failures:" lists them except the root cause, or
// <NO_OTHER_FAILURES>. Workers ctrun stopped in the teardown come after the root cause, behind
// another line of '-', under "Stopped by ctrun (not failures of their own):", numbered on.
// A worker whose output says "No module named 'torch'" gets a note naming the interpreter that
// ran it and how to choose another (report/python_hint.h).
// When every failure was stopped by ctrun (ctrun itself was signalled), the root-cause section
// says so instead of naming a rank: one fixed format for every exit path, so a scraper never meets
// a summary without a root-cause section.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "process/exit_status.h"
#include "report/error_file.h"
#include "report/python_hint.h"
#include "report/oom.h"

namespace ctrun {

// ctrun's exit code when the root cause is a rank it found hung (a heartbeat or output deadline
// passed), like timeout(1)'s.
inline constexpr int kExitHung = 124;

struct WorkerFailure {
  int global_rank = 0;
  int local_rank = 0;
  int role_rank = 0;
  pid_t pid = 0;
  ExitStatus status = ExitStatus::Exited(1);
  std::chrono::system_clock::time_point time;  // when ctrun saw the exit
  std::string error_file;                      // path given to the worker ("" if none)
  bool stopped_by_ctrun = false;  // killed by ctrun during teardown (but see FailedBeforeStop)
  // With stopped_by_ctrun: when ctrun sent its stop signal.
  std::optional<std::chrono::system_clock::time_point> stop_sent;
  bool oom_killed = false;                     // likely OOM-killer victim (see oom.h)
  std::string stderr_tail;                     // last lines of stderr (may be empty)
  std::string hang;                            // "hung: ..." when ctrun found the rank hung
  std::string stacks;                          // with hang: where its stacks were saved
  std::string never_started;                   // its exec failed late: "cannot execute ..."

  // Filled by LoadErrorFile() from error_file (tests may set them directly).
  std::optional<ErrorFileContents> error_data;  // a valid error file was found
  std::string error_file_problem;               // non-empty: the file exists but is unusable
  // The file's modification time (ns), read with it: it orders failures whose error files carry
  // only torch's whole-second timestamp (a crash and the ranks that died of it within a second).
  std::optional<int64_t> error_file_mtime_ns;
};

// Reads f->error_file into error_data / error_file_problem (never fails: see error_file.h).
void LoadErrorFile(WorkerFailure* f);
void LoadErrorFiles(std::vector<WorkerFailure>* failures);

// The time the failure is ordered and shown by: the error file's timestamp when it has one (the
// nanosecond ctrun_timestamp_ns of ctrun's worker library, else torch's whole seconds refined by
// the file's modification time when that falls within the same second), else the detection time.
std::chrono::system_clock::time_point FailureTime(const WorkerFailure& f);

// A rank ctrun's stop signal ended whose own error file (not a lost peer) is older than that
// signal: it failed first and was only finished off by it, e.g. a Python rank that recorded its
// exception and was still in interpreter shutdown. Its status is ctrun's signal, not its own exit.
bool FailedBeforeStop(const WorkerFailure& f);
// Whether ctrun stopped the rank (not a failure of its own, never a root cause): stopped_by_ctrun
// unless FailedBeforeStop. What every part of the summary goes by.
bool StoppedByCtrun(const WorkerFailure& f);

// True when the failure's error message (without an error file: the unindented lines of the last
// Python traceback in its stderr tail, or its last line when there is none)
// says its collective lost a peer (gloo's "Connection closed by peer", a reset or broken pipe,
// NCCL's remote exit or abort), or the rank died of SIGPIPE (it wrote to a connection its peer had
// closed): a consequence of another rank's failure.
bool LostAPeer(const WorkerFailure& f);

// The root cause among failures not StoppedByCtrun: one that did not just lose a peer
// (LostAPeer) before one that did, then the earliest FailureTime(); ties go to the lowest global
// rank. nullopt when there is none (empty, or every worker was stopped by ctrun).
std::optional<size_t> ChooseRootCause(const std::vector<WorkerFailure>& failures);
// The root cause as the report shows it: the failure of `agreed_rank` when given (multi-node, the
// cause every node agreed on is here) and found among the failures not StoppedByCtrun, else
// ChooseRootCause's.
std::optional<size_t> RootCauseOf(const std::vector<WorkerFailure>& failures, std::optional<int> agreed_rank);

struct SummaryOptions {
  // Shown when there is no root cause, e.g. "ctrun received signal 15 (SIGTERM)".
  std::string stop_reason;
  // Multi-node: the root cause was a worker on another node ("node 1 (host-b): rank 5 exited
  // with code 1"); the root-cause section names it instead of <NO_ROOT_CAUSE>.
  std::string remote_root_cause;
  // Multi-node: the root cause every node agreed on is this node's worker of that global rank. The
  // summary and the agent's error file name it (the exit code is its), even when ChooseRootCause
  // would order another local failure first.
  std::optional<int> agreed_root_rank;
  // A single-node job: every peer a worker could lose runs here, so a failure that reads as a lost
  // peer while no other rank failed on its own lost something else (a connection of its own, a
  // peer that exited 0 early) and is labelled as failing on its own. False keeps the lost-peer
  // label (another node may hold the peer).
  bool single_node = false;
  // stderr lines shown for the root cause / for other workers that failed on their own, when they
  // left no error file. Workers stopped by ctrun get none (their stderr is collateral noise).
  size_t root_stderr_lines = 20;
  size_t other_stderr_lines = 5;
  // The OOM counter around the attempt, for the note's "went from A to B".
  std::optional<OomKillSample> oom_before;
  std::optional<OomKillSample> oom_after;
  // Times in UTC instead of local time (tests; torch uses local time).
  bool utc = false;
  // The interpreter the workers ran under ("" when the entrypoint is not run under Python), and
  // who chose it.
  std::string python_interpreter;
  InterpreterFrom python_from = InterpreterFrom::kPythonExec;
  // MASTER_PORT when ctrun hosted the workers' store (the agent store); 0 when it did not.
  int agent_store_port = 0;
};

// The report text, one string ending in '\n'; "" when failures is empty. failures are listed in
// the given order (the caller passes them by rank), own failures first: [idx] is the position in
// that order.
std::string FormatFailureSummary(const std::string& entrypoint_name,
                                 const std::vector<WorkerFailure>& failures,
                                 const std::string& hostname, const SummaryOptions& options);

// ctrun's exit code for a failed run: the root cause's ShellCode() (exit code, or 128+signal), or
// kExitHung when the root cause hung; 1 when the root cause failed before ctrun's signal ended it
// (FailedBeforeStop) or there are failures but no root cause; 0 when there are no failures.
int JobExitCode(const std::vector<WorkerFailure>& failures);

// The agent's own $TORCHELASTIC_ERROR_FILE, like torchrun's @record: the root cause's error file
// copied with message.errorCode = its torch exit code (-signal for a signal); when the root cause
// left none, a file describing it (torch's message, stderr tail and notes as the callstack).
// Does nothing and returns OK when path is empty or there is no root cause.
Status WriteAgentErrorFile(const std::string& path, const std::vector<WorkerFailure>& failures,
                           const SummaryOptions& options = {});

}  // namespace ctrun
