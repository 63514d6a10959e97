// ctrun/heartbeat.h — liveness beats from a worker to the agent (hang detection).
//
// Contract: heartbeat() is a no-op (a few nanoseconds) unless the launcher asked for beats through
// one of these variables, read once on the first call:
//   CTRUN_HEARTBEAT_FD=<n>     an inherited, writable fd (pipe/FIFO/socket): each beat writes one
//                              line "<counter> <unix_time_ns>\n" (< PIPE_BUF, so atomic on a pipe);
//                              the fd is made non-blocking, and a beat that would block is dropped
//                              (the agent is behind; the next beat carries a larger counter).
//   CTRUN_HEARTBEAT_FILE=<path> a regular file, rewritten in place with pwrite at offset 0 with the
//                              fixed-width record "%020llu %020llu\n" (counter, unix_time_ns), 42
//                              bytes. A reader that sees a record not matching that shape re-reads.
// The counter starts at 1 and grows by one per beat (monotonic within a process; a restarted
// worker starts again at 1). When FD is set it wins over FILE. Errors (EBADF, ENOSPC) disable beats
// for the rest of the process silently: heartbeats must never kill training. Thread-safe.
// The launcher decides how long a worker may go without a beat; a worker should beat at least once
// per step.
#pragma once

#include <cstdint>

namespace ctrun::worker {

// Returns the counter value written, or 0 when heartbeats are disabled.
uint64_t heartbeat();
bool heartbeat_enabled();

}  // namespace ctrun::worker

namespace ctrun {
using worker::heartbeat;
}  // namespace ctrun
