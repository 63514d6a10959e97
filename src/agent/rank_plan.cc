#include "agent/rank_plan.h"

namespace ctrun {

RankInfo RankFor(const LaunchConfig& config, int local_rank, const std::optional<rdzv::RoundInfo>& round) {
  RankInfo r;
  const int n = config.nproc_per_node;
  r.local_rank = local_rank;
  r.local_world_size = n;
  if (round) {
    r.global_rank = round->base_rank + local_rank;
    r.group_rank = round->node_rank;
    r.group_world_size = round->num_nodes;
    r.world_size = round->world_size;
  } else {
    r.global_rank = config.node_rank * n + local_rank;
    r.group_rank = config.node_rank;
    r.group_world_size = config.max_nodes;
    r.world_size = config.max_nodes * n;
  }
  r.role_rank = r.global_rank;
  r.role_world_size = r.world_size;
  // With a round, ranks of a role count over the nodes of that role, in node-rank order (nodes may
  // run different --role values; each role's ranks start at 0).
  if (round && static_cast<size_t>(round->node_rank) < round->nodes.size()) {
    r.role_rank = local_rank;
    r.role_world_size = 0;
    for (size_t i = 0; i < round->nodes.size(); ++i) {
      if (round->nodes[i].role != config.role) continue;
      if (static_cast<int>(i) < round->node_rank) r.role_rank += round->nodes[i].nproc;
      r.role_world_size += round->nodes[i].nproc;
    }
  }
  return r;
}

RankPlan PlanRank(const LaunchConfig& config, const Environment& base_env, const std::string& executable,
                  const RankInfo& rank, const AttemptInfo& attempt) {
  RankPlan plan;
  plan.rank = rank;
  plan.argv = BuildWorkerArgv(config, executable, rank, attempt);
  plan.env = BuildWorkerEnv(config, base_env, rank, attempt);
  return plan;
}

}  // namespace ctrun
