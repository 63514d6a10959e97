// SpawnSpec: everything needed to start one worker, built before fork (nothing is computed in the
// child). The spawner turns it into fork/exec; the fake spawner records it.
#pragma once

#include <string>
#include <vector>

namespace ctrun {

// What a worker's fd 0, 1 or 2 becomes.
struct StdioTarget {
  enum class Kind {
    kInherit,  // ctrun's own fd 0/1/2 (the console), untouched
    kPipe,     // a pipe; the parent keeps the other end (SpawnedProcess::stdout_pipe/stderr_pipe:
               // the read end; stdin_pipe: the write end)
    kFile,     // open(path, O_WRONLY|O_CREAT|O_TRUNC) in the child's place, by the parent
    kDevNull,  // /dev/null
    kPty,      // fd 1/2 only: a fresh pseudo-terminal (sys/pty.h) of window size rows x cols; the
               // child gets the slave, the parent keeps the master (as stdout_pipe/stderr_pipe).
               // The pty is NOT the worker's controlling terminal (no setsid, see SpawnSpec).
  };
  Kind kind = Kind::kInherit;
  std::string path;  // kFile
  unsigned short rows = 0, cols = 0;  // kPty; 0 x 0: the kernel's default

  static StdioTarget Inherit() { return {}; }
  static StdioTarget Pipe() { return {Kind::kPipe, {}}; }
  static StdioTarget File(std::string p) { return {Kind::kFile, std::move(p)}; }
  static StdioTarget DevNull() { return {Kind::kDevNull, {}}; }
  static StdioTarget Pty(unsigned short r, unsigned short c) { return {Kind::kPty, {}, r, c}; }
};

// Every worker also: leads its own process group (setpgid) in ctrun's session, gets
// PR_SET_PDEATHSIG(SIGKILL), keeps ctrun's working directory, and sees no fd but 0, 1, 2 and the
// one extra_fd below.
//
// Sessions and terminals: a worker never calls setsid, even when its output is a pty. Making the
// pty its controlling terminal would need a session of its own, and then (a) its process group
// would be orphaned (its parent, ctrun, in another session), so the kernel would discard the
// SIGTSTP ctrun sends on Ctrl-Z; (b) the kernel would SIGHUP the group when the leader exits.
// Staying in ctrun's session keeps killpg(pid), job control and Ctrl-C exactly as with pipes. The
// price: the kernel sends no SIGWINCH for a pty that is nobody's controlling terminal, so ctrun
// sends it itself after resizing (agent/worker_terminals.h), and /dev/tty in a worker is still
// ctrun's terminal (where its process group is in the background).
struct SpawnSpec {
  std::string executable;         // the file execve runs, PATH already searched by whoever built the
                                  // spec (the spawner reads no environment); "": argv[0] as a path
  std::vector<std::string> argv;  // argv[0] is what the program sees as its name
  std::vector<std::string> env;   // complete environment, "K=V", exactly as execve gets it
  StdioTarget stdin_target;  // kInherit, kPipe (ctrun writes, agent/stdin_forwarder.h) or kDevNull
  StdioTarget stdout_target;
  StdioTarget stderr_target;
  // An open cgroup.procs file (cgroup v2, sys/cgroup.h): the child writes "0" to it before exec and
  // so runs, with everything it starts, in that cgroup. -1: ctrun's own cgroup. Not owned here.
  int cgroup_procs_fd = -1;
  // The same cgroup's directory (O_PATH|O_DIRECTORY): when given, the child of a small batch is
  // created in it (clone3 CLONE_INTO_CGROUP, Linux >= 5.7, see PosixSpawner::
  // kCloneIntoCgroupMaxBatch), which spares the migration the write to cgroup.procs costs;
  // cgroup_procs_fd remains the way for big batches and where the kernel refuses. Not owned.
  int cgroup_dir_fd = -1;
  // The watchdog's pipe (process/watchdog.h): the child registers its process group there after
  // setpgid and before exec, so a SIGKILL of ctrun at any later moment still kills everything the
  // worker starts. -1: no watchdog. Not owned.
  int watchdog_fd = -1;
  // One more fd the worker inherits (its heartbeat channel): the caller's extra_fd (any flags;
  // still owned by the caller) becomes the child's extra_fd_target, without CLOEXEC. -1: none.
  int extra_fd = -1;
  int extra_fd_target = 3;
  std::vector<int> cpu_affinity;  // CPUs the worker may run on (sched_setaffinity before exec);
                                  // empty: ctrun's own affinity, inherited
  bool stop_before_exec = false;  // raise SIGSTOP just before exec, for a debugger to attach;
                                  // Spawn does not wait for such an exec (a late failure shows
                                  // only as the worker's exit)
};

}  // namespace ctrun
