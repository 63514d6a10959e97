// ctrun/warm_main.h — opt a C++ worker into warm starts (ctrun --warm).
//
//   int train_main(int argc, char** argv) { ... }   // what main was
//   CTRUN_MAIN(train_main)
//
// CTRUN_MAIN defines main() and places an ELF note (owner "ctrun", type kWarmNoteType, a 4-byte
// protocol version) in the executable. ctrun --warm reads the note from the file before it runs
// anything: a binary with the note is started ONCE per job as the warm server (the dynamic loader
// has then mapped LibTorch and run every static initialiser once) and each worker of each attempt
// is forked from it and calls train_main with the worker's argv, environment, working directory,
// fds 0-2 and heartbeat fd; a binary without it is exec'd as usual.
//
// Without ctrun, or under ctrun without --warm, main() is `return train_main(argc, argv);`: the
// program behaves exactly like one with a plain main. The server role is entered only when the
// variable CTRUN_WARM_SERVER names an inherited SOCK_SEQPACKET socket and ctrun's pid (ctrun sets
// it for the server alone; the variable is removed before anything else runs).
//
// A forked worker ends like a cold process: train_main's return value (or exit(n) called anywhere)
// is the exit code, handlers it registered run (atexit, destructors of statics it constructed),
// stdio is flushed, an uncaught exception reaches std::terminate. Not run: the destructors of
// objects constructed before main (in the server), which would copy the pages the worker shares
// with the server (a copy-on-write storm at every exit).
// With ctrun::worker_torch (CTRUN_WITH_TORCH), LibTorch's default CPU generator is reseeded from
// fresh entropy in every worker, as a fresh process seeds it at its first use.
// NOT as in a cold process: static initialisers (everything that runs before main) ran ONCE, in
// the server, before any worker existed, and every rank of every attempt inherits their results.
// A static std::mt19937 seeded from std::random_device has the same state in all of them, and
// getenv() during static initialisation read the server's environment: the variables common to
// the node's first-attempt workers, so RANK, LOCAL_RANK and the like were unset there (or, with
// one worker per node, attempt 0's values), never this worker's. Seed generators and read the
// launcher's variables in train_main (or lazily, on first use after it started), not in statics.
// Plain C++: no LibTorch needed (target ctrun::worker).
#pragma once

#include <cstdint>

namespace ctrun::worker {

using MainFunction = int (*)(int argc, char** argv);

// The note CTRUN_MAIN places and ctrun reads (one owner of the format: this header).
inline constexpr char kWarmNoteOwner[] = "ctrun";  // n_namesz 6, padded to 8
inline constexpr uint32_t kWarmNoteType = 0x6d726177;  // "warm"
// 2: the worker spec places its fds by "fd_targets" and closes "closed_fds" (1: fds 0-2 always
// passed, then "extra_fd_target"). A binary of another version starts cold.
inline constexpr uint32_t kWarmProtocolVersion = 2;
// The variable ctrun starts the server with: "<control fd>:<ctrun's pid>".
inline constexpr char kWarmServerVariable[] = "CTRUN_WARM_SERVER";

struct WarmNote {
  uint32_t namesz, descsz, type;
  char name[8];
  uint32_t version;
};

// What CTRUN_MAIN's main() runs: `fn(argc, argv)`, or the warm server (which never returns in the
// server; its forked workers return fn's exit code here and main returns it). `after_fork` runs in
// each forked worker before fn (the LibTorch reseed); may be null.
int warm_main(int argc, char** argv, MainFunction fn, void (*after_fork)());

#if defined(CTRUN_WITH_TORCH)
// Defined in ctrun::worker_torch: reseeds LibTorch's default CPU generator from fresh entropy.
void torch_warm_child();
#define CTRUN_WARM_AFTER_FORK_ &::ctrun::worker::torch_warm_child
#else
#define CTRUN_WARM_AFTER_FORK_ nullptr
#endif

}  // namespace ctrun::worker

#define CTRUN_MAIN(fn)                                                                                    \
  __attribute__((section(".note.ctrun.warm"), used, aligned(4))) static const ::ctrun::worker::WarmNote \
      ctrun_warm_note_ = {6, 4, ::ctrun::worker::kWarmNoteType, "ctrun",                                 \
                          ::ctrun::worker::kWarmProtocolVersion};                                         \
  int main(int argc, char** argv) { return ::ctrun::worker::warm_main(argc, argv, &(fn), CTRUN_WARM_AFTER_FORK_); }
