// StdinForwarder: ctrun's terminal input goes to local rank 0 (input(), pdb, breakpoint()), the
// way torchrun users debug rank 0. Workers run in background process groups of ctrun's session,
// so a worker reading the terminal itself would be stopped by SIGTTIN forever; instead local
// rank 0's stdin is a pipe that ctrun feeds from the terminal in its event loop, and the other
// ranks read /dev/null (logs/output_plan.h decides, SpawnSpec::stdin_target carries it).
//
// Contract:
//  - Used only when ctrun's stdin is a terminal (Create returns null otherwise, and workers
//    inherit ctrun's stdin as before). The terminal stays in the user's mode: the terminal
//    itself echoes and edits lines; rank 0 receives whole lines (and Ctrl-D as end of file).
//  - ctrun reads through its own open file description of the terminal (O_NONBLOCK there never
//    reaches the shell's stdin).
//  - Reads only while there is a target (rank 0's pipe) with room: nothing typed while no rank 0
//    runs, or while rank 0 does not read, is consumed. Bytes read are written on in order; at
//    most one read's worth waits for room in the pipe.
//  - In the background (`ctrun ... &`, or after `bg`) a read fails with EIO, not SIGTTIN (ctrun
//    blocks SIGTTIN, BlockAgentSignals): the forwarder stops reading until OnContinued (ctrun
//    got SIGCONT: `fg` of a stopped job), or until input arrives while ctrun's process group is
//    the terminal's foreground one (`fg` of a running job sends no signal). Meanwhile the
//    terminal is watched edge-triggered, so input for the shell wakes ctrun once, not in a loop.
//    Input typed ahead in the background and left unread by the shell waits for the next key.
//  - End of file on the terminal (Ctrl-D at the start of a line) closes rank 0's pipe: it reads
//    EOF. A worker that closed its stdin or exited (EPIPE: the caller ignores SIGPIPE, as
//    BlockAgentSignals does) loses its target; typed bytes for it are dropped.
//  - Loop thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/unique_fd.h"
#include "sys/event_loop.h"

namespace ctrun {

class StdinForwarder {
 public:
  // Null when stdin_fd is not a terminal or cannot be reopened.
  static std::unique_ptr<StdinForwarder> Create(EventLoop& loop, int stdin_fd = 0);
  ~StdinForwarder();
  StdinForwarder(const StdinForwarder&) = delete;
  StdinForwarder& operator=(const StdinForwarder&) = delete;

  // The write end of the new rank 0's stdin pipe (replaces any previous one).
  void SetTarget(UniqueFd write_end);
  void ClearTarget();
  bool has_target() const { return target_.valid(); }
  // A read found ctrun in the background, and no input since found it in the foreground.
  bool in_background() const { return background_; }
  // ctrun was continued (SIGCONT): try the terminal again if a background read had failed.
  void OnContinued();

 private:
  StdinForwarder(EventLoop& loop, UniqueFd in) : loop_(loop), in_(std::move(in)) {}
  void Update();
  void OnInput();
  void OnTargetWritable();
  bool Flush();  // false: target gone

  EventLoop& loop_;
  UniqueFd in_;
  UniqueFd target_;
  std::string pending_;
  bool in_watched_ = false;
  bool out_watched_ = false;
  uint32_t in_events_ = 0;  // the events in_ is watched for, while in_watched_
  bool background_ = false;
};

}  // namespace ctrun
