// Cluster environments: what ctrun derives from the scheduler it runs under, after ParseCommandLine.
//
// Contract:
//  - Slurm: inside an srun step that spans more than one node, a ctrun started once per node with no
//    node or rendezvous options gets the static-rendezvous settings torchrun would need on the command
//    line (node count, node rank, master address), read from the step's environment. Anything the user
//    chose (flag or PET_ variable) wins: then nothing is derived. Details at ApplyClusterEnv.
//  - Kubeflow PyTorchJob needs nothing here: its operator sets PET_ variables, which ParseCommandLine
//    already reads (tests/unit/cluster_env_test.cc checks the operator's exact environments).
//  - Pure: the environment is read only through `env`; nothing is opened, resolved or spawned.
#pragma once

#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "cli/cli.h"
#include "config/launch_config.h"

namespace ctrun {

// The largest number of hosts ExpandHostlist produces (Slurm's own limit per range).
inline constexpr size_t kMaxHostlistHosts = 65536;

// Expands a Slurm hostlist ("node[01-04,07],login1", as in SLURM_STEP_NODELIST) into host names, in
// Slurm's order:
//  - entries are separated by commas (or blanks) outside brackets; empty entries are skipped;
//  - a bracket group holds comma-separated numbers and LO-HI ranges (LO <= HI, digits only), each
//    printed zero-padded to the number of digits written for its LO ("[08-10]": 08 09 10; "[8-10]":
//    8 9 10);
//  - text may surround groups, and one entry may hold several ("rack[1-2]-node[1-3]"): the result is
//    every combination. The last group varies fastest, then the first, the second, and so on; the
//    next-to-last varies slowest ("r[1-2]n[1-2]" gives r1n1 r1n2 r2n1 r2n2; "a[1-2]b[1-2]c[1-2]"
//    gives a1b1c1 a1b1c2 a2b1c1 a2b1c2 a1b2c1 ...). Slurm's own lists use one group per entry.
// Errors (message = the reason only, the caller names the variable): unbalanced or nested brackets,
// an empty group or range, a non-digit in a group, a reversed range, more than kMaxHostlistHosts
// hosts in total, and a text naming no host at all.
StatusOr<std::vector<std::string>> ExpandHostlist(std::string_view text);

// The options the user chose explicitly (dest names, as in cli.cc's option table: "nnodes",
// "node_rank", "master_addr", "master_port", "rdzv_endpoint", "rdzv_backend", "standalone", ...).
struct ExplicitFlags {
  std::set<std::string> dests;
  bool Has(std::string_view dest) const { return dests.count(std::string(dest)) > 0; }
};

// The options given on the command line (argv[0] is the program; every spelling, '=' or separate
// value, unique prefixes; scanning stops at the entrypoint or "--") or through their PET_ variable (an
// on/off one only when not 0). See ExplicitOptionDests in cli.h.
ExplicitFlags DetectExplicitFlags(const std::vector<std::string>& argv, const EnvLookup& env);

// Fills in the node settings of `config` from a Slurm step, or leaves it alone.
//
// Applies only when all of these hold:
//  - SLURM_JOB_ID, SLURM_STEP_NODELIST and SLURM_NODEID are set: ctrun was started by srun. (A batch
//    script also sees SLURM_JOB_NODELIST, SLURM_NNODES and SLURM_NODEID=0, but it runs on the first
//    node only; deriving several nodes there would wait forever for the others.)
//  - the step spans more than one node (the hosts of SLURM_STEP_NODELIST);
//  - `given` holds none of nnodes, node_rank, master_addr, rdzv_endpoint, rdzv_backend, standalone.
// Then: min_nodes = max_nodes = the number of step hosts; node_rank = SLURM_NODEID; master_addr = the
// first step host (the node whose SLURM_NODEID is 0); rdzv_backend stays "static"; master_port is
// kept when the user gave one, else set to 29500 (torchrun's default; nothing is derived from the job
// id). *notice = one line saying so, e.g.
//   "slurm: 4 nodes (node[01-04]), node rank 2, master node01:29500".
// SLURM_NNODES is not used (srun --preserve-env leaves the job's count in it); SLURM_STEP_NUM_NODES,
// when set, must agree with the host count.
//
// Errors (the config is then unchanged), each naming the variable and its value: a malformed
// SLURM_STEP_NODELIST; SLURM_NODEID not an integer in [0, hosts); SLURM_STEP_NUM_NODES not equal to
// the host count; SLURM_STEP_NUM_TASKS not equal to it either (ctrun is one agent per node: the step
// must run one task per node, srun --ntasks-per-node=1).
//
// When nothing is derived, *notice is empty, except for one hint: SLURM_JOB_ID is set, srun did not
// start ctrun, the job has more than one node (SLURM_JOB_NUM_NODES, else SLURM_NNODES) and the user
// gave no node option; then *notice says ctrun runs on this node only.
Status ApplyClusterEnv(LaunchConfig* config, const EnvLookup& env, const ExplicitFlags& given,
                       std::string* notice);

}  // namespace ctrun
