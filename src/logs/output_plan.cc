#include "logs/output_plan.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>

#include "logs/std_spec.h"
#include "sys/high_fd.h"
#include "sys/posix_util.h"

namespace ctrun::logs {

StatusOr<OutputFlags> ParseOutputFlags(const LaunchConfig& c, const char* env_template) {
  OutputFlags p;
  auto r = StdSpec::Parse(c.redirects, "--redirects");
  if (!r.ok()) return r.status();
  auto t = StdSpec::Parse(c.tee, "--tee");
  if (!t.ok()) return t.status();
  auto lf = RankFilter::Parse(c.local_ranks_filter, "--local-ranks-filter");
  if (!lf.ok()) return lf.status();
  auto rf = RankFilter::Parse(c.ranks_filter, "--ranks-filter");
  if (!rf.ok()) return rf.status();
  auto pf = PrefixFormat::Choose(c.log_prefix, env_template, t->AnySet());
  if (!pf.ok()) return Status::Error("--log-prefix / TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE: " + pf.message());
  // torchrun's os.devnull log dir turns log files off: a stream redirected to a file and not also
  // tee'd to the console would be discarded without a word. Refused instead.
  if (c.log_dir && *c.log_dir == kDevNull && !r->CoveredBy(*t))
    return Status::Error("--redirects " + c.redirects + " with --log_dir " + kDevNull +
                         ": the redirected worker output would be discarded (/dev/null turns log files off); "
                         "give a log directory, or --tee to keep it on the console");
  p.tee = *t;
  p.redirects = r->Or(*t);
  p.local_filter = *lf;
  p.rank_filter = *rf;
  p.prefix = *pf;
  p.prefix_given = !c.log_prefix.empty();
  p.prefix_terminal_only = !p.prefix_given && env_template == nullptr && !t->AnySet();
  p.prefix_inherit = c.log_prefix == "inherit";
  p.duplicate_stdout = c.duplicate_stdout_filters;
  p.duplicate_stderr = c.duplicate_stderr_filters;
  return p;
}

namespace {

// The stream goes through the relay, whatever else happens to it, so its lines can be filtered.
void RelayForDuplicates(StreamPlan* sp) {
  sp->duplicated = true;
  switch (sp->target.kind) {
    case StdioTarget::Kind::kFile:
      sp->tee_file = sp->target.path;  // the relay writes the log file the worker would have
      sp->target = StdioTarget::Pipe();
      return;
    case StdioTarget::Kind::kInherit:
      sp->target = StdioTarget::Pipe();
      sp->console = true;
      return;
    case StdioTarget::Kind::kDevNull:
      sp->target = StdioTarget::Pipe();
      return;
    case StdioTarget::Kind::kPipe:
    case StdioTarget::Kind::kPty:
      return;
  }
}

StdioTarget PtyFor(WindowSize console, const std::string& prefix) {
  WindowSize w = WorkerWindow(console, prefix.size());
  return StdioTarget::Pty(w.rows, w.cols);
}

// --output-timeout watches output as the relay reads it: every stream goes through a pipe, with
// the same destination (a file the worker would have written is written by the relay instead).
void RelayForOutputTimeout(StreamPlan* sp) {
  switch (sp->target.kind) {
    case StdioTarget::Kind::kPipe:
    case StdioTarget::Kind::kPty:
      return;
    case StdioTarget::Kind::kInherit:
      sp->console = true;
      break;
    case StdioTarget::Kind::kFile:
      sp->tee_file = sp->target.path;
      break;
    case StdioTarget::Kind::kDevNull:
      break;
  }
  sp->target = StdioTarget::Pipe();
}

}  // namespace

WindowSize WorkerWindow(WindowSize console, size_t prefix_width) {
  int cols = static_cast<int>(console.cols) - static_cast<int>(prefix_width);
  if (cols < 20) cols = std::min<int>(20, console.cols);
  return WindowSize{console.rows, static_cast<unsigned short>(cols)};
}

StatusOr<std::vector<WorkerOutputPlan>> PlanOutput(const LaunchConfig& c, const OutputFlags& p, const PlanInputs& in) {
  if (in.paths == nullptr || static_cast<int>(in.paths->ranks.size()) < in.nproc) {
    return Status::Error("PlanOutput: attempt paths missing for " + std::to_string(in.nproc) + " ranks");
  }
  if (!in.global_ranks.empty() && static_cast<int>(in.global_ranks.size()) != in.nproc) {
    return Status::Error("PlanOutput: global_ranks has the wrong size");
  }
  const bool files = in.paths->files_enabled();
  const bool inherit_ok = p.prefix_inherit || (in.nproc == 1 && !p.prefix_given);

  std::vector<WorkerOutputPlan> plans;
  for (int lr = 0; lr < in.nproc; ++lr) {
    WorkerOutputPlan w;
    w.local_rank = lr;
    w.global_rank = in.global_ranks.empty() ? in.node_rank * in.nproc + lr : in.global_ranks[static_cast<size_t>(lr)];
    const RankPaths& rp = in.paths->ranks[static_cast<size_t>(lr)];
    w.error_file = rp.error_file;
    RankLabel label{c.role, w.global_rank, lr, in.world_size, in.node_rank, in.host, in.multi_node};
    w.prefix = p.prefix.Render(label);
    const bool shown = p.local_filter.Allows(lr) && p.rank_filter.Allows(w.global_rank);

    for (int k = 0; k < 2; ++k) {
      const bool is_out = k == 0;
      StreamPlan& sp = is_out ? w.out : w.err;
      const std::string& path = is_out ? rp.stdout_log : rp.stderr_log;
      Std red = p.redirects.ForRank(lr);
      Std tee = p.tee.ForRank(lr);
      const bool redirected = is_out ? HasStdout(red) : HasStderr(red);
      const bool teed = is_out ? HasStdout(tee) : HasStderr(tee);
      if (teed && shown) {
        sp.target = StdioTarget::Pipe();
        sp.console = true;
        if (files) sp.tee_file = sp.log_file = path;
      } else if (redirected) {
        if (files) {
          sp.target = StdioTarget::File(path);
          sp.log_file = path;
        } else {
          sp.target = StdioTarget::DevNull();
        }
      } else if (!shown) {
        sp.target = StdioTarget::DevNull();
      } else if (inherit_ok) {
        sp.target = StdioTarget::Inherit();
      } else {
        sp.target = StdioTarget::Pipe();
        sp.console = true;
        sp.unprefixed = p.tee.AnySet() && !p.prefix_given;
      }
      if (!is_out && sp.target.kind == StdioTarget::Kind::kDevNull) sp.target = StdioTarget::Pipe();
      if (!is_out && sp.target.kind == StdioTarget::Kind::kInherit && in.relay_lone_stderr && !p.prefix_inherit &&
          !in.stderr_terminal) {
        sp.target = StdioTarget::Pipe();
        sp.console = true;
        sp.unprefixed = true;
      }
      if (files && !(is_out ? p.duplicate_stdout : p.duplicate_stderr).empty()) RelayForDuplicates(&sp);
      if (c.output_timeout > 0) RelayForOutputTimeout(&sp);
      if (sp.console && p.prefix_terminal_only && !(is_out ? in.stdout_terminal : in.stderr_terminal))
        sp.unprefixed = true;
      // Not for a stream also copied into a file (--tee, the duplicate filters): the file must hold
      // what a worker writes when it is not at a terminal (no colour codes, no redrawn progress
      // bars), as under torchrun, whose tee'd workers write to files.
      if (is_out && in.pty_window && sp.target.kind == StdioTarget::Kind::kPipe && sp.console && sp.tee_file.empty() &&
          !sp.duplicated)
        sp.target = PtyFor(*in.pty_window, sp.unprefixed ? std::string() : w.prefix);
    }
    w.in = !in.forward_stdin ? StdioTarget::Inherit() : lr == 0 ? StdioTarget::Pipe() : StdioTarget::DevNull();
    plans.push_back(std::move(w));
  }
  return plans;
}

StatusOr<UniqueFd> OpenLogFile(const std::string& path) {
  UniqueFd fd(RetryOnEintr([&] { return ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644); }));
  if (!fd) return Status::Errno("open " + path, errno);
  MoveHigh(&fd);  // held while workers start: out of every spawned child's copy of the fd table
  return fd;
}

StatusOr<DuplicateFiles> OpenDuplicateFiles(const OutputFlags& flags, const AttemptPaths& paths) {
  DuplicateFiles d;
  if (!paths.files_enabled()) return d;
  auto open = [](const std::vector<std::string>& filters, const std::string& path,
                 std::shared_ptr<DuplicateFile>* out) -> Status {
    if (filters.empty()) return Status::Ok();
    auto fd = OpenLogFile(path);
    if (!fd.ok()) return fd.status();
    *out = std::make_shared<DuplicateFile>(std::move(*fd), filters, path);
    return Status::Ok();
  };
  if (Status s = open(flags.duplicate_stdout, paths.filtered_stdout, &d.out); !s.ok()) return s;
  if (Status s = open(flags.duplicate_stderr, paths.filtered_stderr, &d.err); !s.ok()) return s;
  return d;
}

StatusOr<Sinks> MakeSinks(const WorkerOutputPlan& plan, Stream stream, const DuplicateFiles& duplicates) {
  const StreamPlan& sp = stream == Stream::kStdout ? plan.out : plan.err;
  Sinks s;
  if (sp.duplicated) {
    s.duplicate = stream == Stream::kStdout ? duplicates.out : duplicates.err;
    s.duplicate_prefix = plan.prefix;
  }
  s.console = sp.console;
  s.prefix = sp.unprefixed ? "" : plan.prefix;
  s.color_key = plan.global_rank;
  if (!sp.tee_file.empty()) {
    auto fd = OpenLogFile(sp.tee_file);
    if (!fd.ok()) return fd.status();
    s.file = std::move(*fd);
  }
  return s;
}

}  // namespace ctrun::logs
