#include "health/stack_capture.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "agent/launch_checks.h"
#include "base/shebang.h"
#include "health/hang_watcher.h"
#include "sys/posix_util.h"
#include "sys/proc_fs.h"

namespace ctrun::health {
namespace {

// Field 5 of /proc/<pid>/stat (pgrp), read after the last ')' (the command may contain any byte).
std::optional<pid_t> ProcessGroupOf(pid_t pid) {
  const std::optional<ProcStat> st = ReadProcStat("/proc", pid);
  if (!st || st->state == 'Z') return std::nullopt;  // a zombie has no stack
  return st->pgrp;
}

bool IsPython(pid_t pid) {
  char buf[4096];
  const std::string link = "/proc/" + std::to_string(pid) + "/exe";
  ssize_t n = ::readlink(link.c_str(), buf, sizeof buf - 1);
  if (n <= 0) return false;
  buf[n] = '\0';
  return IsPythonProgram(buf);
}

void RemoveIfEmpty(const std::string& path) {
  struct stat st;
  if (!path.empty() && ::stat(path.c_str(), &st) == 0 && st.st_size == 0) ::unlink(path.c_str());
}

bool NonEmpty(const std::string& path) {
  struct stat st;
  return !path.empty() && ::stat(path.c_str(), &st) == 0 && st.st_size > 0;
}

std::string BaseName(const std::string& path) { return path.substr(path.rfind('/') + 1); }

// gdb's stdout of the Python step shows the dumper's result as a line "$1 = 0x0" when it returned
// NULL (every thread written); an error string, or no such line (gdb could not attach, or was
// killed before it printed), is a dump that failed.
bool DumperReturnedNull(const std::string& gdb_stdout_path) {
  const std::string out = ReadFileHead(gdb_stdout_path, 64 << 10);
  size_t start = 0;
  while (start < out.size()) {
    size_t end = out.find('\n', start);
    if (end == std::string::npos) end = out.size();
    std::string_view line(out.data() + start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.starts_with('$') && line.ends_with(" = 0x0") &&
        line.find_first_not_of("0123456789", 1) == line.size() - 6)
      return true;
    start = end + 1;
  }
  return false;
}

}  // namespace

StackTools FindStackTools(const std::string* path, std::vector<std::string> env) {
  StackTools t;
  t.env = std::move(env);
  for (auto [name, out] : {std::pair{"eu-stack", &t.eu_stack}, std::pair{"gdb", &t.gdb}}) {
    std::string p = ResolveExecutable(name, path);
    if (p.find('/') != std::string::npos) *out = p;
  }
  return t;
}

std::vector<pid_t> ProcessesInGroup(pid_t pgid) {
  std::vector<pid_t> out;
  if (ProcessGroupOf(pgid) == pgid) out.push_back(pgid);
  for (pid_t pid : NumericEntries("/proc"))
    if (pid != pgid && ProcessGroupOf(pid) == pgid) out.push_back(pid);
  return out;
}

// The tools are forked, not made vfork-style: a gdb started from the spawn thread made its inferior
// call (_Py_DumpTracebackThreads) abort the Python worker with glibc's "The futex facility returned
// an unexpected error code" in 4 of 4 runs under load. Forked, the same abort was later seen in
// every run on another kernel (6.18, gdb 13.1): the interrupted futex wait is not restarted after
// the call. The dump is written before that, and the agent waits for the capture to end before it
// ends the attempt, so the rank is still reported hung with its stacks.
StackCapture::StackCapture(EventLoop& loop, StackTools tools, Duration timeout)
    : loop_(loop),
      tools_(std::move(tools)),
      timeout_(timeout),
      spawner_(std::chrono::seconds(2), PosixSpawner::Method::kFork) {}

StackCapture::~StackCapture() {
  if (!active_) return;
  if (active_->deadline) loop_.CancelTimer(*active_->deadline);
  for (auto& t : active_->targets) KillTool(*t);
}

void StackCapture::Capture(pid_t pgid, const std::string& dir, Done done) {
  if (active_) {
    loop_.AddTimerAfter(Duration::zero(), [done] { done({"stacks not captured: another capture is running", false}); });
    return;
  }
  active_ = std::make_unique<Active>();
  active_->dir = dir;
  active_->done = std::move(done);
  active_->deadline = loop_.AddTimerAfter(timeout_, [this] {
    active_->deadline.reset();
    OnDeadline();
  });
  if (dir.empty()) {
    active_->note = "stacks not captured: no log directory to save them in (--log-dir /dev/null)";
  } else if (tools_.eu_stack.empty() && tools_.gdb.empty()) {
    active_->note = "stacks not captured: neither eu-stack (elfutils) nor gdb is installed";
  } else if (std::error_code ec; !std::filesystem::create_directories(dir, ec) && ec) {
    active_->note = "stacks not captured: cannot create " + dir + ": " + ec.message();
  }
  if (active_->note.empty()) {
    for (pid_t pid : ProcessesInGroup(pgid)) {
      auto t = std::make_unique<Target>();
      t->pid = pid;
      const std::string p = std::to_string(pid);
      const std::string base = dir + "/native." + p;
      if (!tools_.eu_stack.empty())
        t->steps.push_back({{tools_.eu_stack, "-p", p}, base + ".txt", base + ".err"});
      else
        t->steps.push_back({{tools_.gdb, "-batch", "-nx", "-p", p, "-ex", "thread apply all bt"}, base + ".txt",
                            base + ".err"});
      if (!tools_.gdb.empty() && IsPython(pid)) {
        ++active_->python;
        // One call: gdb cannot always restore the registers after an inferior call (some VMs
        // refuse the extended state), so nothing may depend on a second one. The dumper needs no
        // GIL; it writes to the process's stderr, which the relay carries to the rank's log. Its
        // result (const char*: NULL, or why it wrote nothing) is printed by the same call, to
        // python.<pid>.out.
        const std::string py = dir + "/python." + p;
        t->steps.push_back({{tools_.gdb, "-batch", "-nx", "-p", p, "-ex",
                             "call (char*)_Py_DumpTracebackThreads(2, (void*)0, (void*)0)"},
                            py + ".out", py + ".err", /*python=*/true});
      }
      active_->targets.push_back(std::move(t));
    }
    if (active_->targets.empty()) active_->note = "stacks not captured: no process left in the rank's group";
  }
  for (auto& t : active_->targets) StartNext(*t);
  // Everything may have ended (or nothing started): finish from the loop, never from here.
  loop_.AddTimerAfter(Duration::zero(), [this] {
    if (!active_) return;
    for (auto& t : active_->targets)
      if (t->tool > 0) return;
    Finish(false);
  });
}

void StackCapture::StartNext(Target& t) {
  while (t.next < t.steps.size()) {
    Step& s = t.steps[t.next++];
    s.started = true;  // its files are (re)created by the spawn, even one that then fails
    SpawnSpec spec;
    spec.executable = s.argv[0];
    spec.argv = s.argv;
    spec.env = tools_.env;
    spec.stdout_target = s.out.empty() ? StdioTarget::DevNull() : StdioTarget::File(s.out);
    spec.stderr_target = s.err.empty() ? StdioTarget::DevNull() : StdioTarget::File(s.err);
    SpawnedProcess proc;
    SpawnError error;
    if (!spawner_.Spawn(spec, &proc, &error)) {
      ++active_->failed_starts;
      continue;
    }
    t.tool = proc.pid;
    t.pidfd = std::move(proc.pidfd);
    if (!t.pidfd) return;  // no pidfd: the deadline ends it
    Target* raw = &t;
    if (!loop_.AddFd(t.pidfd.get(), EPOLLIN, [this, raw](uint32_t) { OnToolExited(*raw); }).ok()) t.pidfd.reset();
    return;
  }
}

void StackCapture::OnToolExited(Target& t) {
  loop_.RemoveFd(t.pidfd.get());
  t.pidfd.reset();
  t.tool = -1;
  StartNext(t);
  for (auto& other : active_->targets)
    if (other->tool > 0) return;
  Finish(false);
}

void StackCapture::KillTool(Target& t) {
  if (t.tool > 0) ::kill(-t.tool, SIGKILL);  // the tool leads its own group (gdb may fork)
  if (t.pidfd) loop_.RemoveFd(t.pidfd.get());
  t.pidfd.reset();
  t.tool = -1;
}

void StackCapture::OnDeadline() {
  bool running = false;
  for (auto& t : active_->targets) {
    running |= t->tool > 0;
    KillTool(*t);
  }
  Finish(running);
}

void StackCapture::Finish(bool timed_out) {
  if (active_->deadline) loop_.CancelTimer(*active_->deadline);
  active_->deadline.reset();
  for (auto& t : active_->targets) {
    KillTool(*t);
    Collect(*t);
  }
  const StackSummary summary = Summary(timed_out);
  Done done = std::move(active_->done);
  active_.reset();
  done(summary);
}

void StackCapture::Collect(Target& t) {
  Active& a = *active_;
  for (const Step& s : t.steps) {
    if (!s.started) continue;  // never ran (cut at the bound): nothing of it to judge or remove
    if (s.python) {
      if (DumperReturnedNull(s.out)) {
        ++a.python_done;
        ::unlink(s.out.c_str());  // gdb's chatter, and its stderr's, say nothing once it worked
        ::unlink(s.err.c_str());
        continue;
      }
    } else if (NonEmpty(s.out)) {
      ++a.saved;
      RemoveIfEmpty(s.err);  // a tool's warnings beside saved stacks are kept, not pointed to
      continue;
    }
    RemoveIfEmpty(s.out);
    RemoveIfEmpty(s.err);
    if (s.python && NonEmpty(s.out)) a.error_files.push_back(BaseName(s.out));  // the dumper's reason
    if (NonEmpty(s.err)) a.error_files.push_back(BaseName(s.err));
  }
}

StackSummary StackCapture::Summary(bool timed_out) const {
  const Active& a = *active_;
  if (!a.note.empty()) return {a.note, false};
  const size_t n = a.targets.size();
  const size_t k = static_cast<size_t>(a.saved);
  const std::string processes = std::to_string(n) + (n == 1 ? " process" : " processes");
  std::string s;
  if (k == n) s = "stacks of " + processes + " saved in " + a.dir;
  else if (k > 0) s = "stacks of " + std::to_string(k) + " of " + processes + " saved in " + a.dir;
  else s = "stacks not saved in " + a.dir + ": no native stack of the rank's " + processes + " could be read";
  s += std::string(" (native: ") + (tools_.eu_stack.empty() ? "gdb" : "eu-stack");
  if (a.python > 0) {
    // Only dumps whose dumper said it wrote them are counted; the bound or a failed attach cut
    // the others.
    const std::string done = a.python_done == a.python ? "" : std::to_string(a.python_done) + " of ";
    s += "; Python: " + done + std::to_string(a.python) + " process" + (a.python == 1 ? "" : "es") + ", on the rank's stderr";
  }
  else if (tools_.gdb.empty()) s += "; no Python stacks: gdb is not installed";
  s += ")";
  if (timed_out) s += "; the capture was cut at its " + FormatSeconds(timeout_) + " bound (--stack-timeout)";
  if (a.failed_starts > 0) s += "; " + std::to_string(a.failed_starts) + " tool run(s) could not start";
  if (!a.error_files.empty()) {
    // Why the others failed (ptrace not permitted, no such process, ...), in the same directory.
    constexpr size_t kNamed = 4;
    s += "; tool errors in ";
    for (size_t i = 0; i < a.error_files.size() && i < kNamed; ++i) s += (i ? ", " : "") + a.error_files[i];
    if (a.error_files.size() > kNamed) s += " and " + std::to_string(a.error_files.size() - kNamed) + " more";
  }
  const bool complete =
      n > 0 && k == n && a.python_done == a.python && !timed_out && a.failed_starts == 0 && a.error_files.empty();
  return {s, complete};
}

}  // namespace ctrun::health
