// ctrun/heartbeat.h — liveness beats from a worker to the agent (hang detection).
//
// Contract: heartbeat() is a no-op (a few nanoseconds) unless the launcher asked for beats through
// one of these variables, read once on the first call:
//   CTRUN_HEARTBEAT_FD=<n>     an inherited, writable fd (ctrun gives a datagram socket; a pipe,
//                              FIFO or stream socket works too; fstat decides, and any other kind
//                              of fd, a regular file included, is treated like a closed one: not
//                              used): each beat writes one line
//                              "<step> <unix_time_ns>\n", or from heartbeat() without a step
//                              "<counter> <unix_time_ns> counter\n" (< PIPE_BUF, so atomic on a
//                              pipe; the mark tells ctrun the number is no training step). The
//                              reader takes the first field as the step and ignores the rest, so
//                              "<step>\n" alone is a valid beat (what a Python worker writes). The
//                              fd is made non-blocking, and a beat that would block is dropped (the
//                              agent is behind; the next beat carries a newer step). On a socket a
//                              beat is one send(MSG_NOSIGNAL); on a pipe SIGPIPE is held off.
//   CTRUN_HEARTBEAT_ID=<dev>:<ino> (with FD; ctrun sets both) the st_dev and st_ino of the fd FD
//                              names, decimal, as fstat gives them. When set (not empty), an fd
//                              whose fstat does not match is not the launcher's and counts as
//                              unset: no beat goes through it and its flags are left alone. Unset,
//                              the kind of fd alone decides (above).
//   CTRUN_HEARTBEAT_FILE=<path> a regular file, rewritten in place with pwrite at offset 0 with the
//                              fixed-width record "%020llu %020llu\n" (step, unix_time_ns), 42
//                              bytes. A reader that sees a record not matching that shape re-reads.
//                              The path is opened without blocking and without following a
//                              symbolic link; a path that is a link or not a regular file (a FIFO,
//                              a device) leaves beats off. (For other launchers: ctrun itself uses
//                              the FD.)
// The step is what the caller passes, or for heartbeat() the beat counter: 1, 2, ... per process
// (a restarted worker starts again at 1). Pass the training step (global, resumed from the
// checkpoint) when there is one: ctrun reports the last step of a hung rank and compares steps
// across restarts to tell a crash loop from progress. When FD is set it wins over FILE (an FD that
// is closed, not a pipe, FIFO or socket, or not the one CTRUN_HEARTBEAT_ID names counts as unset).
// The fd is made CLOEXEC when the library is loaded (before main, not at the first beat), so a
// child process inherits the variables but not the fd; when the child's own socket() or open()
// reuses the number, the identity check (CTRUN_HEARTBEAT_ID; without it, the fd kind check, for a
// regular file only) keeps beats out of that file. A process forked (without exec) from the worker, before or after its
// first beat, inherits the fd but is not the rank: there heartbeat() returns 0 and
// heartbeat_enabled() false, so a data loader or helper cannot keep a hung rank looking alive
// (a worker forked by ctrun --warm's server reads its own variables afresh). On a stream socket a
// line the socket takes only in part is finished before the next one, so lines never merge. Errors
// (EBADF, ENOSPC, a closed reader) disable beats for the rest of the process silently: heartbeats
// must never kill training. Thread-safe.
// The launcher decides how long a worker may go without a beat; a worker should beat at least once
// per step.
#pragma once

#include <cstdint>

namespace ctrun::worker {

// The variable that names the inherited fd (above).
inline constexpr char kHeartbeatFdVariable[] = "CTRUN_HEARTBEAT_FD";
// The variable that names the identity of that fd's file, "<st_dev>:<st_ino>" (above).
inline constexpr char kHeartbeatIdVariable[] = "CTRUN_HEARTBEAT_ID";
// The third field of a beat line sent by heartbeat() without a step (above).
inline constexpr char kHeartbeatCounterMark[] = "counter";

// Returns the beat counter (1, 2, ...) of the beat written, or 0 when heartbeats are disabled or
// the beat was dropped.
uint64_t heartbeat();
// The same, reporting `step` as the progress of this worker.
uint64_t heartbeat(uint64_t step);
bool heartbeat_enabled();

}  // namespace ctrun::worker

namespace ctrun {
using worker::heartbeat;
}  // namespace ctrun
