#include "agent/worker_env.h"

#include <utility>

#include "agent/run_path.h"
#include "base/py_template.h"
#include "ctrun/heartbeat.h"
#include "gpu/visible_devices.h"

namespace ctrun {
namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::string OmpNotice(const LaunchConfig& config, const Environment& base_env) {
  if (config.nproc_per_node <= 1 || base_env.Has("OMP_NUM_THREADS")) return "";
  return "OMP_NUM_THREADS is not set: using OMP_NUM_THREADS=1 for each worker (torchrun's default); "
         "set it to tune CPU threads per worker";
}

std::string FileTimerWarning(const Environment& base_env) {
  const std::string* v = base_env.Get("TORCHELASTIC_ENABLE_FILE_TIMER");
  if (!v || *v != "1") return "";
  return "TORCHELASTIC_ENABLE_FILE_TIMER=1: ctrun runs no file timer server, so workers get no "
         "TORCHELASTIC_TIMER_FILE; for hung workers use --heartbeat-timeout or --output-timeout";
}

Environment BuildWorkerEnv(const LaunchConfig& config, const Environment& base_env, const RankInfo& rank,
                           const AttemptInfo& attempt) {
  Environment env = base_env;
  // The agents' secrets are not the workers' business: the rendezvous token would let any worker
  // (or anything it runs) speak for an agent, and workers never talk to the rendezvous store.
  env.Unset("CTRUN_RDZV_TOKEN");
  env.Unset("CTRUN_ETCD_PASSWORD");
  auto set = [&](std::string_view k, std::string v) { env.Set(k, std::move(v)); };
  set("LOCAL_RANK", config.virtual_local_rank ? "0" : std::to_string(rank.local_rank));
  set("RANK", std::to_string(rank.global_rank));
  set("GROUP_RANK", std::to_string(rank.group_rank));
  set("ROLE_RANK", std::to_string(rank.role_rank));
  set("ROLE_NAME", config.role);
  set("LOCAL_WORLD_SIZE", std::to_string(rank.local_world_size));
  set("WORLD_SIZE", std::to_string(rank.world_size));
  set("GROUP_WORLD_SIZE", std::to_string(rank.group_world_size));
  set("ROLE_WORLD_SIZE", std::to_string(rank.role_world_size));
  set("MASTER_ADDR", attempt.master_addr);
  set("MASTER_PORT", std::to_string(attempt.master_port));
  set("TORCHELASTIC_RESTART_COUNT", std::to_string(attempt.restart_count));
  set("TORCHELASTIC_MAX_RESTARTS", std::to_string(config.max_restarts));
  set("TORCHELASTIC_RUN_ID", config.run_id);
  set("TORCHELASTIC_USE_AGENT_STORE", attempt.use_agent_store ? "True" : "False");
  // NCCL's async error handling on, as torchrun does, under both names: torch >= 2.2 reads
  // TORCH_NCCL_ASYNC_ERROR_HANDLING, 1.13 the old name (and 2.2+ warns once per rank that it is
  // set). A user who sets either name decides for both: the other is not added, so exporting
  // TORCH_NCCL_ASYNC_ERROR_HANDLING=1 silences that warning, and =0 is not overridden by a 1.
  if (!env.Has("TORCH_NCCL_ASYNC_ERROR_HANDLING") && !env.Has("NCCL_ASYNC_ERROR_HANDLING")) {
    set("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
    set("NCCL_ASYNC_ERROR_HANDLING", "1");
  }
  // A heartbeat channel is the health monitor's to give (CTRUN_HEARTBEAT_FD and its identity
  // CTRUN_HEARTBEAT_ID, health_monitor.h): one in ctrun's own environment (a ctrun run under
  // ctrun) names none of the worker's fds.
  env.Unset(worker::kHeartbeatFdVariable);
  env.Unset(worker::kHeartbeatIdVariable);
  const std::string error_file =
      static_cast<size_t>(rank.local_rank) < attempt.error_files.size() ? attempt.error_files[rank.local_rank] : "";
  set("TORCHELASTIC_ERROR_FILE", error_file);
  if (config.nproc_per_node > 1 && !env.Has("OMP_NUM_THREADS")) set("OMP_NUM_THREADS", "1");
  // torchrun runs every script as `python -u`: unbuffered, so a worker's lines reach the console as
  // it prints them and are not lost when it is killed. A script exec'd by its python #! line gets
  // no -u; the variable is Python's own spelling of it (an empty value reads as unset to Python).
  if (config.python_shebang_entrypoint) {
    const std::string* v = env.Get("PYTHONUNBUFFERED");
    if (v == nullptr || v->empty()) set("PYTHONUNBUFFERED", "1");
  }
  if (config.virtual_local_rank) {
    // Narrow each worker to its own device: the local_rank-th visible one, or "local_rank".
    std::string visible = std::to_string(rank.local_rank);
    if (const std::string* list = env.Get("CUDA_VISIBLE_DEVICES")) {
      const std::vector<std::string> items = SplitCommas(*list);
      if (static_cast<size_t>(rank.local_rank) < items.size()) visible = items[rank.local_rank];
    }
    set("CUDA_VISIBLE_DEVICES", visible);
  }
  return env;
}

bool UsesPython(const LaunchConfig& config) {
  if (config.run_path) return true;  // before --no_python, as torchrun decides
  if (config.no_python) return false;
  return config.module || config.python_text_entrypoint || EndsWith(config.entrypoint, ".py");
}

std::vector<std::string> BuildWorkerArgv(const LaunchConfig& config, const std::string& executable,
                                         const RankInfo& rank, const AttemptInfo& attempt) {
  std::vector<std::string> argv;
  if (UsesPython(config)) {
    argv.push_back(executable);
    argv.push_back("-u");
    if (config.module) argv.push_back("-m");
    if (config.run_path) {
      argv.push_back("-c");
      argv.push_back(kRunPathBootstrap);
    }
  }
  // torchrun's one macro, ${local_rank} (or $local_rank), through string.Template's
  // safe_substitute as torchrun does; --expand-placeholders adds ctrun's.
  const TemplateLookup lookup = [&](std::string_view name) -> std::optional<std::string> {
    if (name == "local_rank") return std::to_string(rank.local_rank);
    if (!config.expand_placeholders) return std::nullopt;
    if (name == "rank") return std::to_string(rank.global_rank);
    if (name == "world_size") return std::to_string(rank.world_size);
    if (name == "master_addr") return attempt.master_addr;
    if (name == "master_port") return std::to_string(attempt.master_port);
    return std::nullopt;
  };
  const auto substituted = [&](const std::string& a) { return a.find('$') == std::string::npos ? a : SafeSubstitute(a, lookup); };
  // Under Python the script (or module) is one of the interpreter's arguments, which torchrun
  // substitutes too; a program run directly is not.
  argv.push_back(UsesPython(config) ? substituted(config.entrypoint) : config.entrypoint);
  for (const auto& a : config.args) argv.push_back(substituted(a));
  return argv;
}

}  // namespace ctrun
