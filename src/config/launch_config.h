// LaunchConfig: the validated, immutable description of one ctrun run. Produced by src/cli from
// argv + environment (PET_* fallbacks); consumed by the agent. Plain data: parsing never spawns,
// spawning never parses. Field comments give the torchrun flag each one mirrors.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "config/rdzv_settings.h"

namespace ctrun {

// ctrun's own diagnostics (--log-level / CTRUN_LOG_LEVEL); the CLI maps the names to these.
enum class LogLevel { kTrace, kDebug, kInfo, kWarning, kError, kOff };
enum class TtyMode { kAuto, kAlways, kNever };  // --tty

// How --nproc_per_node was given; "gpu"/"auto"/"cpu" are resolved at run time (gpu probe).
struct NprocSpec {
  enum class Kind { kCount, kCpu, kGpu, kAuto };
  Kind kind = Kind::kCount;
  int count = 1;  // valid when kind == kCount
};

struct LaunchConfig {
  // --- rendezvous / nodes -------------------------------------------------------------------
  int min_nodes = 1;                       // --nnodes N or MIN:MAX
  int max_nodes = 1;
  NprocSpec nproc;                         // --nproc_per_node
  int nproc_per_node = 1;                  // resolved count (after the gpu/cpu probe)
  std::string rdzv_backend = "static";     // --rdzv_backend (static|c10d|etcd|etcd-v2)
  std::string rdzv_endpoint;               // --rdzv_endpoint host[:port]
  std::string run_id = "none";             // --rdzv_id
  std::map<std::string, std::string> rdzv_conf;  // --rdzv_conf k=v,k=v
  bool standalone = false;                 // --standalone
  int node_rank = 0;                       // --node_rank
  bool nnodes_from_env = false;            // it came from PET_NNODES (named in errors about it)
  bool node_rank_from_env = false;         // it came from PET_NODE_RANK (a standalone job ignores it)
  std::string master_addr = "127.0.0.1";   // --master_addr
  std::optional<int> master_port;          // --master_port (29500 when static and unset)
  std::string local_addr;                  // --local_addr
  RdzvSettings rdzv;                       // typed from the flags above (rendezvous/settings.h)

  // --- worker group --------------------------------------------------------------------------
  int max_restarts = 0;                    // --max_restarts
  double monitor_interval = 0.1;           // --monitor_interval (accepted; ctrun is event-driven)
  std::string start_method = "spawn";      // --start_method (accepted; ctrun always fork/execs)
  std::string role = "default";            // --role
  double shutdown_timeout = 30.0;          // --shutdown-timeout / TORCH_ELASTIC_SHUTDOWN_TIMEOUT
  std::vector<int> signals_to_handle;      // --signals-to-handle (terminating signals, forwarded)
  std::vector<int> forward_only_signals;   // --forward-signals (ctrun: forwarded, job continues)
  bool virtual_local_rank = false;         // --virtual-local-rank
  std::string numa_binding;                // --numa-binding (node|socket|exclusive|core-complex)
  std::vector<int> gpus;                   // --gpus (ctrun): positions among the visible GPUs
  std::string cpu_binding;                 // --cpu-binding (ctrun): numa|socket|core|none
  bool report_bindings = false;            // --report-bindings (ctrun)
  std::optional<int> debug_rank;           // --debug-rank (ctrun): global rank under a debugger
  int debug_port = 0;                      // --debug-rank R:PORT; 0: a free port, chosen at start
  std::string event_log_handler = "null";  // --event-log-handler: null|console|dynamic_rendezvous (unused)

  // --- entrypoint ----------------------------------------------------------------------------
  bool module = false;                     // -m/--module
  bool no_python = false;                  // --no_python
  bool run_path = false;                   // --run_path: the script through runpy.run_path (agent/run_path.h)
  std::string entrypoint;                  // training_script
  std::vector<std::string> args;           // training_script_args (REMAINDER)
  bool expand_placeholders = false;        // --expand-placeholders (ctrun): ${rank} etc. in args too
  bool python_text_entrypoint = false;     // not from a flag: a non-executable Python text file runs
                                           // under Python (agent/launch_checks.h ClassifyEntrypoint)
  bool python_shebang_entrypoint = false;  // not from a flag: an executable script whose #! line runs
                                           // Python, exec'd by that line (ClassifyEntrypoint)

  // --- worker output and logs ----------------------------------------------------------------
  std::optional<std::string> log_dir;      // --log_dir
  std::string redirects = "0";             // -r/--redirects (Std spec)
  std::string tee = "0";                   // -t/--tee (Std spec)
  std::string local_ranks_filter;          // --local-ranks-filter
  std::vector<std::string> duplicate_stdout_filters;  // --duplicate-stdout-filters (",," = a comma)
  std::vector<std::string> duplicate_stderr_filters;  // --duplicate-stderr-filters (likewise)
  TtyMode tty = TtyMode::kAuto;            // --tty (ctrun): pty as workers' stdout
  std::string log_prefix;                  // --log-prefix (ctrun): template or "none"; "" = default
  std::string ranks_filter;                // --ranks-filter (ctrun): global ranks
  LogLevel log_level = LogLevel::kInfo;    // --log-level (ctrun's own diagnostics)

  // --- health: hang detection, stacks, restart policy (ctrun; 0 = off) -----------------------
  double heartbeat_timeout = 0;            // --heartbeat-timeout: max silence between beats
  double heartbeat_first_timeout = 0;      // --heartbeat-first-timeout: until the first beat
                                           // (0: max(600, heartbeat_timeout))
  double output_timeout = 0;               // --output-timeout: max time without worker output
  double stack_timeout = 10;               // --stack-timeout: bound on a hung rank's stack capture
  double restart_backoff = 0;              // --restart-backoff: first delay before a restart
  double restart_backoff_max = 300;        // --restart-backoff-max: cap of the doubling delay
  int crash_loop_limit = 3;                // --crash-loop-limit: attempts without progress in a
                                           // row that end the run (needs heartbeats)
  double late_exit_notice = 60;            // --late-exit-notice: ranks still running this long
                                           // after a rank exited 0 are named (then at 2x, 4x...)

  // --- the workers' store ---------------------------------------------------------------------
  bool agent_store = true;                 // ctrun hosts the workers' TCPStore (--no-agent-store)

  // --- CI and operations (ctrun) ---------------------------------------------------------------
  std::optional<double> max_run_time;      // --max-run-time SECONDS: job deadline, exit 124
  bool dry_run = false;                    // --dry-run: print each rank's plan, start nothing
  std::string summary_file;                // --summary-file PATH: the outcome as JSON ("" = none)
  std::string events_file;                 // --events-file PATH: JSON lines as things happen ("" = none)
  // --- warm starts (ctrun) ----------------------------------------------------------------------
  bool warm = false;                       // --warm: Python workers forked from a preloaded server
  std::vector<std::string> warm_preload{"torch", "torch.distributed"};  // --warm-preload
};

}  // namespace ctrun
