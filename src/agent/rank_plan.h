// RankPlan: everything ctrun decides about one worker before it starts it: its ranks, its command
// line, its complete environment and (when one is planned) its CPU/NUMA binding and device. The
// agent starts workers from these plans and --dry-run prints them (agent/dry_run.h), so what a dry
// run shows is what a real run executes. Pure: no I/O.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "agent/worker_env.h"
#include "base/environment.h"
#include "config/launch_config.h"
#include "rendezvous/rendezvous.h"

namespace ctrun {

struct RankPlan {
  RankInfo rank;
  std::vector<std::string> argv;  // argv[0] is what is shown; the agent execs `executable`
  Environment env;                // the worker's whole environment
  // How the worker is bound ("cpus 0-7, NUMA node 0, GPU 0"): "" while ctrun plans no binding.
  // A binding planner fills it here, so the dry run and the report show it without changes.
  std::string binding;
};

// The ranks of local rank i: from the round when multi-node; otherwise group node_rank of
// max_nodes with contiguous ranks (single node: the local ranks). Role ranks count over the nodes
// of this node's --role, in node-rank order (the global ranks when every node has one role).
RankInfo RankFor(const LaunchConfig& config, int local_rank, const std::optional<rdzv::RoundInfo>& round);

RankPlan PlanRank(const LaunchConfig& config, const Environment& base_env, const std::string& executable,
                  const RankInfo& rank, const AttemptInfo& attempt);

}  // namespace ctrun
