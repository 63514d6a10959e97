#include "agent/dry_run.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "agent/rank_plan.h"
#include "agent/store_bind_error.h"
#include "cli/value_parsers.h"
#include "ctrun/heartbeat.h"
#include "health/health_monitor.h"

namespace ctrun {
namespace {

constexpr const char* kFreePort = "<free port chosen at start>";
constexpr const char* kRendezvous = "<decided by the rendezvous>";

// What every worker of the first attempt shares; values known only at start are 0/"" here and
// replaced by placeholders in Placeholders().
AttemptInfo FirstAttempt(const LaunchConfig& config) {
  AttemptInfo info;
  info.restart_count = 0;
  info.use_agent_store = config.agent_store;
  if (!config.rdzv.multi_node) {
    const StoreBindContext where = SingleNodeStoreAddress(config);  // as the run binds it
    info.master_addr = where.host;
    info.master_port = where.port;
  }
  for (int i = 0; i < config.nproc_per_node; ++i) info.error_files.push_back("");
  return info;
}

// NAME -> shown value for variables only known at start.
std::map<std::string, std::string> Placeholders(const LaunchConfig& config, const AttemptInfo& info, int local_rank) {
  std::map<std::string, std::string> p;
  if (config.rdzv.multi_node) {
    p["MASTER_ADDR"] = kRendezvous;
    p["MASTER_PORT"] = kRendezvous;
  } else if (info.master_port == 0) {
    p["MASTER_PORT"] = kFreePort;
  }
  const bool no_files = config.log_dir && *config.log_dir == "/dev/null";
  p["TORCHELASTIC_ERROR_FILE"] = no_files ? "" : "<log dir>/attempt_0/" + std::to_string(local_rank) + "/error.json";
  return p;
}

}  // namespace

std::string ShellQuote(const std::string& word) {
  static constexpr const char* kSafe =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_@%+=:,./-";
  if (!word.empty() && word.find_first_not_of(kSafe) == std::string::npos) return word;
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string FormatDryRun(const LaunchConfig& config, const Environment& base_env, const std::string& executable,
                         const std::string& hostname, const PlacementPlan* placement, const Environment* parent_env) {
  const Environment& parent = parent_env ? *parent_env : base_env;
  const AttemptInfo info = FirstAttempt(config);
  const bool dynamic = config.rdzv.multi_node && config.rdzv_backend != "static";
  std::string out = "ctrun dry run: nothing is started\n";
  out += "node: host=" + hostname + " node_rank=" + (dynamic ? std::string(kRendezvous) : std::to_string(config.node_rank)) +
         " nnodes=" + FormatNnodes(config.min_nodes, config.max_nodes) + " nproc_per_node=" + std::to_string(config.nproc_per_node) +
         " world_size=" + std::to_string(config.max_nodes * config.nproc_per_node) +
         " rdzv_backend=" + config.rdzv_backend + "\n";
  if (dynamic)
    out += "note: the rendezvous assigns node ranks, so the ranks below are shown as if this node were node rank " +
           std::to_string(config.node_rank) + " of " + std::to_string(config.max_nodes) + "\n";
  for (int i = 0; i < config.nproc_per_node; ++i) {
    RankPlan plan = PlanRank(config, base_env, executable, RankFor(config, i, std::nullopt), info);
    const RankPlacement* where = placement && static_cast<size_t>(i) < placement->ranks.size()
                                     ? &placement->ranks[static_cast<size_t>(i)]
                                     : nullptr;
    const bool placed = where && (!where->binding.cpus.empty() || !where->gpu.empty());
    if (placed || (placement && UnderDebugger(*placement, plan.rank))) {
      const std::string line = FormatBinding(*placement, i, plan.rank);  // "rank N (local_rank i): ..."
      plan.binding = line.substr(line.find("): ") + 3);
    }
    out += "rank " + std::to_string(plan.rank.global_rank) + " (local_rank " + std::to_string(i) + "):\n";
    std::string exec;
    for (const std::string& word : plan.argv) exec += (exec.empty() ? "" : " ") + ShellQuote(word);
    out += "  exec: " + exec + "\n";
    const std::map<std::string, std::string> placeholders = Placeholders(config, info, i);
    std::vector<std::string> env_lines;
    for (const std::string& entry : plan.env.Entries()) {
      const size_t eq = entry.find('=');
      const std::string name = entry.substr(0, eq), value = entry.substr(eq + 1);
      const std::string* before = parent.Get(name);
      if (before && *before == value) continue;  // inherited unchanged
      auto ph = placeholders.find(name);
      env_lines.push_back(name + "=" + (ph != placeholders.end() ? ph->second : ShellQuote(value)));
    }
    // Set at spawn by the health monitor, with the channel it opens.
    if (config.heartbeat_timeout > 0) {
      env_lines.push_back(std::string(worker::kHeartbeatFdVariable) + "=" +
                          std::to_string(health::HealthMonitor::kHeartbeatFd));
      env_lines.push_back(std::string(worker::kHeartbeatIdVariable) + "=<st_dev>:<st_ino> of that socket");
    }
    std::sort(env_lines.begin(), env_lines.end());
    for (const std::string& line : env_lines) out += "  env: " + line + "\n";
    out += "  binding: " + (plan.binding.empty() ? std::string("none") : plan.binding) + "\n";
  }
  return out;
}

}  // namespace ctrun
