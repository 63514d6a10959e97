#include "cli/cli.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <map>
#include <string_view>
#include <utility>

#include <CLI/CLI.hpp>

#include "cli/value_parsers.h"
#include "process/exit_status.h"

#ifndef CTRUN_VERSION
#define CTRUN_VERSION "0.1.0"
#endif

namespace ctrun {
namespace {

constexpr int kUsageExitCode = 2;
constexpr const char* kUsageLines =
    "Usage: ctrun [OPTIONS] ENTRYPOINT [ARGS...]\n"
    "       ctrun [OPTIONS] -m MODULE [ARGS...]\n";

enum class Kind { kValue, kFlag };
// kCtrun and kHealth: ctrun's extensions. An abbreviation that also matches a torchrun option means
// that option (AbbreviationTier: --he is --help, --max is --max_restarts, as in torchrun).
enum class Group { kNodes, kWorkers, kEntrypoint, kLogs, kSignals, kCtrun, kHealth };

// One command-line option. Long spellings are derived from `dest`: "--" + dest with '_' -> '-',
// and "--" + dest itself (torchrun 2.x accepts both); the same for `alias`.
struct OptionDef {
  std::string_view dest;
  char short_name;          // '\0' when none
  Kind kind;
  std::string_view env;     // fallback environment variable, "" when none
  std::string_view metavar;  // '|'-separated alternatives: UPPERCASE ones are placeholders (N, MAP),
                             // the others literal values (the choices; all that is accepted when
                             // there is no placeholder, checked by CheckChoice)
  std::string_view default_text;  // for --help; "" when there is no default worth showing
  Group group;
  std::string_view help;
  std::string_view alias = {};  // a second dest-like name (ctrun: run_id for rdzv_id)
};

// The table: what ctrun accepts, and the source of --help. Order within a group = order in help.
constexpr std::array kOptions = {
    // --- Nodes & rendezvous ---
    OptionDef{"nnodes", 0, Kind::kValue, "PET_NNODES", "N|MIN:MAX", "1:1", Group::kNodes,
              "Number of nodes, or a MIN:MAX range for an elastic job (c10d or etcd rendezvous)."},
    OptionDef{"rdzv_backend", 0, Kind::kValue, "PET_RDZV_BACKEND", "static|c10d|etcd|etcd-v2", "static", Group::kNodes,
              "Rendezvous backend: static (fixed nodes, node rank 0 hosts the store), c10d (ctrun's "
              "own, on its TCP store; elastic), etcd or etcd-v2 (etcd's v3 API; elastic)."},
    OptionDef{"rdzv_endpoint", 0, Kind::kValue, "PET_RDZV_ENDPOINT", "HOST[:PORT]", "", Group::kNodes,
              "Rendezvous endpoint. c10d: the store, default port 29400 (port 0: any free port, "
              "one node only, as --standalone); etcd: one or more "
              "HOST[:PORT] separated by commas, default port 2379; static with none given: "
              "MASTER_ADDR:MASTER_PORT."},
    OptionDef{"rdzv_id", 0, Kind::kValue, "PET_RDZV_ID", "ID", "none", Group::kNodes,
              "Job id shared by all nodes; becomes TORCHELASTIC_RUN_ID. --run-id is a ctrun alias.",
              "run_id"},
    OptionDef{"rdzv_conf", 0, Kind::kValue, "PET_RDZV_CONF", "K=V,...", "", Group::kNodes,
              "Rendezvous settings: join_timeout (600), last_call_timeout (30), "
              "keep_alive_interval (5), keep_alive_max_attempt (3), read_timeout (60), is_host, "
              "close_timeout, timeout (static: the join timeout, 900), etcd_prefix, protocol, cacert, cert, key "
              "(or etcd-v2's ca_cert, ssl_cert, ssl_cert_key), username, rank (taken, unused: --node_rank "
              "decides, as in torchrun)."},
    OptionDef{"standalone", 0, Kind::kFlag, "PET_STANDALONE", "", "", Group::kNodes,
              "Single-node job: the workers' store listens on a free loopback port (MASTER_ADDR "
              "127.0.0.1, or --local-addr) and the run id is random unless --rdzv-id is given. "
              "--rdzv-backend, --rdzv-endpoint, --master-addr and --master-port are ignored; "
              "--rdzv-conf is checked; --nnodes must be 1 and --node-rank 0."},
    OptionDef{"node_rank", 0, Kind::kValue, "PET_NODE_RANK", "N", "0", Group::kNodes,
              "Rank of this node, 0..nnodes-1 (static rendezvous; c10d and etcd assign ranks)."},
    OptionDef{"master_addr", 0, Kind::kValue, "PET_MASTER_ADDR", "ADDR", "127.0.0.1", Group::kNodes,
              "Address of the rank-0 node (static rendezvous without --rdzv-endpoint); node rank 0 "
              "hosts the store there, so it must be one of its addresses. IPv6 as [::1] or ::1."},
    OptionDef{"master_port", 0, Kind::kValue, "PET_MASTER_PORT", "PORT", "29500", Group::kNodes,
              "Port on the rank-0 node (static rendezvous without --rdzv-endpoint), 1-65535."},
    OptionDef{"local_addr", 0, Kind::kValue, "PET_LOCAL_ADDR", "ADDR", "", Group::kNodes,
              "Address of this node: with c10d, etcd or a multi-node static job, how the other nodes "
              "reach it and MASTER_ADDR when it hosts rank 0 (default: the local address that routes "
              "to the rendezvous endpoint, else the host name); with --standalone, MASTER_ADDR and "
              "where the store listens (default 127.0.0.1). Unused by a single-node static job "
              "(MASTER_ADDR is --master-addr). IPv6 as [::1] or ::1."},
    // --- Workers ---
    OptionDef{"nproc_per_node", 0, Kind::kValue, "PET_NPROC_PER_NODE", "N|cpu|gpu|auto", "1", Group::kWorkers,
              "Workers per node: a count; cpu (one per CPU this process may run on: its affinity); gpu (one per visible GPU, counted at run "
              "time through NVML, else /proc/driver/nvidia or sysfs, after CUDA_VISIBLE_DEVICES and "
              "--gpus; an error when there is none; a list of several MIG instances counts 1 unless --virtual-local-rank); "
              "auto (gpu when there are GPUs, else cpu)."},
    OptionDef{"max_restarts", 0, Kind::kValue, "PET_MAX_RESTARTS", "N", "0", Group::kWorkers,
              "Restarts of the whole worker group allowed before the job fails."},
    OptionDef{"monitor_interval", 0, Kind::kValue, "PET_MONITOR_INTERVAL", "SECONDS", "0.1", Group::kWorkers,
              "Accepted for compatibility, and unused: ctrun is event-driven. It learns of a worker's "
              "exit the moment it happens (pidfd/signalfd), so there is no polling interval and "
              "failure detection is immediate. The value must still be a number > 0."},
    OptionDef{"start_method", 0, Kind::kValue, "PET_START_METHOD", "spawn|fork|forkserver", "spawn",
              Group::kWorkers,
              "Accepted for compatibility (torchrun uses it only for --run-path's workers, which it "
              "starts as multiprocessing children); ctrun starts every worker as a process of its own."},
    OptionDef{"role", 0, Kind::kValue, "PET_ROLE", "NAME", "default", Group::kWorkers,
              "Role of the workers: ROLE_NAME, and the console prefix [<role><local_rank>]:."},
    OptionDef{"numa_binding", 0, Kind::kValue, "", "node|socket|exclusive|core-complex", "", Group::kWorkers,
              "Bind each worker to the CPUs near its GPU (from the GPU's PCI locality, planned with "
              "hwloc, applied before exec): node = its NUMA node; socket = its package; exclusive = an "
              "even share of the node's physical cores, no two workers on one core; core-complex = "
              "one L3 cache of the node per worker. Needs a GPU per worker."},
    OptionDef{"virtual_local_rank", 0, Kind::kFlag, "PET_VIRTUAL_LOCAL_RANK", "", "", Group::kWorkers,
              "Every worker gets LOCAL_RANK=0 and only its own GPU in CUDA_VISIBLE_DEVICES."},
    OptionDef{"event_log_handler", 0, Kind::kValue, "PET_EVENT_LOG_HANDLER", "null|console|dynamic_rendezvous", "null", Group::kWorkers,
              "Accepted for compatibility: torchrun's agent event handler, null, console or "
              "dynamic_rendezvous; ctrun prints no torchrun events (console: one warning) and writes "
              "its own with --events-file."},
    // --- Entrypoint ---
    OptionDef{"module", 'm', Kind::kFlag, "PET_MODULE", "", "", Group::kEntrypoint,
              "Run the entrypoint as a Python module: python -u -m MODULE ARGS."},
    OptionDef{"no_python", 0, Kind::kFlag, "PET_NO_PYTHON", "", "", Group::kEntrypoint,
              "Execute the entrypoint directly, without python. (ctrun runs any entrypoint whose name "
              "does not end in .py directly anyway.) Not together with -m."},
    OptionDef{"run_path", 0, Kind::kFlag, "PET_RUN_PATH", "", "", Group::kEntrypoint,
              "Run the script through runpy.run_path, as torchrun does: an uncaught exception is "
              "written to the worker's error file without @record. Python even with --no-python; not "
              "together with -m."},
    // --- Logs ---
    OptionDef{"log_dir", 0, Kind::kValue, "PET_LOG_DIR", "DIR", "", Group::kLogs,
              "Base directory for the workers' log files (default, and when empty: a fresh /tmp directory; "
              "/dev/null: no files, refused with --redirects of a stream not also tee'd)."},
    OptionDef{"redirects", 'r', Kind::kValue, "PET_REDIRECTS", "0|1|2|3|MAP", "0", Group::kLogs,
              "Send worker output to files in the log dir instead of the console: 0 none, 1 stdout, "
              "2 stderr, 3 both, or a MAP per local rank, e.g. 0:3,1:2."},
    OptionDef{"tee", 't', Kind::kValue, "PET_TEE", "0|1|2|3|MAP", "0", Group::kLogs,
              "Like --redirects, but also keep writing to the console, with a prefix."},
    OptionDef{"local_ranks_filter", 0, Kind::kValue, "PET_LOCAL_RANKS_FILTER", "RANKS", "", Group::kLogs,
              "Only show these local ranks' output on the console, e.g. 0,1 or 0-3 (log files are "
              "unaffected)."},
    OptionDef{"duplicate_stdout_filters", 0, Kind::kValue, "PET_DUPLICATE_STDOUT_FILTERS", "FILTERS", "",
              Group::kLogs,
              "Also copy every worker stdout line containing any of these comma-separated strings "
              "(',,' is a literal comma), prefixed with its rank, to <log dir>/<run>/attempt_<n>/"
              "filtered_stdout.log, one file for all ranks."},
    OptionDef{"duplicate_stderr_filters", 0, Kind::kValue, "PET_DUPLICATE_STDERR_FILTERS", "FILTERS", "",
              Group::kLogs, "The same for stderr, to filtered_stderr.log."},
    OptionDef{"logs_specs", 0, Kind::kValue, "", "NAME", "", Group::kLogs,
              "torchrun's LogsSpecs plugin (a Python entry point): only 'default', torchrun's own "
              "layout, which ctrun writes."},
    // --- Signals & shutdown ---
    OptionDef{"signals_to_handle", 0, Kind::kValue, "PET_SIGNALS_TO_HANDLE", "SIGNALS",
              "SIGTERM,SIGINT,SIGHUP,SIGQUIT", Group::kSignals,
              "Signals that stop the job: ctrun forwards them to every worker's process group, waits "
              "up to the shutdown timeout, and exits 128+signal. Each is followed by SIGCONT, so a "
              "stopped worker acts on it at once."},
    OptionDef{"shutdown_timeout", 0, Kind::kValue, "PET_SHUTDOWN_TIMEOUT", "SECONDS", "30", Group::kSignals,
              "Grace period between SIGTERM and SIGKILL when workers are stopped. Without the flag: "
              "PET_SHUTDOWN_TIMEOUT, then TORCH_ELASTIC_SHUTDOWN_TIMEOUT, then 30."},
    // --- ctrun extensions ---
    OptionDef{"forward_signals", 0, Kind::kValue, "", "SIGNALS|none", "SIGUSR1,SIGUSR2", Group::kCtrun,
              "Signals forwarded to every worker without stopping the job (e.g. SLURM's pre-emption "
              "warning). A default one named in --signals-to-handle stops the job instead; naming a "
              "signal in both flags is an error."},
    OptionDef{"log_prefix", 0, Kind::kValue, "", "TEMPLATE|rank|none|inherit", "", Group::kCtrun,
              "Prefix of worker lines on the console; ${rank}, ${local_rank}, ${role_name}, ${host}, "
              "${node_rank} and ${world_size} are replaced. 'rank': the default prefix below, also into "
              "a pipe or a file; 'none': whole lines, no prefix; 'inherit': workers write to the console "
              "directly (torchrun's behaviour). Without it: TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, else "
              "torchrun's [<role><local_rank>]: with --tee, else [r<rank>] padded to the world size (and "
              "the host in multi-node jobs) where ctrun's stdout or stderr is a terminal, and no prefix, as "
              "under torchrun, where it is a pipe or a file."},
    OptionDef{"ranks_filter", 0, Kind::kValue, "", "RANKS", "", Group::kCtrun,
              "Only show these global ranks' output on the console, e.g. 0,8 or 0-7."},
    OptionDef{"tty", 0, Kind::kValue, "CTRUN_TTY", "auto|always|never", "auto", Group::kCtrun,
              "Give each worker whose output goes to the console a pseudo-terminal as stdout (it "
              "line-buffers, isatty() is true, it sees the window size less the prefix): auto, when "
              "ctrun's stdout is a terminal; always; never (pipes). Stderr stays a pipe. Whatever this "
              "says, when ctrun's stdin is a terminal local rank 0 reads what is typed there (pdb, "
              "input()) and the other ranks /dev/null, and Ctrl-Z suspends the whole job."},
    OptionDef{"log_level", 0, Kind::kValue, "CTRUN_LOG_LEVEL", "trace|debug|info|warning|error|off", "info",
              Group::kCtrun, "How much ctrun says about itself (warn means warning; any case)."},
    OptionDef{"no_agent_store", 0, Kind::kFlag, "", "", "", Group::kCtrun,
              "Do not host the workers' TCPStore in ctrun (TORCHELASTIC_USE_AGENT_STORE=False); the "
              "same as TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1."},
    OptionDef{"max_run_time", 0, Kind::kValue, "", "SECONDS", "", Group::kCtrun,
              "Job deadline, counted from ctrun's start: then stop every worker the usual way "
              "(SIGTERM, --shutdown-timeout, SIGKILL), name the ranks still running and exit 124, "
              "like timeout(1). Multi-node: every agent enforces its own; the first to fire ends "
              "the job with 124 on every node."},
    OptionDef{"dry_run", 0, Kind::kFlag, "", "", "", Group::kCtrun,
              "Check everything, print each rank's command line, the environment ctrun adds or "
              "changes, and its binding; start nothing and exit 0."},
    OptionDef{"summary_file", 0, Kind::kValue, "", "PATH", "", Group::kCtrun,
              "Write the outcome as JSON to PATH when ctrun ends (exit code and its kind, root "
              "cause, attempts, every rank's exit, durations), atomically, also for usage errors."},
    OptionDef{"events_file", 0, Kind::kValue, "", "PATH", "", Group::kCtrun,
              "Append one JSON line per event (attempt and worker starts, exits, stops, restarts, "
              "rendezvous rounds, the deadline, the run's end) to PATH as it happens."},
    OptionDef{"expand_placeholders", 0, Kind::kFlag, "", "", "", Group::kCtrun,
              "Also replace ${rank}, ${world_size}, ${master_addr} and ${master_port} in ARGS per "
              "worker (torchrun replaces only ${local_rank}, and so does ctrun without this flag, so "
              "Hydra's key=${world_size} passes through). $$ gives a literal $, as in torchrun."},
    // Health: hang detection, stacks of a hung rank, restart policy (src/health/).
    OptionDef{"heartbeat_timeout", 0, Kind::kValue, "", "SECONDS", "0 (off)", Group::kHealth,
              "A rank that sends no heartbeat for this long is hung: its stacks are saved, then the job "
              "stops (and restarts, if restarts are left; else ctrun exits 124). Workers beat through CTRUN_HEARTBEAT_FD (the "
              "worker library's heartbeat(), or from Python an os.write after the README's check of "
              "CTRUN_HEARTBEAT_ID)."},
    OptionDef{"heartbeat_first_timeout", 0, Kind::kValue, "", "SECONDS", "max(600, --heartbeat-timeout)",
              Group::kHealth, "Deadline of a rank's first heartbeat (start-up, checkpoint load); until every rank of "
              "the node has beaten, no rank is judged on --heartbeat-timeout."},
    OptionDef{"output_timeout", 0, Kind::kValue, "", "SECONDS", "0 (off)", Group::kHealth,
              "A rank that writes nothing to stdout or stderr for this long is hung (for workers that "
              "cannot beat)."},
    OptionDef{"stack_timeout", 0, Kind::kValue, "", "SECONDS", "10", Group::kHealth,
              "Bound on saving a hung rank's stacks before it is stopped (native: eu-stack, else gdb; "
              "Python: gdb), and then again on saving those of the ranks silent beside it; 0 skips the capture."},
    OptionDef{"restart_backoff", 0, Kind::kValue, "", "SECONDS", "0", Group::kHealth,
              "Delay before the first restart, doubled for each further restart in a row (capped by "
              "--restart-backoff-max); back to this value after an attempt that made progress."},
    OptionDef{"restart_backoff_max", 0, Kind::kValue, "", "SECONDS", "300", Group::kHealth,
              "Longest delay between restarts (one below --restart-backoff means --restart-backoff)."},
    OptionDef{"crash_loop_limit", 0, Kind::kValue, "", "N", "3", Group::kHealth,
              "With --heartbeat-timeout: stop restarting after N attempts in a row that failed without a "
              "heartbeat step beyond the previous attempt's (a crash loop); 0 turns the guard off."},
    OptionDef{"late_exit_notice", 0, Kind::kValue, "", "SECONDS", "60", Group::kHealth,
              "When ranks have exited 0 and others are still running this long after the first, name the "
              "ones still running in a warning (again at twice the time, and so on); they are most often "
              "stuck in their end. Nothing is stopped; 0 turns it off."},
    OptionDef{"gpus", 0, Kind::kValue, "", "LIST", "all visible", Group::kCtrun,
              "Use only these GPUs, e.g. 0,2,3 or 0-3: positions among the visible GPUs (after "
              "CUDA_VISIBLE_DEVICES). Workers get CUDA_VISIBLE_DEVICES with just them; "
              "--nproc-per-node=gpu counts them."},
    OptionDef{"cpu_binding", 0, Kind::kValue, "", "numa|socket|core|none", "none", Group::kCtrun,
              "Bind workers to CPUs without GPUs: numa = the ranks spread over the NUMA nodes in "
              "blocks, each bound to one node; socket = the same over packages; core = an even, "
              "exclusive share of the physical cores each. Not with --numa-binding."},
    OptionDef{"report_bindings", 0, Kind::kFlag, "", "", "", Group::kCtrun,
              "Print each worker's CPUs, NUMA node and GPU before it starts (like mpirun "
              "--report-bindings)."},
    OptionDef{"debug_rank", 0, Kind::kValue, "", "RANK[:PORT]", "", Group::kCtrun,
              "Start global rank RANK under gdbserver listening on PORT (default: a free port, "
              "printed); the other ranks start normally. Without gdbserver on PATH the rank stops "
              "(SIGSTOP) just before exec until a debugger attaches (gdb -p PID) and continues it."},
    OptionDef{"warm", 0, Kind::kFlag, "", "", "", Group::kCtrun,
              "Start Python workers (.py, -m, --run_path) by fork from a server that imported the --warm-preload "
              "modules once, instead of a fresh interpreter each: restarts skip import torch. C++ "
              "workers built with CTRUN_MAIN (ctrun/warm_main.h) are forked from their binary started "
              "once (LibTorch loaded once). Workers look as if started cold; ctrun starts them cold, "
              "with a warning, when a rule is broken (see README, Warm starts)."},
    OptionDef{"warm_preload", 0, Kind::kValue, "", "MODULES", "torch,torch.distributed", Group::kCtrun,
              "Comma-separated modules the --warm server imports; @script adds the script's own "
              "top-level imports."},
    OptionDef{"version", 0, Kind::kFlag, "", "", "", Group::kCtrun, "Print ctrun's version and exit."},
    OptionDef{"help", 'h', Kind::kFlag, "", "", "", Group::kCtrun, "Print this help and exit."},
};

std::string Dashed(std::string_view dest) {
  std::string s(dest);
  std::replace(s.begin(), s.end(), '_', '-');
  return s;
}

// "--nproc-per-node", then "--nproc_per_node" (when different), then the alias' spellings.
std::vector<std::string> LongNames(const OptionDef& def) {
  std::vector<std::string> names;
  for (std::string_view base : {def.dest, def.alias}) {
    if (base.empty()) continue;
    names.push_back("--" + Dashed(base));
    if (base.find('_') != std::string_view::npos) names.push_back("--" + std::string(base));
  }
  return names;
}

std::string CanonicalName(const OptionDef& def) { return "--" + Dashed(def.dest); }

const OptionDef* FindShort(char c) {
  for (const OptionDef& def : kOptions)
    if (def.short_name == c) return &def;
  return nullptr;
}

const OptionDef& FindDest(std::string_view dest) {
  for (const OptionDef& def : kOptions)
    if (def.dest == dest) return def;
  std::abort();  // a dest the table lacks is a bug in this file
}

// The literal alternatives of a metavar: "N|cpu|gpu|auto" -> cpu, gpu, auto; none for "DIR".
std::vector<std::string> MetavarChoices(std::string_view metavar) {
  std::vector<std::string> choices;
  if (metavar.find('|') == std::string_view::npos) return choices;
  while (!metavar.empty()) {
    std::string_view alt = metavar.substr(0, metavar.find('|'));
    metavar.remove_prefix(std::min(metavar.size(), alt.size() + 1));
    if (std::none_of(alt.begin(), alt.end(), [](char ch) { return ch >= 'A' && ch <= 'Z'; }))
      choices.emplace_back(alt);
  }
  return choices;
}

// OK when `value` is one of the option's choices, else "expected a, b or c".
Status CheckChoice(std::string_view dest, const std::string& value) {
  std::vector<std::string> choices = MetavarChoices(FindDest(dest).metavar);
  if (std::find(choices.begin(), choices.end(), value) != choices.end()) return {};
  std::string list;
  for (size_t i = 0; i < choices.size(); ++i)
    list += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
  return Status::Error("expected " + list);
}

// A --log-level name CheckChoice accepted: the table lists the names in LogLevel's order.
LogLevel LogLevelNamed(const std::string& name) {
  const std::vector<std::string> names = MetavarChoices(FindDest("log_level").metavar);
  return static_cast<LogLevel>(std::find(names.begin(), names.end(), name) - names.begin());
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// Options of the launchers people come from, in '-' spelling, with what ctrun calls them.
struct ForeignOption {
  std::string_view name;
  std::string_view hint;
};
constexpr ForeignOption kForeignOptions[] = {
    {"--use-env", "torch.distributed.launch's; torchrun and ctrun always give LOCAL_RANK in the environment: drop it"},
    {"--num-gpus", "deepspeed's; ctrun's is --nproc-per-node, workers per node"},
    {"--num-nodes", "deepspeed's; ctrun's is --nnodes"},
    {"--num-processes", "accelerate's, counted over all nodes; ctrun's is --nproc-per-node, per node, with --nnodes"},
    {"--num-machines", "accelerate's; ctrun's is --nnodes"},
    {"--machine-rank", "accelerate's; ctrun's is --node-rank"},
    {"--main-process-ip", "accelerate's; ctrun's is --master-addr"},
    {"--main-process-port", "accelerate's; ctrun's is --master-port"},
};

// " (did you mean '--nnodes'?)" for a near miss, " (deepspeed's; ...)" for another launcher's
// option, else "".
std::string Suggestion(std::string_view name) {
  const std::string dashed = Dashed(name);
  for (const ForeignOption& f : kForeignOptions)
    if (f.name == dashed) return " (" + std::string(f.hint) + ")";
  std::string best;
  size_t best_d = 3;
  for (const OptionDef& def : kOptions)
    for (const std::string& n : LongNames(def)) {
      size_t d = EditDistance(name, n);
      if (d < best_d) best_d = d, best = n;
    }
  return best.empty() ? "" : " (did you mean '" + best + "'?)";
}

struct LongMatch {
  const OptionDef* def = nullptr;
  std::string error;  // set when unknown or ambiguous
};

// How an option ranks when an abbreviation matches several: torchrun 1.13's own (and --help)
// first, then those torchrun added in 2.x, then ctrun's, then the health group. A prefix that a
// torchrun script uses (--max for --max_restarts, --no_ for --no_python, --t for --tee) keeps
// meaning what it means in torchrun however many options ctrun adds.
int AbbreviationTier(const OptionDef& def) {
  static constexpr std::string_view kTorchrun2x[] = {"local_ranks_filter", "duplicate_stdout_filters",
                                                     "duplicate_stderr_filters", "logs_specs", "signals_to_handle",
                                                     "numa_binding", "virtual_local_rank", "event_log_handler"};
  if (def.dest == "help") return 0;
  if (def.group == Group::kHealth) return 3;
  if (def.group == Group::kCtrun) return 2;
  return std::find(std::begin(kTorchrun2x), std::end(kTorchrun2x), def.dest) != std::end(kTorchrun2x) ? 1 : 0;
}

// Exact spelling, else a unique prefix of the spellings (argparse's allow_abbrev); prefixes matching
// two spellings of the same option are not ambiguous, and among several options the one of the
// lowest AbbreviationTier wins when it is alone there.
LongMatch ResolveLong(std::string_view name) {
  std::vector<const OptionDef*> hits;
  std::vector<std::string> hit_names;
  for (const OptionDef& def : kOptions)
    for (const std::string& n : LongNames(def)) {
      if (n == name) return {&def, ""};
      if (n.size() > name.size() && n.compare(0, name.size(), name) == 0) {
        if (std::find(hits.begin(), hits.end(), &def) == hits.end()) {
          hits.push_back(&def);
          hit_names.push_back(n);
        }
      }
    }
  if (hits.size() > 1) {
    int best = 4;
    for (const OptionDef* d : hits) best = std::min(best, AbbreviationTier(*d));
    const auto at_best = [&](const OptionDef* d) { return AbbreviationTier(*d) == best; };
    if (std::count_if(hits.begin(), hits.end(), at_best) == 1) return {*std::find_if(hits.begin(), hits.end(), at_best), ""};
  }
  if (hits.size() == 1) return {hits[0], ""};
  if (hits.empty()) return {nullptr, "unrecognized option '" + std::string(name) + "'" + Suggestion(name)};
  std::string list;
  for (const std::string& n : hit_names) list += (list.empty() ? "" : ", ") + n;
  return {nullptr, "ambiguous option '" + std::string(name) + "' could match " + list};
}

bool LooksLikeNegativeNumber(std::string_view s) {
  return s.size() >= 2 && s[0] == '-' && ParseNumber(s).ok();
}

// The result of the first pass over argv: the option part normalized to "--canonical [value]"
// tokens (for CLI11), and the entrypoint with its arguments split off untouched.
struct Tokens {
  std::vector<std::string> options;       // normalized, in order
  std::map<std::string, std::string> spelled;  // dest -> the spelling the user wrote (for messages)
  std::vector<std::string> worker;        // entrypoint + args; empty when missing
  bool help = false;
  bool version = false;
  std::string error;                      // the first problem, "" when none
};

Tokens Tokenize(const std::vector<std::string>& argv) {
  Tokens t;
  auto fail = [&t](std::string e) {
    if (t.error.empty()) t.error = std::move(e);
  };
  auto add = [&t](const OptionDef& def, std::string spelled, const std::string* value) {
    if (def.dest == "help") t.help = true;
    if (def.dest == "version") t.version = true;
    t.options.push_back(CanonicalName(def));
    if (value) t.options.push_back(*value);
    t.spelled[std::string(def.dest)] = std::move(spelled);
  };
  // The value of an option that takes one and was not given it inline: the next argument, unless
  // that is missing or another option (argparse's rule; negative numbers are values).
  auto next_value = [&](size_t& i, const std::string& spelled) -> const std::string* {
    if (i + 1 >= argv.size() ||
        (argv[i + 1].size() > 1 && argv[i + 1][0] == '-' && !LooksLikeNegativeNumber(argv[i + 1]))) {
      fail("option " + spelled + " expects a value");
      return nullptr;
    }
    return &argv[++i];
  };

  for (size_t i = 1; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg == "--") {
      t.worker.assign(argv.begin() + static_cast<std::ptrdiff_t>(i) + 1, argv.end());
      return t;
    }
    if (arg.size() > 2 && arg.compare(0, 2, "--") == 0) {
      size_t eq = arg.find('=');
      std::string name = arg.substr(0, eq);
      LongMatch m = ResolveLong(name);
      if (!m.def) {
        fail(m.error);
        continue;
      }
      if (m.def->kind == Kind::kFlag) {
        if (eq != std::string::npos) fail("option " + name + " takes no value (got '" + arg + "')");
        add(*m.def, name, nullptr);
      } else if (eq != std::string::npos) {
        std::string value = arg.substr(eq + 1);
        add(*m.def, name, &value);
      } else if (const std::string* v = next_value(i, name)) {
        add(*m.def, name, v);
      }
      continue;
    }
    if (arg.size() > 1 && arg[0] == '-' && !LooksLikeNegativeNumber(arg)) {
      // A cluster of short options: "-m", "-r3", "-r=3", "-mt3", "-r 3".
      for (size_t k = 1; k < arg.size(); ++k) {
        const OptionDef* def = FindShort(arg[k]);
        std::string spelled = std::string("-") + arg[k];
        if (!def) {
          std::string e = "unrecognized option '" + spelled + "'";
          if (k == 1) {  // "-nproc_per_node=2": a long option written with one dash?
            LongMatch m = ResolveLong("-" + arg.substr(0, arg.find('=')));
            if (m.def) e += " in '" + arg + "' (did you mean '-" + arg + "'?)";
          }
          fail(e);
          break;
        }
        if (def->kind == Kind::kFlag) {
          add(*def, spelled, nullptr);
          continue;
        }
        if (k + 1 < arg.size()) {
          std::string value = arg.substr(k + 1 + (arg[k + 1] == '=' ? 1 : 0));
          add(*def, spelled, &value);
        } else if (const std::string* v = next_value(i, spelled)) {
          add(*def, spelled, v);
        }
        break;
      }
      continue;
    }
    // argparse gives the script positional a "--" right after it and drops it (torchrun
    // train.py -- --lr 1 runs train.py --lr 1); a "--" before the script already ended the
    // options, and one after that is kept.
    t.worker.assign(argv.begin() + static_cast<std::ptrdiff_t>(i), argv.end());
    if (t.worker.size() > 1 && t.worker[1] == "--") t.worker.erase(t.worker.begin() + 1);
    return t;
  }
  return t;
}

// A value and where it came from ("--nnodes", "-r", "PET_NNODES") for messages.
struct Raw {
  std::string text;
  std::string source;
};

std::string ErrorLine(const std::string& problem) {
  std::string line = "ctrun: error: " + problem;
  std::replace(line.begin(), line.end(), '\n', ' ');
  return line + "\n";
}

CliOutcome Exit(int code, std::string output, std::string error) {
  CliOutcome o;
  o.action = CliOutcome::Action::kExit;
  o.exit_code = code;
  o.output = std::move(output);
  o.error = std::move(error);
  return o;
}

CliOutcome UsageError(const std::string& problem) { return Exit(kUsageExitCode, "", ErrorLine(problem)); }

std::string Invalid(const Raw& raw, const std::string& reason) {
  return "invalid value '" + raw.text + "' for " + raw.source + ": " + reason;
}

// Turns the raw strings into a LaunchConfig, validating each; the first problem wins.
class Builder {
 public:
  Builder(std::map<std::string, Raw> values, std::map<std::string, bool> flags, const EnvLookup& env)
      : values_(std::move(values)), flags_(std::move(flags)), env_(env) {}

  // Returns "" or the problem.
  std::string Build(LaunchConfig& c, std::vector<std::string> worker) {
    Text("nnodes", [&](const Raw& r) -> Status {
      auto v = ParseNnodes(r.text);
      if (!v) return v.status();
      c.min_nodes = v->min_nodes;
      c.max_nodes = v->max_nodes;
      return {};
    });
    Text("nproc_per_node", [&](const Raw& r) -> Status {
      auto v = ParseNprocPerNode(r.text);
      if (!v) return v.status();
      c.nproc = *v;
      if (v->kind == NprocSpec::Kind::kCount) c.nproc_per_node = v->count;
      return {};
    });
    Text("rdzv_backend", [&](const Raw& r) -> Status {
      if (Status s = CheckChoice("rdzv_backend", r.text); !s.ok()) return s;
      c.rdzv_backend = r.text;
      return {};
    });
    Text("rdzv_endpoint", [&](const Raw& r) -> Status {
      c.rdzv_endpoint = r.text;
      return {};
    });
    Text("rdzv_id", [&](const Raw& r) -> Status {
      c.run_id = r.text;  // empty: main picks a random one on a single node, as torchrun does
      return {};
    });
    Text("rdzv_conf", [&](const Raw& r) -> Status {
      auto v = ParseRdzvConf(r.text);
      if (!v) return v.status();
      c.rdzv_conf = std::move(*v);
      return {};
    });
    Flag("standalone", c.standalone);
    IntAtLeast("node_rank", 0, &c.node_rank);
    c.node_rank_from_env = values_.count("node_rank") == 0 && Lookup("node_rank").has_value();
    c.nnodes_from_env = values_.count("nnodes") == 0 && Lookup("nnodes").has_value();
    Text("master_addr", [&](const Raw& r) -> Status {
      auto v = ParseAddress(r.text);
      if (!v) return v.status();
      c.master_addr = *v;
      return {};
    });
    Text("master_port", [&](const Raw& r) -> Status {
      auto v = ParsePort(r.text);
      if (!v) return v.status();
      c.master_port = *v;
      return {};
    });
    Text("local_addr", [&](const Raw& r) -> Status {
      auto v = ParseAddress(r.text);
      if (!v) return v.status();
      c.local_addr = *v;
      return {};
    });
    IntAtLeast("max_restarts", 0, &c.max_restarts);
    Seconds("monitor_interval", /*zero_ok=*/false, &c.monitor_interval);
    Text("start_method", [&](const Raw& r) -> Status {
      // argparse checks choices only on the command line, not on PET_START_METHOD (a default), and
      // torchrun never uses the method for a script: any value from the variable runs, as there.
      if (Status s = CheckChoice("start_method", r.text); !s.ok() && values_.count("start_method") != 0) return s;
      c.start_method = r.text;
      return {};
    });
    Text("role", [&](const Raw& r) -> Status {
      c.role = r.text;  // may be empty, as in torchrun (ROLE_NAME="")
      return {};
    });
    Text("numa_binding", [&](const Raw& r) -> Status {
      if (Status s = CheckChoice("numa_binding", r.text); !s.ok()) return s;
      c.numa_binding = r.text;
      return {};
    });
    Flag("virtual_local_rank", c.virtual_local_rank);
    Text("gpus", [&](const Raw& r) -> Status {
      auto v = ParseIndexList(r.text);
      if (!v) return v.status();
      c.gpus = *v;
      return {};
    });
    Text("cpu_binding", [&](const Raw& r) -> Status {
      if (Status s = CheckChoice("cpu_binding", r.text); !s.ok()) return s;
      if (!c.numa_binding.empty() && r.text != "none")
        return Status::Error("give --numa-binding (workers with GPUs) or --cpu-binding (without), not both");
      c.cpu_binding = r.text;
      return {};
    });
    Flag("report_bindings", c.report_bindings);
    Text("debug_rank", [&](const Raw& r) -> Status {
      auto v = ParseDebugRank(r.text);
      if (!v) return v.status();
      c.debug_rank = v->first;
      c.debug_port = v->second;
      return {};
    });
    Text("event_log_handler", [&](const Raw& r) -> Status {
      // torchrun's handlers (torch.distributed.elastic.events.handlers); another name is a
      // KeyError at its first event.
      if (Status s = CheckChoice("event_log_handler", r.text); !s.ok()) return s;
      c.event_log_handler = r.text;
      return {};
    });
    Flag("module", c.module);
    Flag("no_python", c.no_python);
    Flag("run_path", c.run_path);
    Text("log_dir", [&](const Raw& r) -> Status {
      if (!r.text.empty()) c.log_dir = r.text;  // torchrun treats "" like unset
      return {};
    });
    Text("redirects", [&](const Raw& r) -> Status { return NonEmpty(r, c.redirects); });
    Text("tee", [&](const Raw& r) -> Status { return NonEmpty(r, c.tee); });
    Text("local_ranks_filter", [&](const Raw& r) -> Status {
      c.local_ranks_filter = r.text;  // parsed with the other log flags (logs::ParseOutputFlags)
      return {};
    });
    Text("duplicate_stdout_filters", [&](const Raw& r) -> Status {
      c.duplicate_stdout_filters = SplitCommaEscaped(r.text);
      return {};
    });
    Text("duplicate_stderr_filters", [&](const Raw& r) -> Status {
      c.duplicate_stderr_filters = SplitCommaEscaped(r.text);
      return {};
    });
    Text("logs_specs", [&](const Raw& r) -> Status {
      // torch registers its DefaultLogsSpecs as "default": the layout ctrun writes.
      if (r.text == "default") return {};
      return Status::Error("no LogsSpecs plugin '" + r.text + "': plugins are Python entry points, and ctrun has "
                           "only torchrun's 'default' (use --log-dir, --redirects, --tee, --log-prefix)");
    });
    SignalOptions(c);
    Seconds("shutdown_timeout", /*zero_ok=*/true, &c.shutdown_timeout);
    Text("log_prefix", [&](const Raw& r) -> Status {
      if (r.text.empty()) return Status::Error("empty; use 'none' to turn the prefix off");
      c.log_prefix = r.text;
      return {};
    });
    Text("ranks_filter", [&](const Raw& r) -> Status {
      c.ranks_filter = r.text;  // parsed with the other log flags (logs::ParseOutputFlags)
      return {};
    });
    Text("tty", [&](const Raw& r) -> Status {
      if (Status s = CheckChoice("tty", r.text); !s.ok()) return s;
      c.tty = r.text == "always" ? TtyMode::kAlways : r.text == "never" ? TtyMode::kNever : TtyMode::kAuto;
      return {};
    });
    Text("log_level", [&](const Raw& r) -> Status {
      std::string level = r.text;
      std::transform(level.begin(), level.end(), level.begin(),
                     [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
      if (level == "warn") level = "warning";
      if (Status s = CheckChoice("log_level", level); !s.ok()) return s;
      c.log_level = LogLevelNamed(level);
      return {};
    });
    Flag("expand_placeholders", c.expand_placeholders);
    HealthOptions(c);
    Flag("warm", c.warm);
    Text("warm_preload", [&](const Raw& r) -> Status {
      c.warm_preload.clear();
      for (auto& m : SplitCommaEscaped(r.text))
        if (!m.empty()) c.warm_preload.push_back(m);
      return {};
    });
    bool no_agent_store = false;
    Flag("no_agent_store", no_agent_store);
    if (!no_agent_store) {
      auto v = env_("TORCH_DISABLE_SHARE_RDZV_TCP_STORE");
      no_agent_store = v && *v == "1";  // torchrun's test: exactly "1"
    }
    c.agent_store = !no_agent_store;
    Text("max_run_time", [&](const Raw& r) -> Status {
      auto v = ParseSeconds(r.text, /*zero_ok=*/false);
      if (!v) return v.status();
      c.max_run_time = *v;
      return {};
    });
    Flag("dry_run", c.dry_run);
    Text("summary_file", [&](const Raw& r) -> Status { return NonEmpty(r, c.summary_file, "give a path"); });
    Text("events_file", [&](const Raw& r) -> Status { return NonEmpty(r, c.events_file, "give a path"); });
    if (!problem_.empty()) return problem_;

    if (worker.empty())
      return "missing the entrypoint: give the training script, program or (with -m) module to run";
    c.entrypoint = std::move(worker.front());
    c.args.assign(std::make_move_iterator(worker.begin() + 1), std::make_move_iterator(worker.end()));
    if (c.entrypoint.empty()) return "the entrypoint is an empty string";
    // torchrun's --run_path takes precedence over --no_python, and would hand a module name to
    // runpy.run_path as a file.
    if (c.run_path && c.module)
      return "--run_path runs a script file through runpy.run_path: not together with -m (--module)";
    if (c.module && c.no_python)
      return "Don't use both the '--no-python' flag and the '--module' ('-m') flag at the same time.";
    return "";
  }

 private:
  // The value of `dest` from the command line, else from its environment variable(s).
  std::optional<Raw> Lookup(const std::string& dest) {
    if (auto it = values_.find(dest); it != values_.end()) return it->second;
    const OptionDef* def = nullptr;
    for (const OptionDef& d : kOptions)
      if (d.dest == dest) def = &d;
    std::vector<std::string> names;
    if (def && !def->env.empty()) names.emplace_back(def->env);
    if (dest == "shutdown_timeout") names.emplace_back("TORCH_ELASTIC_SHUTDOWN_TIMEOUT");
    for (const std::string& n : names)
      if (auto v = env_(n)) return Raw{*v, n};
    return std::nullopt;
  }

  // An integer option that must be >= min.
  void IntAtLeast(const std::string& dest, int min, int* out) {
    Text(dest, [=](const Raw& r) -> Status {
      auto v = ParseInt(r.text);
      if (!v) return v.status();
      if (*v < min) return Status::Error("must be >= " + std::to_string(min));
      *out = *v;
      return {};
    });
  }
  // A number of seconds: > 0, or >= 0 when zero_ok.
  void Seconds(const std::string& dest, bool zero_ok, double* out) {
    Text(dest, [=](const Raw& r) -> Status {
      auto v = ParseSeconds(r.text, zero_ok);
      if (!v) return v.status();
      *out = *v;
      return {};
    });
  }

  template <typename Fn>
  void Text(const std::string& dest, Fn&& apply) {
    if (!problem_.empty()) return;
    std::optional<Raw> raw = Lookup(dest);
    if (!raw) return;
    Status s = apply(*raw);
    if (!s.ok()) problem_ = Invalid(*raw, s.message());
  }

  // A flag from the command line, else PET_<DEST>: an integer, non-zero sets it (torchrun's check_env).
  void Flag(const std::string& dest, bool& out) {
    if (!problem_.empty()) return;
    if (flags_[dest]) {
      out = true;
      return;
    }
    std::optional<Raw> raw = Lookup(dest);
    if (!raw) return;
    auto v = ParseInt(raw->text);
    if (!v) {
      problem_ = Invalid(*raw, "expected 0 or 1");
      return;
    }
    out = *v != 0;
  }

  static Status NonEmpty(const Raw& r, std::string& out, const std::string& expected = "0 means none") {
    if (r.text.empty()) return Status::Error("must not be empty (" + expected + ")");
    out = r.text;
    return {};
  }

  void HealthOptions(LaunchConfig& c) {
    Seconds("heartbeat_timeout", /*zero_ok=*/true, &c.heartbeat_timeout);
    Seconds("heartbeat_first_timeout", /*zero_ok=*/false, &c.heartbeat_first_timeout);
    Seconds("output_timeout", /*zero_ok=*/true, &c.output_timeout);
    Seconds("stack_timeout", /*zero_ok=*/true, &c.stack_timeout);
    Seconds("restart_backoff", /*zero_ok=*/true, &c.restart_backoff);
    Seconds("restart_backoff_max", /*zero_ok=*/true, &c.restart_backoff_max);
    IntAtLeast("crash_loop_limit", 0, &c.crash_loop_limit);
    Seconds("late_exit_notice", /*zero_ok=*/true, &c.late_exit_notice);
    if (!problem_.empty()) return;
    if (c.heartbeat_first_timeout > 0 && c.heartbeat_timeout == 0)
      problem_ = "--heartbeat-first-timeout needs --heartbeat-timeout";
    else if (c.heartbeat_first_timeout == 0 && c.heartbeat_timeout > 0)
      c.heartbeat_first_timeout = std::max(600.0, c.heartbeat_timeout);
  }

  void SignalOptions(LaunchConfig& c) {
    if (!problem_.empty()) return;
    c.signals_to_handle = *ParseSignalList("SIGTERM,SIGINT,SIGHUP,SIGQUIT");
    Text("signals_to_handle", [&](const Raw& r) -> Status {
      auto v = ParseSignalList(r.text);
      if (!v) return v.status();
      c.signals_to_handle = *v;
      return {};
    });
    if (!problem_.empty()) return;
    std::optional<Raw> forward = Lookup("forward_signals");
    if (!forward) {
      // The default, minus what --signals-to-handle turned into job-ending signals.
      std::vector<int> fwd = *ParseSignalList("SIGUSR1,SIGUSR2");
      std::erase_if(fwd, [&](int s) {
        return std::find(c.signals_to_handle.begin(), c.signals_to_handle.end(), s) != c.signals_to_handle.end();
      });
      c.forward_only_signals = fwd;
      return;
    }
    if (forward->text.empty() || forward->text == "none") {
      c.forward_only_signals.clear();
      return;
    }
    auto v = ParseSignalList(forward->text);
    if (!v) {
      problem_ = Invalid(*forward, v.message());
      return;
    }
    for (int s : *v)
      if (std::find(c.signals_to_handle.begin(), c.signals_to_handle.end(), s) != c.signals_to_handle.end()) {
        problem_ = Invalid(*forward, SignalName(s) + " is also in --signals-to-handle (a signal either stops "
                                                     "the job or is only forwarded)");
        return;
      }
    c.forward_only_signals = *v;
  }

  std::map<std::string, Raw> values_;
  std::map<std::string, bool> flags_;
  const EnvLookup& env_;
  std::string problem_;
};

const char* GroupTitle(Group g) {
  switch (g) {
    case Group::kNodes: return "Nodes & rendezvous";
    case Group::kWorkers: return "Workers";
    case Group::kEntrypoint: return "Entrypoint";
    case Group::kLogs: return "Logs";
    case Group::kSignals: return "Signals & shutdown";
    case Group::kCtrun: return "ctrun extensions (not in torchrun)";
    case Group::kHealth: return "Hung ranks & restart policy (ctrun extensions)";
  }
  return "";
}

// Appends `text` word-wrapped to `width` columns, every line indented by `indent` spaces, the first
// line starting at column `first_col` (already written).
void Wrap(std::string& out, std::string_view text, size_t indent, size_t first_col, size_t width = 80) {
  size_t col = first_col;
  bool line_start = true;
  while (!text.empty()) {
    size_t sp = text.find(' ');
    std::string_view word = text.substr(0, sp);
    text = sp == std::string_view::npos ? std::string_view() : text.substr(sp + 1);
    if (word.empty()) continue;
    if (!line_start && col + 1 + word.size() > width) {
      out += "\n" + std::string(indent, ' ');
      col = indent;
      line_start = true;
    }
    if (!line_start) {
      out += ' ';
      ++col;
    }
    out += word;
    col += word.size();
    line_start = false;
  }
  out += '\n';
}

// The paragraphs between the usage lines and the options (also the man page's DESCRIPTION).
constexpr std::array<std::string_view, 3> kHelpParagraphs = {
    "Starts ENTRYPOINT on this node once per worker, with torchrun's environment (RANK, LOCAL_RANK, "
    "WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), supervises it, restarts the group on failure and "
    "reports the root cause. A drop-in replacement for torchrun: its flags, defaults and PET_ "
    "variables work unchanged.",
    "ENTRYPOINT: a path ending in .py (and -m MODULE) runs under $PYTHON_EXEC, else the first python3 "
    "on PATH, with -u; so does a Python text file that is not executable or has no #! line (torchrun runs every "
    "entrypoint under Python); anything else is executed directly (--no-python: always). ARGS, and everything after ENTRYPOINT even "
    "when it looks like an option, go to the workers unchanged; '--' ends ctrun's options. "
    "${local_rank} (or $local_rank) in ARGS is replaced per worker and $$ gives $, as torchrun's "
    "string.Template does (its only placeholder; --expand-placeholders adds ${rank}, ${world_size}, "
    "${master_addr}, ${master_port}).",
    "Every --foo-bar option is also accepted as --foo_bar, and as any unique prefix (--nnode=2; a "
    "prefix of a torchrun option and of ctrun's own means the torchrun one: --max is --max_restarts). "
    "[env: PET_X] means the variable is used when the option is not given (the option wins); "
    "for on/off options PET_X=1 turns it on and PET_X=0 leaves it off."};

constexpr std::array kGroupOrder = {Group::kNodes,   Group::kWorkers, Group::kEntrypoint,
                                    Group::kLogs,    Group::kSignals, Group::kHealth, Group::kCtrun};

}  // namespace

std::string VersionText() {
  return std::string("ctrun ") + CTRUN_VERSION +
         ": follows torchrun of PyTorch 2.x (flags, defaults, PET_ variables, worker environment); "
         "workers may run torch 1.13 or later\n";
}

std::vector<OptionInfo> OptionTable() {
  std::vector<OptionInfo> table;
  for (Group g : kGroupOrder)
    for (const OptionDef& def : kOptions) {
      if (def.group != g) continue;
      OptionInfo& o = table.emplace_back();
      o.long_names = LongNames(def);
      o.short_name = def.short_name;
      o.takes_value = def.kind == Kind::kValue;
      if (o.takes_value) o.metavar = def.metavar;
      o.choices = MetavarChoices(def.metavar);
      o.default_text = def.default_text;
      o.env = def.env;
      o.group = GroupTitle(g);
      o.help = def.help;
    }
  return table;
}

std::vector<std::string> HelpParagraphs() { return {kHelpParagraphs.begin(), kHelpParagraphs.end()}; }

std::string HelpText() {
  constexpr size_t kCol = 30;
  std::string out = std::string(kUsageLines) + "\n";
  for (size_t i = 0; i < kHelpParagraphs.size(); ++i) {
    if (i > 0) out += "\n";
    Wrap(out, kHelpParagraphs[i], 0, 0);
  }
  for (Group g : kGroupOrder) {
    out += "\n";
    out += GroupTitle(g);
    out += ":\n";
    if (g == Group::kEntrypoint) {
      const std::string left = "  ENTRYPOINT [ARGS...]";
      out += left + std::string(kCol - left.size(), ' ');
      Wrap(out, "The training script or program, and its arguments.", kCol, kCol);
    }
    for (const OptionDef& def : kOptions) {
      if (def.group != g) continue;
      std::string left = "  ";
      if (def.short_name) left += std::string("-") + def.short_name + ", ";
      left += CanonicalName(def);
      if (!def.alias.empty()) left += ", --" + Dashed(def.alias);
      if (def.kind == Kind::kValue) left += " " + std::string(def.metavar);
      out += left;
      size_t col = left.size();
      if (col + 2 > kCol) {
        out += "\n" + std::string(kCol, ' ');
      } else {
        out += std::string(kCol - col, ' ');
      }
      std::string text(def.help);
      if (!def.default_text.empty()) text += " Default: " + std::string(def.default_text) + ".";
      if (!def.env.empty()) text += " [env: " + std::string(def.env) + "]";
      Wrap(out, text, kCol, kCol);
    }
  }
  out += "\nOther environment variables:\n";
  auto env_line = [&out](std::string_view name, std::string_view text) {
    out += "  ";
    out += name;
    size_t col = 2 + name.size();
    if (col + 2 > kCol) {
      out += "\n" + std::string(kCol, ' ');
    } else {
      out += std::string(kCol - col, ' ');
    }
    Wrap(out, text, kCol, kCol);
  };
  env_line("PYTHON_EXEC", "Interpreter for .py entrypoints, -m and non-executable Python files (default: "
                          "the first python3 on PATH); the choice is logged at start.");
  env_line("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "Default of --shutdown-timeout.");
  env_line("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "=1: the same as --no-agent-store.");
  env_line("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "Console line prefix template (see --log-prefix).");
  env_line("CTRUN_NO_CGROUP", "=1: do not run the workers in a cgroup v2 sub-tree of ctrun's (leftover "
                              "processes are then found through /proc).");
  env_line("OMP_NUM_THREADS", "Passed through; set to 1 for the workers when unset and there is more "
                              "than one worker, as torchrun does.");
  out += "\nExit codes:\n";
  env_line("0", "every worker succeeded.");
  env_line("N", "the root-cause worker's exit code, or 128+S when it was killed by signal S.");
  env_line("2", "usage error: bad option or value, or an entrypoint that does not exist or is not "
                "executable; nothing was started.");
  env_line("1", "ctrun could not set up the run, before any worker started: the store's address "
                "does not resolve or is not this machine's, its port is taken (the message names the "
                "holder), the log directory cannot be made; or it would not restart on GPUs the "
                "previous attempt still holds. One line on stderr says which.");
  env_line("3", "multi-node: the rendezvous failed on this node (join timeout, rendezvous store or etcd "
                "unreachable, token refused).");
  env_line("126, 127", "a worker could not be executed when it was started (e.g. a missing #! "
                       "interpreter): 126 not executable, 127 not found. No restart is attempted.");
  env_line("124", "--max-run-time was reached (the workers were stopped first), or the root cause is a rank "
                  "found hung (--heartbeat-timeout, --output-timeout).");
  env_line("128+N", "ctrun itself got signal N (e.g. 130 for SIGINT, 143 for SIGTERM); the workers were "
                    "stopped first.");
  out += "\n";
  Wrap(out, "A worker's own exit code 1, 2, 124, 126 or 127 (or 128+N) is passed through unchanged, so it looks "
            "the same as ctrun's codes above; the failure summary on stderr says which it was, and "
            "--summary-file's \"outcome\" says it without guessing.", 0, 0);
  return out;
}

EnvLookup LookupIn(const Environment& env) {
  return [&env](const std::string& name) -> std::optional<std::string> {
    if (const std::string* v = env.Get(name)) return *v;
    return std::nullopt;
  };
}

std::vector<std::string> ExplicitOptionDests(const std::vector<std::string>& argv, const EnvLookup& env) {
  const Tokens tokens = Tokenize(argv);
  std::vector<std::string> dests;
  for (const OptionDef& def : kOptions) {
    std::string dest(def.dest);
    bool given = tokens.spelled.count(dest) > 0;
    if (!given && !def.env.empty()) {
      if (std::optional<std::string> v = env(std::string(def.env))) {
        StatusOr<int> n = ParseInt(*v);
        given = def.kind == Kind::kValue || !n.ok() || *n != 0;
      }
    }
    if (given) dests.push_back(std::move(dest));
  }
  std::sort(dests.begin(), dests.end());
  return dests;
}

namespace {

// The last value of a value option among the arguments that tokenized ("" when none): lets a usage
// error still be reported in --summary-file / --events-file.
std::string LastValueOf(const Tokens& t, std::string_view dest) {
  const std::string name = CanonicalName(FindDest(dest));
  std::string value;
  for (size_t i = 0; i + 1 < t.options.size(); ++i)
    if (t.options[i] == name) value = t.options[i + 1];
  return value;
}

// A usage error that keeps the report file paths the user gave, when they could be read.
CliOutcome UsageErrorFor(const Tokens& t, const std::string& problem) {
  CliOutcome o = UsageError(problem);
  o.config.summary_file = LastValueOf(t, "summary_file");
  o.config.events_file = LastValueOf(t, "events_file");
  return o;
}

}  // namespace

std::string VersionNumber() { return CTRUN_VERSION; }

CliOutcome ParseCommandLine(const std::vector<std::string>& argv, const EnvLookup& env) {
  Tokens tokens = Tokenize(argv);
  if (argv.size() <= 1)  // a bare "ctrun": what to type, not a complaint
    return Exit(kUsageExitCode, "", std::string(kUsageLines) + "Run 'ctrun --help' for the options.\n");
  // --help wins over anything (argparse's action); --version only when the rest is valid.
  if (tokens.help) return Exit(0, HelpText(), "");
  if (!tokens.error.empty()) return UsageErrorFor(tokens, tokens.error);
  if (tokens.version) return Exit(0, VersionText(), "");

  // CLI11 binds the normalized options to their storage (last occurrence wins, like argparse).
  std::map<std::string, std::string> texts;
  std::map<std::string, CLI::Option*> opts;
  std::map<std::string, Raw> values;
  std::map<std::string, bool> flags;
  try {
    CLI::App app("ctrun", "ctrun");
    app.set_help_flag();
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    app.prefix_command();  // anything unexpected ends up in remaining(), checked below
    // Only the options the tokenizer found (it already rejected unknown ones): CLI11 checks every
    // new option's names against all the others, which for the whole table was a third of a
    // launch's user-space instructions.
    for (const OptionDef& def : kOptions) {
      std::string dest(def.dest);
      if (tokens.spelled.count(dest) == 0) continue;
      if (def.kind == Kind::kFlag) {
        opts[dest] = app.add_flag(CanonicalName(def));
      } else {
        opts[dest] = app.add_option(CanonicalName(def), texts[dest]);
      }
    }
    std::vector<std::string> args(tokens.options.rbegin(), tokens.options.rend());
    app.parse(args);
    if (!app.remaining().empty())
      return UsageErrorFor(tokens, "unexpected argument '" + app.remaining().front() + "'");
    // Read the results while `app` (which owns the Option objects) is alive.
    for (const OptionDef& def : kOptions) {
      std::string dest(def.dest);
      auto opt = opts.find(dest);
      if (opt == opts.end() || opt->second->count() == 0) continue;
      if (def.kind == Kind::kFlag) {
        flags[dest] = true;
      } else {
        values[dest] = Raw{texts[dest], tokens.spelled[dest]};
      }
    }
  } catch (const CLI::ParseError& e) {
    return UsageErrorFor(tokens, e.what());
  }

  CliOutcome outcome;
  outcome.action = CliOutcome::Action::kRun;
  Builder builder(std::move(values), std::move(flags), env);
  std::string problem = builder.Build(outcome.config, std::move(tokens.worker));
  if (!problem.empty()) return UsageErrorFor(tokens, problem);
  return outcome;
}

}  // namespace ctrun
