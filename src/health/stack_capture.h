// StackCapture: saves the stacks of every process of a hung rank (its process group) before ctrun
// stops it, asynchronously on the EventLoop and within a bounded time.
//
// Per process of the group, one after the other for that process (a process has one tracer at a
// time), all processes at once:
//   native: `eu-stack -p PID` (elfutils), else `gdb -batch -nx -p PID -ex "thread apply all bt"`:
//           every thread, written to <dir>/native.<pid>.txt (the tool's stderr to .err);
//   Python: for a process whose executable is python*, and when gdb is installed, gdb calls the
//           interpreter's own signal-safe dumper (_Py_DumpTracebackThreads, what faulthandler
//           uses; no GIL needed) inside the process: every thread's Python stack goes to the
//           process's stderr, i.e. the rank's console lines / stderr log and the summary's stderr
//           tail. gdb prints the dumper's result (NULL: every thread written, else its reason) to
//           <dir>/python.<pid>.out (its stderr to .err). Nothing is set up in workers beforehand:
//           workers that never hang run exactly as without ctrun. (The call runs code in the hung
//           process, which is stopped right after; where gdb cannot restore the interrupted system
//           call, the process may then fail.)
// What counts is what was written, never a tool's exit status (the agent's reaper may reap a tool
// before its pidfd is read, and gdb exits 0 when `thread apply all bt` found no process): a
// process's stacks are saved when its native.<pid>.txt is not empty (an empty one, from a tool
// that could not attach, e.g. ptrace EPERM under Yama, is removed), and its Python stacks when
// python.<pid>.out shows the dumper returned NULL. The summary counts those, and names the error
// files kept for the others (empty .err files, and the .out and .err of a dump that worked, are
// removed).
// The tools run as ctrun's children in their own process groups (PosixSpawner: PR_SET_PDEATHSIG);
// their exits are seen through pidfds (the agent's reaper reaps them as unknown pids). One deadline
// bounds the whole capture: tools still running then are SIGKILLed (a SIGSTOPped or D-state target
// can hold a tracer) and the capture ends. A missing tool is reported, never waited for.
// done(summary) is called exactly once, from the loop, never from inside Capture().
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/unique_fd.h"
#include "health/stack_summary.h"
#include "process/spawner.h"
#include "sys/event_loop.h"

namespace ctrun::health {

struct StackTools {
  std::string eu_stack;  // absolute paths; "" when not installed
  std::string gdb;
  std::vector<std::string> env;  // the tools' environment (K=V)
};

// eu-stack and gdb through `path` (PATH's value; nullptr: the system directories).
StackTools FindStackTools(const std::string* path, std::vector<std::string> env);

// The pids whose process group is pgid (from /proc), pgid first when alive.
std::vector<pid_t> ProcessesInGroup(pid_t pgid);

class StackCapture {
 public:
  using Done = std::function<void(const StackSummary& summary)>;

  StackCapture(EventLoop& loop, StackTools tools, Duration timeout);
  ~StackCapture();  // SIGKILLs tools still running; done is not called
  StackCapture(const StackCapture&) = delete;
  StackCapture& operator=(const StackCapture&) = delete;

  // Captures the stacks of process group pgid into dir (created; "" = nowhere to save: nothing is
  // run). One capture at a time: a second call while busy() gets done("...busy") at once (async).
  void Capture(pid_t pgid, const std::string& dir, Done done);
  bool busy() const { return active_ != nullptr; }

 private:
  struct Step {
    std::vector<std::string> argv;
    std::string out;  // stdout file
    std::string err;  // stderr file ("" = /dev/null)
    bool python = false;  // the Python dump (gdb's inferior call)
    bool started = false;  // spawned: its files are this capture's, not left from an earlier one
  };
  struct Target {
    pid_t pid = -1;
    std::vector<Step> steps;
    size_t next = 0;
    pid_t tool = -1;  // the running tool (its own process group)
    UniqueFd pidfd;
  };
  struct Active {
    std::string dir;
    Done done;
    std::vector<std::unique_ptr<Target>> targets;
    std::optional<TimerQueue::TimerId> deadline;
    int python = 0;       // Python dumps planned
    int python_done = 0;  // ... whose dumper returned NULL (Finish, from python.<pid>.out)
    int saved = 0;        // processes whose native.<pid>.txt is not empty (Finish)
    std::vector<std::string> error_files;  // kept for the processes or dumps that failed (Finish)
    int failed_starts = 0;
    std::string note;
  };
  void StartNext(Target& t);
  // Counts what the steps of t wrote (saved, python_done, error_files) and removes what says
  // nothing; after its tool is gone.
  void Collect(Target& t);
  void OnToolExited(Target& t);
  void OnDeadline();
  void Finish(bool timed_out);
  void KillTool(Target& t);
  StackSummary Summary(bool timed_out) const;

  EventLoop& loop_;
  StackTools tools_;
  Duration timeout_;
  PosixSpawner spawner_;
  std::unique_ptr<Active> active_;
};

}  // namespace ctrun::health
