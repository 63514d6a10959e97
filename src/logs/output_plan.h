// OutputPlan: for one attempt, decides what every worker's fd 1 and fd 2 become (the StdioTarget
// the agent puts in SpawnSpec) and, for piped streams, the OutputRelay's sinks. Pure: no I/O.
//
// Per local rank and stream ("redirect" = -r OR -t for that stream, "shown" = the rank passes
// --local-ranks-filter and --ranks-filter, "files" = log dir is not /dev/null):
//   tee, shown                -> Pipe; relay writes the file (if files) and prefixed console lines
//   redirect (or tee, hidden) -> File(<rank dir>/std{out,err}.log), written by the worker
//                                directly (no relay); DevNull when files are off
//   neither, hidden           -> DevNull
//   neither, shown            -> Pipe with prefixed console lines (ctrun default: lines of
//                                different ranks never mix), except Inherit (zero overhead, the
//                                worker keeps the TTY) when nproc == 1 and no --log-prefix,
//                                or when --log-prefix inherit (torchrun's behaviour)
//                                With --tee (and no --log-prefix) these lines carry no prefix:
//                                only the streams --tee names are prefixed, as in torchrun.
//                                The default prefix (no --log-prefix, no template, no --tee) is
//                                shown only where ctrun's stream is a terminal: in a pipe or a
//                                file the lines stay whole and carry no prefix, as under torchrun.
// Whenever stderr would go to DevNull it is piped instead with no sinks, so the failure summary
// still has its tail (OutputRelay::StderrTail). In a multi-node job (relay_lone_stderr), an
// inherited stderr (one worker per node) is piped too, unprefixed to the console, where ctrun's
// stderr is not a terminal: a failure's last lines tell whether it only lost a peer on a node
// that died (agent/agent.h). At a terminal, and with --log-prefix inherit, it stays inherited.
// With a pty window (ctrun's console is a terminal, --tty): a stdout piped with console lines
// becomes a pty instead (Pty(rows, cols - prefix width)), so the worker line-buffers and sees a
// terminal as wide as what is left of the console's line after the prefix; except a stdout also
// copied into a file (tee, duplicate filters), whose file must get what a worker writes to a
// non-terminal. Stderr always stays
// a pipe: its tail for the failure summary and its own console stream (ctrun's fd 2) are kept,
// and C's stderr is unbuffered anyway.
// With duplicate filters for a stream (and files on), every rank's stream of that kind goes
// through the relay (File -> Pipe + tee file, Inherit -> Pipe + console, DevNull -> Pipe), so
// its matching lines reach <attempt>/filtered_<stream>.log.
// stdin (forward_stdin, ctrun's stdin is a terminal): local rank 0 gets a pipe that ctrun feeds
// from its terminal (agent/stdin_forwarder.h), the others /dev/null; otherwise all inherit it.
// With --output-timeout every stream goes through the relay (a pipe, or the stdout pty above), to
// the same places: the
// console, the log file (written by the relay instead of the worker), or nowhere.
// error_file is always set (TORCHELASTIC_ERROR_FILE): <rank dir>/error.json, or /dev/null.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"
#include "config/launch_config.h"
#include "logs/log_dir.h"
#include "logs/output_relay.h"
#include "logs/prefix.h"
#include "logs/std_spec.h"
#include "process/spawn_spec.h"
#include "sys/pty.h"

namespace ctrun::logs {

struct StreamPlan {
  StdioTarget target;    // goes into SpawnSpec::stdout_target / stderr_target
  bool console = false;  // relay copies lines to ctrun's console (target is kPipe)
  std::string tee_file;  // relay copies raw bytes to this file (target is kPipe); "" none
  std::string log_file;  // this stream's log file however written (direct or tee); "" none
  bool unprefixed = false;  // console lines without the worker's prefix: --tee chose torchrun's
                            // prefix, which (as in torchrun) marks only the streams it tees
  bool duplicated = false;  // matching lines go to the attempt's filtered file (target is relayed)
  bool relayed() const { return target.kind == StdioTarget::Kind::kPipe || target.kind == StdioTarget::Kind::kPty; }
};

struct WorkerOutputPlan {
  int local_rank = 0;
  int global_rank = 0;
  StdioTarget in;  // SpawnSpec::stdin_target
  StreamPlan out;
  StreamPlan err;
  std::string error_file;  // TORCHELASTIC_ERROR_FILE
  std::string prefix;      // plain console prefix ("" none)
};

// The log flags of a run as typed values: -r/--redirects, -t/--tee, --local-ranks-filter,
// --ranks-filter and the prefix chosen from --log-prefix, TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE and
// --tee. Parsed once, before anything starts (main); every attempt plans from them.
struct OutputFlags {
  StdSpec redirects;  // tee already OR-ed in
  StdSpec tee;
  RankFilter local_filter;
  RankFilter rank_filter;
  PrefixFormat prefix = PrefixFormat::Default();
  bool prefix_given = false;    // --log-prefix was given
  // The prefix is ctrun's default (no --log-prefix, no TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, no
  // --tee): console lines carry it only where that console stream is a terminal.
  bool prefix_terminal_only = false;
  bool prefix_inherit = false;  // --log-prefix inherit
  std::vector<std::string> duplicate_stdout;  // --duplicate-stdout-filters
  std::vector<std::string> duplicate_stderr;  // --duplicate-stderr-filters
  // Whether workers' output goes to files in the log directory (when it is not /dev/null): the
  // redirected or tee'd streams' logs and the attempts' filtered_<stream>.log files.
  bool WritesLogFiles() const {
    return redirects.AnySet() || !duplicate_stdout.empty() || !duplicate_stderr.empty();
  }
};

// Errors name the flag (or the variable) and the bad value.
StatusOr<OutputFlags> ParseOutputFlags(const LaunchConfig& config, const char* env_template);

struct PlanInputs {
  int nproc = 1;
  int world_size = 1;
  std::vector<int> global_ranks;   // by local rank; empty: node_rank * nproc + local_rank
  int node_rank = 0;
  bool multi_node = false;         // nnodes > 1: the default prefix shows the host
  std::string host;                // short host name
  const AttemptPaths* paths = nullptr;  // LogDir::PrepareAttempt of this attempt (required)
  std::optional<WindowSize> pty_window;  // the console's size when workers' stdout gets a pty
  bool forward_stdin = false;            // local rank 0 reads ctrun's terminal through a pipe
  bool stdout_terminal = false;          // ctrun's stdout is a terminal (prefix_terminal_only)
  bool stderr_terminal = false;          // ctrun's stderr is a terminal
  bool relay_lone_stderr = false;        // a multi-node job: see "inherited stderr" above
};

// Errors: inconsistent inputs only (the flags were checked by ParseOutputFlags).
StatusOr<std::vector<WorkerOutputPlan>> PlanOutput(const LaunchConfig& config, const OutputFlags& flags,
                                                   const PlanInputs& in);

// Opens a tee file: O_WRONLY|O_CREAT|O_TRUNC|O_CLOEXEC, 0644.
StatusOr<UniqueFd> OpenLogFile(const std::string& path);
// A worker's pty size: what is left of the console's line after its prefix (at least 20
// columns, at most the console's width); the rows are the console's.
WindowSize WorkerWindow(WindowSize console, size_t prefix_width);

// The attempt's filtered files (--duplicate-*-filters): null where a stream has no filter or
// files are off (/dev/null log dir).
struct DuplicateFiles {
  std::shared_ptr<DuplicateFile> out;
  std::shared_ptr<DuplicateFile> err;
};
StatusOr<DuplicateFiles> OpenDuplicateFiles(const OutputFlags& flags, const AttemptPaths& paths);
// The relay sinks of one piped stream of a plan (opens the tee file, if any).
StatusOr<Sinks> MakeSinks(const WorkerOutputPlan& plan, Stream stream, const DuplicateFiles& duplicates = {});

}  // namespace ctrun::logs
