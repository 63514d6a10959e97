// --dry-run: what ctrun would start on this node, printed instead of started. The text is stable
// (docs/ci.md; scripts may parse it):
//
//   ctrun dry run: nothing is started
//   node: host=<h> node_rank=<n> nnodes=<min[:max]> nproc_per_node=<n> world_size=<w> rdzv_backend=<b>
//   [note: <one line per caveat, e.g. ranks decided by the rendezvous>]
//   rank <global> (local_rank <l>):
//     exec: <argv, each word shell-quoted when it needs it>
//     env: NAME=VALUE          one line per variable ctrun sets or changes, sorted by name;
//                              VALUE shell-quoted when it needs it
//     binding: <binding, or "none">
//
// A value known only once the run starts is written as <...> (unquoted): MASTER_PORT for a free
// port, TORCHELASTIC_ERROR_FILE inside the log dir not yet created, and multi-node rendezvous
// results. The ranks come from agent/rank_plan.h, the same plans the agent starts.
#pragma once

#include <string>

#include "base/environment.h"
#include "config/launch_config.h"
#include "placement/placement.h"

namespace ctrun {

// placement: the planned GPU/CPU binding per local rank (nullptr: none planned). base_env: the
// workers' common environment (with what the GPU probe set); parent_env: ctrun's own, against
// which "adds or changes" is told (nullptr: base_env).
std::string FormatDryRun(const LaunchConfig& config, const Environment& base_env, const std::string& executable,
                         const std::string& hostname, const PlacementPlan* placement = nullptr,
                         const Environment* parent_env = nullptr);

// A word as a POSIX shell reads it back: unchanged when it only has [A-Za-z0-9_@%+=:,./-] and
// is not empty, else in single quotes (a ' as '\'').
std::string ShellQuote(const std::string& word);

}  // namespace ctrun
