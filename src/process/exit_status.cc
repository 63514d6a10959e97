#include "process/exit_status.h"

#include <sys/wait.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <string>

namespace ctrun {
namespace {

struct SigEntry {
  int sig;
  const char* name;
};
constexpr SigEntry kSignals[] = {
    {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},     {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
    {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"},   {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
    {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"},   {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
    {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"},   {SIGTERM, "SIGTERM"}, {SIGCHLD, "SIGCHLD"},
    {SIGCONT, "SIGCONT"}, {SIGSTOP, "SIGSTOP"},   {SIGTSTP, "SIGTSTP"}, {SIGTTIN, "SIGTTIN"},
    {SIGTTOU, "SIGTTOU"}, {SIGURG, "SIGURG"},     {SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"},
    {SIGVTALRM, "SIGVTALRM"}, {SIGPROF, "SIGPROF"}, {SIGWINCH, "SIGWINCH"}, {SIGIO, "SIGIO"},
    {SIGPWR, "SIGPWR"},   {SIGSYS, "SIGSYS"},
};

}  // namespace

ExitStatus ExitStatus::FromWaitStatus(int status) {
  if (WIFSIGNALED(status)) return Signaled(WTERMSIG(status), WCOREDUMP(status));
  return Exited(WEXITSTATUS(status));
}

std::string ExitStatus::ToString() const {
  if (exited()) return "exited with code " + std::to_string(value_);
  std::string s = "killed by signal " + std::to_string(value_) + " (" + SignalName(value_) + ")";
  if (core_) s += " (core dumped)";
  return s;
}

std::string SignalName(int sig) {
  for (const auto& e : kSignals)
    if (e.sig == sig) return e.name;
  if (sig >= SIGRTMIN && sig <= SIGRTMAX) return "SIGRTMIN+" + std::to_string(sig - SIGRTMIN);
  return "SIG" + std::to_string(sig);
}

int SignalFromName(const std::string& raw) {
  std::string name = raw;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::toupper(c); });
  if (!name.empty() && std::all_of(name.begin(), name.end(), [](unsigned char c) { return std::isdigit(c); })) {
    int v = std::atoi(name.c_str());
    return (v > 0 && v < NSIG) ? v : 0;
  }
  if (name.rfind("SIG", 0) != 0) name = "SIG" + name;
  for (const auto& e : kSignals)
    if (name == e.name) return e.sig;
  return 0;
}

}  // namespace ctrun
