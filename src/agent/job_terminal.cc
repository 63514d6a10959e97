#include "agent/job_terminal.h"

#include <unistd.h>

namespace ctrun {

namespace {
// --tty=always when ctrun's stdout is no terminal: a conventional size.
constexpr WindowSize kDefaultWindow{24, 80};
}  // namespace

JobTerminal::JobTerminal(TtyMode mode, EventLoop& loop, Spawner& spawner, int console_fd, int stdin_fd)
    : console_fd_(console_fd),
      console_tty_(::isatty(console_fd) == 1),
      stderr_tty_(::isatty(STDERR_FILENO) == 1),
      forwarder_(StdinForwarder::Create(loop, stdin_fd)),
      terminals_(spawner) {
  const bool tty = console_tty_;
  if (mode == TtyMode::kAlways || (mode == TtyMode::kAuto && tty))
    window_ = GetWindowSize(console_fd).value_or(kDefaultWindow);
  last_size_ = ConsoleSize();
}

void JobTerminal::FillPlanInputs(logs::PlanInputs* in) const {
  in->pty_window = window_;
  in->forward_stdin = forwarder_ != nullptr;
  in->stdout_terminal = console_tty_;
  in->stderr_terminal = stderr_tty_;
}

void JobTerminal::OnWorkerStarted(int local_rank, const logs::WorkerOutputPlan& plan, SpawnedProcess& proc) {
  // The pty was sized as the plan did (output_plan.cc): less the prefix its lines carry, if any.
  if (plan.out.target.kind == StdioTarget::Kind::kPty && proc.stdout_pipe)
    terminals_.Add(proc.pid, proc.stdout_pipe.get(), plan.out.unprefixed ? 0 : plan.prefix.size());
  if ((console_tty_ && plan.out.target.kind == StdioTarget::Kind::kInherit) ||
      (stderr_tty_ && plan.err.target.kind == StdioTarget::Kind::kInherit))
    terminals_.AddInheriting(proc.pid);
  if (local_rank == 0 && forwarder_ && proc.stdin_pipe) forwarder_->SetTarget(std::move(proc.stdin_pipe));
}

void JobTerminal::OnNewAttempt() {
  terminals_.Clear();
  if (forwarder_) forwarder_->ClearTarget();
}

void JobTerminal::OnWindowChanged() {
  terminals_.TellInheriting();
  last_size_ = ConsoleSize();
  if (!window_) return;
  if (console_tty_ && last_size_) window_ = *last_size_;  // stdout's size (ConsoleSize prefers it)
  terminals_.Resize(*window_);
}

// The console's size: stdout's terminal, else stderr's (a worker may inherit either).
std::optional<WindowSize> JobTerminal::ConsoleSize() const {
  if (console_tty_) return GetWindowSize(console_fd_);
  if (stderr_tty_) return GetWindowSize(STDERR_FILENO);
  return std::nullopt;
}

void JobTerminal::OnContinued() {
  if (forwarder_) forwarder_->OnContinued();
  // A resize while the job was stopped sent ctrun no SIGWINCH, and fg sends none either.
  if (const auto now = ConsoleSize(); now && now != last_size_) OnWindowChanged();
}

}  // namespace ctrun
