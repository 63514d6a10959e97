#include "report/run_summary.h"

#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <csignal>
#include <ctime>

#include "report/python_hint.h"

namespace ctrun {
namespace {

constexpr size_t kMaxWidth = 60;  // torch: width = min(widest line, 60)
constexpr const char* kStoppedHeading = "Stopped by ctrun (not failures of their own):";
constexpr const char* kTracebackHint =
    "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html";

std::string FormatTime(std::chrono::system_clock::time_point tp, bool utc) {
  // torch: datetime.fromtimestamp(int seconds).isoformat(sep="_") -> "YYYY-MM-DD_HH:MM:SS".
  auto secs = std::chrono::floor<std::chrono::seconds>(tp).time_since_epoch().count();
  time_t t = static_cast<time_t>(secs);
  struct tm tm {};
  if (utc) {
    gmtime_r(&t, &tm);
  } else {
    localtime_r(&t, &tm);
  }
  char buf[64];
  if (std::strftime(buf, sizeof buf, "%Y-%m-%d_%H:%M:%S", &tm) == 0) return std::to_string(secs);
  return buf;
}

std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start <= text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) nl = text.size();
    std::string line = text.substr(start, nl - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
    start = nl + 1;
  }
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  return lines;
}

std::vector<std::string> LastLines(const std::string& text, size_t n) {
  if (n == 0) return {};
  std::vector<std::string> lines = SplitLines(text);
  if (lines.size() > n) lines.erase(lines.begin(), lines.end() - static_cast<ptrdiff_t>(n));
  return lines;
}

// torch indents continuation lines of the traceback by two spaces.
std::string IndentTraceback(const std::string& text) {
  std::vector<std::string> lines = SplitLines(text);
  if (lines.empty()) return "<N/A>";
  std::string out = lines[0];
  for (size_t i = 1; i < lines.size(); ++i) out += "\n  " + lines[i];
  return out;
}

std::string ExitCodeText(const ExitStatus& s) {
  std::string out = std::to_string(s.TorchCode());
  if (s.signaled()) {
    out += " (" + SignalName(s.signal());
    if (s.core_dumped()) out += ", core dumped";
    out += ")";
  }
  return out;
}

// torch's message for a worker killed by a signal without an error file.
std::string SignalMessage(const WorkerFailure& f) {
  return "Signal " + std::to_string(f.status.signal()) + " (" + SignalName(f.status.signal()) +
         ") received by PID " + std::to_string(f.pid);
}

std::string OomNote(const SummaryOptions& o) {
  std::string note = "likely killed by the kernel OOM killer";
  if (o.oom_before && o.oom_after && o.oom_before->source == o.oom_after->source) {
    note += ": " + o.oom_after->source + " oom_kill went from " +
            std::to_string(o.oom_before->count) + " to " + std::to_string(o.oom_after->count);
  }
  return note;
}

std::string CauseText(const WorkerFailure& f, const std::vector<WorkerFailure>& all,
                      std::optional<size_t> root, const SummaryOptions& o) {
  if (!f.hang.empty()) return f.hang;
  if (!f.never_started.empty()) return "never started: " + f.never_started;
  if (FailedBeforeStop(f))
    return "failed on its own (its error file predates ctrun's stop signal, which ended it while it exited)";
  if (!StoppedByCtrun(f)) {
    if (!LostAPeer(f)) return "failed on its own";
    const bool peer_failed = std::any_of(all.begin(), all.end(), [&f](const WorkerFailure& g) { return &g != &f && !StoppedByCtrun(g); });
    if (o.single_node && !peer_failed) return "failed on its own (it lost a connection, but no other rank failed)";
    return "lost a peer (a consequence of another rank's failure)";
  }
  if (root) return "stopped by ctrun after rank " + std::to_string(all[*root].global_rank) + " failed";
  if (!o.stop_reason.empty()) return "stopped by ctrun (" + o.stop_reason + ")";
  return "stopped by ctrun";
}

std::string FormatBlock(size_t idx, const WorkerFailure& f, bool is_root,
                        const std::vector<WorkerFailure>& all, std::optional<size_t> root,
                        const std::string& hostname, const SummaryOptions& o) {
  std::string b = "[" + std::to_string(idx) + "]:\n";
  b += "  time      : " + FormatTime(FailureTime(f), o.utc) + "\n";
  b += "  host      : " + hostname + "\n";
  b += "  rank      : " + std::to_string(f.global_rank) + " (local_rank: " +
       std::to_string(f.local_rank) + ")\n";
  b += "  exitcode  : " + ExitCodeText(f.status) + " (pid: " + std::to_string(f.pid) + ")\n";
  if (f.error_data) {
    b += "  error_file: " + f.error_file + "\n";
  } else if (!f.error_file_problem.empty()) {
    b += "  error_file: " + f.error_file + " (unreadable: " + f.error_file_problem + ")\n";
  } else {
    b += "  error_file: <N/A>\n";
  }
  b += "  cause     : " + CauseText(f, all, root, o) + "\n";
  if (f.oom_killed) b += "  note      : " + OomNote(o) + "\n";
  if (!StoppedByCtrun(f)) {
    const std::string python_note =
        MissingTorchNote(f.stderr_tail + (f.error_data ? "\n" + f.error_data->traceback : ""), o.python_interpreter,
                         o.python_from);
    if (!python_note.empty()) b += "  note      : " + python_note + "\n";
    const std::string store_note =
        AgentStorePortNote(f.stderr_tail + (f.error_data ? "\n" + f.error_data->message : ""), o.agent_store_port);
    if (!store_note.empty()) b += "  note      : " + store_note + "\n";
  }
  if (!f.stacks.empty()) b += "  stacks    : " + f.stacks + "\n";

  if (f.error_data) {
    b += "  traceback : " + IndentTraceback(f.error_data->traceback);
    return b;
  }
  std::string head = f.status.signaled() ? SignalMessage(f) : "<N/A> (no error file)";
  size_t n = is_root ? o.root_stderr_lines : (StoppedByCtrun(f) ? 0 : o.other_stderr_lines);
  std::vector<std::string> tail = LastLines(f.stderr_tail, n);
  if (!tail.empty()) {
    head += tail.size() == 1 ? "; last line of stderr:"
                             : "; last " + std::to_string(tail.size()) + " lines of stderr:";
  }
  b += "  traceback : " + head;
  for (const std::string& line : tail) b += "\n    " + line;
  // torch prints this hint in place of every missing traceback; ctrun keeps it once, where a
  // Python traceback would have helped most.
  if (is_root && !f.status.signaled()) b += "\n  hint      : " + std::string(kTracebackHint);
  return b;
}

size_t WidestLine(const std::string& text) {
  size_t widest = 0;
  for (const std::string& line : SplitLines(text)) widest = std::max(widest, line.size());
  return widest;
}

}  // namespace

void LoadErrorFile(WorkerFailure* f) {
  f->error_data.reset();
  f->error_file_problem.clear();
  auto r = ReadErrorFile(f->error_file);
  if (!r.ok()) {
    f->error_file_problem = r.message();
    return;
  }
  f->error_data = std::move(*r);
  struct stat st;
  f->error_file_mtime_ns.reset();
  if (f->error_data && ::stat(f->error_file.c_str(), &st) == 0)
    f->error_file_mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

void LoadErrorFiles(std::vector<WorkerFailure>* failures) {
  for (WorkerFailure& f : *failures) LoadErrorFile(&f);
}

std::chrono::system_clock::time_point FailureTime(const WorkerFailure& f) {
  if (f.error_data && f.error_data->timestamp_ns) {
    return std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::nanoseconds(*f.error_data->timestamp_ns)));
  }
  if (f.error_data && f.error_data->timestamp) {
    const int64_t secs = *f.error_data->timestamp;
    if (f.error_file_mtime_ns && *f.error_file_mtime_ns / 1000000000 == secs)
      return std::chrono::system_clock::time_point(
          std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::nanoseconds(*f.error_file_mtime_ns)));
    return std::chrono::system_clock::time_point(std::chrono::seconds(secs));
  }
  return f.time;
}

namespace {

// Where a failure without an error file says what ended it: after the last Python traceback
// header, its lines that are not indented (the exception's own lines; frames and torch's "At:"
// stack lines are indented), else the last non-empty line of the text.
std::string FailureWords(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.remove_suffix(1);
  const size_t tb = text.rfind("Traceback (most recent call last):");
  if (tb == std::string_view::npos) {
    const size_t nl = text.rfind('\n');
    return std::string(nl == std::string_view::npos ? text : text.substr(nl + 1));
  }
  std::string out;
  for (std::string_view rest = text.substr(tb); !rest.empty();) {
    const size_t nl = rest.find('\n');
    const std::string_view line = rest.substr(0, nl);
    if (!line.empty() && line[0] != ' ' && line[0] != '\t') out.append(line).push_back('\n');
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
  }
  return out;
}

}  // namespace

bool LostAPeer(const WorkerFailure& f) {
  if (f.status.signaled() && f.status.signal() == SIGPIPE) return true;  // wrote to a closed peer
  // Without an error file, the uncaught exception's lines in its stderr
  // ("RuntimeError: [...pair.cc:598] Connection closed by peer [10.0.0.2]:41234").
  const auto says_so = [](std::string_view m) {
    for (const char* words : {"Connection closed by peer", "Connection reset by peer", "Broken pipe",
                              "remote process exited", "NCCL communicator was aborted"})
      if (m.find(words) != std::string_view::npos) return true;
    return false;
  };
  return f.error_data ? says_so(f.error_data->message) : says_so(FailureWords(f.stderr_tail));
}

bool FailedBeforeStop(const WorkerFailure& f) {
  return f.stopped_by_ctrun && f.stop_sent && f.error_data && !LostAPeer(f) && FailureTime(f) < *f.stop_sent;
}

bool StoppedByCtrun(const WorkerFailure& f) { return f.stopped_by_ctrun && !FailedBeforeStop(f); }

std::optional<size_t> ChooseRootCause(const std::vector<WorkerFailure>& failures) {
  std::optional<size_t> best;
  for (size_t i = 0; i < failures.size(); ++i) {
    const WorkerFailure& f = failures[i];
    if (StoppedByCtrun(f)) continue;
    if (!best) {
      best = i;
      continue;
    }
    const WorkerFailure& b = failures[*best];
    // A rank whose collective lost its peer failed because another rank went away: the rank that
    // went away is the root cause even when the peer's error file is older (a crashing rank closes
    // its sockets while unwinding, before its own error file is written).
    if (LostAPeer(f) != LostAPeer(b)) {
      if (!LostAPeer(f)) best = i;
      continue;
    }
    auto ft = FailureTime(f), bt = FailureTime(b);
    if (ft < bt || (ft == bt && f.global_rank < b.global_rank)) best = i;
  }
  return best;
}

std::optional<size_t> RootCauseOf(const std::vector<WorkerFailure>& failures, std::optional<int> agreed_rank) {
  if (agreed_rank)
    for (size_t i = 0; i < failures.size(); ++i)
      if (failures[i].global_rank == *agreed_rank && !StoppedByCtrun(failures[i])) return i;
  return ChooseRootCause(failures);
}

std::string FormatFailureSummary(const std::string& entrypoint_name,
                                 const std::vector<WorkerFailure>& failures,
                                 const std::string& hostname, const SummaryOptions& options) {
  if (failures.empty()) return "";
  // The job's root cause on another node, as every node agreed, is the root cause here too: a
  // worker here that failed as well (its collective lost that peer) is not.
  static const std::vector<WorkerFailure> kNoCandidates;
  const std::optional<size_t> root =
      RootCauseOf(options.remote_root_cause.empty() ? failures : kNoCandidates, options.agreed_root_rank);
  const std::string title = entrypoint_name + " FAILED";

  // torch numbers the failures it collected (only workers that failed on their own); the workers
  // ctrun stopped come after them, in a section of their own.
  std::vector<size_t> order;
  for (size_t i = 0; i < failures.size(); ++i)
    if (!StoppedByCtrun(failures[i])) order.push_back(i);
  for (size_t i = 0; i < failures.size(); ++i)
    if (StoppedByCtrun(failures[i])) order.push_back(i);

  size_t width = title.size();
  std::string root_text;
  std::vector<std::string> others;
  std::vector<std::string> stopped;
  for (size_t idx = 0; idx < order.size(); ++idx) {
    const size_t i = order[idx];
    bool is_root = root && *root == i;
    std::string block = FormatBlock(idx, failures[i], is_root, failures, root, hostname, options);
    width = std::max(width, WidestLine(block));
    if (is_root) {
      root_text = std::move(block);
    } else if (StoppedByCtrun(failures[i])) {
      stopped.push_back(std::move(block));
    } else {
      others.push_back(std::move(block));
    }
  }
  if (!root && !options.remote_root_cause.empty()) {
    root_text = "  on another node: " + options.remote_root_cause;
  } else if (!root) {
    root_text = "  <NO_ROOT_CAUSE>: every failed worker was stopped by ctrun";
    if (!options.stop_reason.empty()) root_text += "; " + options.stop_reason;
  }
  width = std::min(width, kMaxWidth);

  const std::string border(width, '=');
  const std::string section(width, '-');
  std::string out;
  out += border + "\n";
  out += title + "\n";
  out += section + "\n";
  out += "Failures:\n";
  if (others.empty()) {
    out += "  <NO_OTHER_FAILURES>\n";
  } else {
    for (const std::string& o : others) out += o + "\n";
  }
  out += section + "\n";
  out += "Root Cause (first observed failure):\n";
  out += root_text + "\n";
  if (!stopped.empty()) {
    out += section + "\n";
    out += std::string(kStoppedHeading) + "\n";
    for (const std::string& b : stopped) out += b + "\n";
  }
  out += border + "\n";
  return out;
}

int JobExitCode(const std::vector<WorkerFailure>& failures) {
  if (failures.empty()) return 0;
  std::optional<size_t> root = ChooseRootCause(failures);
  if (!root) return 1;
  if (!failures[*root].hang.empty()) return kExitHung;
  // Its own exit never came (ctrun's signal ended it): an error file means an uncaught exception.
  if (FailedBeforeStop(failures[*root])) return 1;
  return failures[*root].status.ShellCode();
}

Status WriteAgentErrorFile(const std::string& path, const std::vector<WorkerFailure>& failures,
                           const SummaryOptions& options) {
  if (path.empty()) return Status::Ok();
  std::optional<size_t> root = RootCauseOf(failures, options.agreed_root_rank);
  if (!root) {
    if (failures.empty() || options.stop_reason.empty()) return Status::Ok();
    ErrorFileRecord r;
    r.message = "ctrun stopped every worker: " + options.stop_reason;
    r.timestamp = std::chrono::duration_cast<std::chrono::seconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
    return WriteErrorFile(path, r);
  }
  const WorkerFailure& f = failures[*root];
  if (f.error_data) return CopyErrorFile(path, *f.error_data, f.status.TorchCode());

  ErrorFileRecord r;
  r.message = !f.hang.empty() ? "Rank " + std::to_string(f.global_rank) + " (local_rank: " +
                                   std::to_string(f.local_rank) + ", pid: " + std::to_string(f.pid) + ") " + f.hang
              : f.status.signaled()
                  ? SignalMessage(f)
                  : "Rank " + std::to_string(f.global_rank) + " (local_rank: " +
                        std::to_string(f.local_rank) + ", pid: " + std::to_string(f.pid) + ") " +
                        f.status.ToString();
  std::string stack = r.message + "\n";
  if (!f.error_file_problem.empty())
    stack += "error file " + f.error_file + " unreadable: " + f.error_file_problem + "\n";
  if (f.oom_killed) stack += OomNote(options) + "\n";
  std::vector<std::string> tail = LastLines(f.stderr_tail, options.root_stderr_lines);
  if (!tail.empty()) {
    stack += "last " + std::to_string(tail.size()) + " lines of stderr:\n";
    for (const std::string& line : tail) stack += line + "\n";
  }
  r.py_callstack = std::move(stack);
  r.timestamp = std::chrono::duration_cast<std::chrono::seconds>(
                    FailureTime(f).time_since_epoch())
                    .count();
  r.error_code = f.status.TorchCode();
  return WriteErrorFile(path, r);
}

}  // namespace ctrun
