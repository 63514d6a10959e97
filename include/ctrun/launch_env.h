// ctrun/launch_env.h — the launcher environment of one worker, typed.
//
// Contract: LaunchEnv::from_env() reads the variables that ctrun (and torchrun / TorchElastic)
// set for every worker (the lists below) and validates them. It throws
// ctrun::worker::EnvError with a message that names the missing or malformed variable and says how
// to launch the program when the process was not started by a launcher. For debugging, when
// CTRUN_WAIT_FOR_DEBUGGER_RANK is this rank (or "all"), from_env() prints the pid and waits (up to
// 600 s) until a debugger is attached (TracerPid != 0); a value that is neither "all" nor a rank
// of the job (decimal, below WORLD_SIZE: "yes" is not rank 0) stops no rank and prints a one-line
// warning on stderr. parse() is the same logic
// over any lookup function (for tests) and reports errors through `error` instead of throwing.
//
// Required: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT.
// Optional (default): LOCAL_WORLD_SIZE (WORLD_SIZE), GROUP_RANK (0), TORCHELASTIC_RESTART_COUNT (0),
// TORCHELASTIC_MAX_RESTARTS (0), TORCHELASTIC_RUN_ID (""), TORCHELASTIC_USE_AGENT_STORE (false;
// true only for the exact string "True", as torch compares str(True)), TORCHELASTIC_ERROR_FILE ("").
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>

namespace ctrun::worker {

class EnvError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct LaunchEnv {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int group_rank = 0;
  int restart_count = 0;   // TORCHELASTIC_RESTART_COUNT: 0 on the first attempt
  int max_restarts = 0;    // TORCHELASTIC_MAX_RESTARTS
  std::string run_id;      // TORCHELASTIC_RUN_ID; empty when not launched by an elastic agent
  std::string master_addr;
  uint16_t master_port = 0;
  bool use_agent_store = false;  // every worker is a store client of MASTER_ADDR:MASTER_PORT
  std::string error_file;        // TORCHELASTIC_ERROR_FILE; empty when unset

  bool is_elastic() const { return !run_id.empty(); }
  // The key prefix torch 1.13 uses for a worker store over the agent store, one per attempt:
  // "/worker/attempt_<restart_count>". Keys of earlier attempts may still be in the agent store.
  std::string attempt_prefix() const { return "/worker/attempt_" + std::to_string(restart_count); }
  // Whether this worker hosts the TCPStore server (worker-hosted mode, rank 0 only).
  bool hosts_store() const { return !use_agent_store && rank == 0; }

  using Lookup = std::function<std::optional<std::string>(const std::string& name)>;
  // Throws EnvError.
  static LaunchEnv from_env();
  // Returns nullopt and sets *error on failure.
  static std::optional<LaunchEnv> parse(const Lookup& lookup, std::string* error);
};

}  // namespace ctrun::worker
