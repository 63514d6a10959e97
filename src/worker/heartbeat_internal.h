// The worker library's own use of the heartbeat state (not installed).
#pragma once

namespace ctrun::worker {

// For a worker forked by the warm server (warm_main.cc), once its environment is in place:
// forget whatever channel the server process set up, so that the worker reads its own variables
// at its first beat, as an exec'd worker does, instead of counting as a process forked from the
// server (which sends no beats). The worker's own channel (its fds are placed by now) is made
// CLOEXEC at once, as an exec'd worker's is when the library loads. Call only while the process
// has one thread.
void ForgetHeartbeatChannel();

}  // namespace ctrun::worker
