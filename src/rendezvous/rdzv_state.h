// RdzvState: the multi-node rendezvous as a pure, replicated state machine.
//
// Every agent of a job reads the same log of states (rendezvous_log.h) and appends new ones by
// applying the transitions below to the newest state it knows. Whoever appends entry i first wins;
// the losers re-apply their transition to the winner's state and try entry i+1. So every decision
// (who is in a round, their node ranks, that a round stops and why, the job-wide restart count,
// the job's outcome) is made exactly once and seen by every agent in the same order.
//
// Life of a job:
//   kJoin(round r) --all expected joined | max nodes | last call--> kRun(r)
//   kRun(r) --worker failure, restarts left--> kJoin(r+1)   (restarts + 1)
//   kRun(r) --node joined / left / lost------> kJoin(r+1)   (a membership change: not counted;
//                                                           a newcomer waits instead while the job
//                                                           is full or a member has succeeded)
//   kRun(r) --failure, no restarts left------> kClosed      (exit code of the root cause)
//   kRun(r) --every member succeeded---------> kClosed      (exit code 0)
//   kRun(r) --a node left / lost, every other member had succeeded--> kClosed (exit code 0)
//   kRun(r) --a member that had succeeded left / was lost-----------> kRun(r) without it
//   kJoin(r+1) after a membership change --every remaining member of round r succeeded in it
//              (a success that reached the log after the change)--> kClosed (exit code 0)
// A kJoin round remembers which nodes it `expected` (the previous round's members still alive),
// so a restart completes as soon as they are all back, without waiting for the last-call window.
// A kJoin round started by a membership change also remembers which of them may still report
// that round r succeeded on their node (`may_finish`; a failure's round does not: it restarts
// every node whatever else succeeded). A node's success and another node's leave race to the log;
// without this, a success that lost that race ran the node's finished workers again.
//
// Encoding (stored in the log): one JSON object, see Encode(). It is ctrun's own format: Python
// torchrun agents (whose state is a pickle) cannot take part in the same rendezvous.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace ctrun::rdzv {

// One agent (node) as it joined.
struct NodeDesc {
  std::string id;          // unique per agent process: "<host>/<pid>/<random hex>"
  std::string host;        // short host name, for messages
  std::string addr;        // address the other nodes (and their workers) reach this agent at
  int store_port = 0;      // this agent's workers' store for the round (served when node rank 0)
  int nproc = 1;           // its --nproc_per_node
  int declared_rank = -1;  // static backend: its --node_rank; -1 for elastic backends
  std::string role = "default";  // its --role: ROLE_RANK and ROLE_WORLD_SIZE count per role

  bool operator==(const NodeDesc&) const = default;
};

// Why a round stopped or the job failed: the root-cause worker.
struct Cause {
  std::string node_id;
  std::string host;
  int node_rank = -1;
  int rank = -1;        // global rank of the failed worker
  int local_rank = -1;
  std::string what;     // "exited with code 1", "was killed by signal 9 (SIGKILL)"
  int exit_code = 1;    // shell-style code (128+signal for a signal)
  bool fatal = false;   // no restart makes sense (the entrypoint cannot be executed)

  bool operator==(const Cause&) const = default;
  // "node 1 (host-b): rank 5 exited with code 1"
  std::string Describe() const;
};

// The job's rules. Every agent must apply the same ones: the first agent to reach the
// rendezvous writes its own into entry 0 (State::params), and an agent whose flags differ is
// refused (ParamsMismatch) instead of making decisions the others would not make.
struct Params {
  int min_nodes = 1;
  int max_nodes = 1;
  int max_restarts = 0;
  bool static_ranks = false;  // static backend: node ranks are the declared ones

  bool operator==(const Params&) const = default;
};

// "" when `mine` equals the job's; else one clause naming every flag that differs, as
// "--nnodes=2 here, 3 in the job; --max_restarts=0 here, 3 in the job" (`where` names the node
// whose flags `mine` are: "here" on that node, "there" on the job's nodes).
std::string ParamsMismatch(const Params& mine, const Params& job, std::string_view where = "here");

// A node refused because its flags differ from the job's (kRefuse), recorded in the one entry
// its refusal appends so that the job's own nodes can name it.
struct Refusal {
  std::string id;  // the refused node
  Params params;   // its flags

  bool operator==(const Refusal&) const = default;
};

// kClosed's message when every member of the last round succeeded.
inline constexpr std::string_view kEveryNodeSucceeded = "every worker on every node succeeded";

enum class Phase { kJoin, kRun, kClosed };
const char* PhaseName(Phase p);

struct State {
  uint64_t round = 0;
  Phase phase = Phase::kJoin;
  std::vector<NodeDesc> members;      // kJoin: joined so far, in arrival order; kRun: node-rank order
  std::vector<std::string> expected;  // kJoin: ids whose arrival completes the round
  std::vector<NodeDesc> waiting;      // kRun: arrived while the round was full
  std::vector<std::string> done;      // kRun: members whose workers all succeeded; kJoin: those
                                      // of may_finish that succeeded in the previous round
  std::vector<std::string> may_finish;  // kJoin after a membership change: the previous round's
                                        // remaining members (see above); empty otherwise
  int restarts = 0;                   // job-wide restart count (failures only)
  std::string reason;                 // why this round started ("" for the first)
  std::optional<Cause> cause;         // the failure that ended the previous round / the job
  int exit_code = 0;                  // kClosed: the code every agent exits with
  std::string message;                // kClosed: the agreed outcome in words
  std::string writer;                 // "<node id>#<seq>": makes every entry's value unique
  Params params;                      // the job's rules, fixed by entry 0's writer
  std::string params_from;            // that writer's node id, for messages
  std::optional<Refusal> refused;     // only in the entry a kRefuse appended; nothing else changes there

  bool operator==(const State&) const = default;
  const NodeDesc* FindMember(std::string_view id) const;
  bool IsWaiting(std::string_view id) const;
  // kJoin after a membership change: `id` may still report its success in the previous round,
  // which then counts (it is in may_finish, not yet in done).
  bool SuccessMayCount(std::string_view id) const;
  // kRun: the node rank of `id`, or -1.
  int NodeRank(std::string_view id) const;
};

struct Transition {
  enum class Kind {
    kJoin,      // node wants to be in the current/next round
    kComplete,  // the last-call window of `round` passed
    kFail,      // a worker of `round` failed on node `id` (cause)
    kSucceed,   // every worker of `round` succeeded on node `id` (accepted in kRun(round), and
                // in kJoin(round+1) from a node of its may_finish)
    kLeave,     // node `id` leaves for good (its agent got a terminating signal)
    kLost,      // node `id` stopped proving liveness
    kRefuse,    // node `id`, whose flags (`params`) differ from the job's, says so and goes
  };
  Kind kind = Kind::kJoin;
  NodeDesc node;       // kJoin
  std::string id;      // kFail, kSucceed, kLeave, kLost
  uint64_t round = 0;  // kComplete, kFail, kSucceed
  Cause cause;         // kFail
  Params params;       // kRefuse

  static Transition Join(NodeDesc n);
  static Transition Complete(uint64_t round);
  static Transition Fail(uint64_t round, std::string id, Cause cause);
  static Transition Succeed(uint64_t round, std::string id);
  static Transition Leave(std::string id);
  static Transition Lost(std::string id);
  static Transition Refuse(std::string id, Params params);
};

// The state after `t`, or nullopt when `t` changes nothing (already applied, stale round, a
// static node rank that another live node holds, the job is closed). Pure and deterministic.
// `refused` is set by kRefuse alone: every other transition's state has none.
std::optional<State> Apply(const State& s, const Transition& t, const Params& p);

// Why a join of `n` into `s` is refused right now ("" when it is not), for messages.
std::string JoinBlocker(const State& s, const NodeDesc& n, const Params& p);

std::string Encode(const State& s);
StatusOr<State> Decode(std::string_view text);

}  // namespace ctrun::rdzv
