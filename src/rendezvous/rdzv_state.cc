#include "rendezvous/rdzv_state.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>

namespace ctrun::rdzv {
namespace {

using Json = nlohmann::json;

// A field Decode cannot use; caught with the library's own errors.
struct BadField : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The integer field `key` of `j`, which must fit T. nlohmann's get<int> converts a float (44e+88,
// or 1.5) with a plain cast, undefined behaviour when it does not fit: the state comes from a
// store any peer can write, so every integer is checked before it is converted.
template <typename T>
T IntAt(const Json& j, const char* key) {
  const Json& v = j.at(key);
  if (v.is_number_unsigned() && std::in_range<T>(v.get<uint64_t>())) return static_cast<T>(v.get<uint64_t>());
  if (v.is_number_integer() && !v.is_number_unsigned() && std::in_range<T>(v.get<int64_t>()))
    return static_cast<T>(v.get<int64_t>());
  throw BadField(std::string("'") + key + "' is not an integer in range: " + v.dump());
}

bool Contains(const std::vector<std::string>& v, std::string_view id) {
  return std::find(v.begin(), v.end(), id) != v.end();
}

template <typename T, typename Pred>
bool EraseIf(std::vector<T>* v, Pred pred) {
  auto it = std::remove_if(v->begin(), v->end(), pred);
  const bool any = it != v->end();
  v->erase(it, v->end());
  return any;
}

bool EraseId(std::vector<NodeDesc>* v, std::string_view id) {
  return EraseIf(v, [&](const NodeDesc& n) { return n.id == id; });
}
bool EraseId(std::vector<std::string>* v, std::string_view id) {
  return EraseIf(v, [&](const std::string& x) { return x == id; });
}

// kRun(r) -> kJoin(r+1). `expected` are the ids whose arrival completes the new round early.
// After a membership change (not a failure), the previous round's members may still report its
// success: they become may_finish, and those that already did stay in done.
enum class NextRound { kAfterFailure, kAfterMembershipChange };
void StartNextRound(State* s, std::vector<std::string> expected, std::string reason, NextRound why) {
  s->may_finish.clear();
  if (why == NextRound::kAfterMembershipChange) {
    for (const auto& n : s->members) s->may_finish.push_back(n.id);
  } else {
    s->done.clear();
  }
  s->round += 1;
  s->phase = Phase::kJoin;
  s->members.clear();
  s->waiting.clear();
  s->expected = std::move(expected);
  s->reason = std::move(reason);
}

std::vector<std::string> Ids(const std::vector<NodeDesc>& a, const std::vector<NodeDesc>& b = {}) {
  std::vector<std::string> out;
  for (const auto& n : a) out.push_back(n.id);
  for (const auto& n : b) out.push_back(n.id);
  return out;
}

// Node-rank order of a completed round: static backends use the declared ranks; elastic ones keep
// the order of the previous round (`expected` lists it) and put newcomers after, by arrival.
void OrderMembers(State* s, const Params& p) {
  if (p.static_ranks) {
    std::stable_sort(s->members.begin(), s->members.end(),
                     [](const NodeDesc& a, const NodeDesc& b) { return a.declared_rank < b.declared_rank; });
    return;
  }
  auto key = [&](const NodeDesc& n) {
    auto it = std::find(s->expected.begin(), s->expected.end(), n.id);
    return static_cast<size_t>(it - s->expected.begin());  // newcomers: expected.size()
  };
  std::stable_sort(s->members.begin(), s->members.end(),
                   [&](const NodeDesc& a, const NodeDesc& b) { return key(a) < key(b); });
}

void CompleteRound(State* s, const Params& p) {
  OrderMembers(s, p);
  s->phase = Phase::kRun;
  s->expected.clear();
  s->done.clear();  // a late success no longer counts: the new round runs every member's workers
  s->may_finish.clear();
}

// A kJoin round completes at max nodes, or once every expected node is back (and min is met).
void MaybeComplete(State* s, const Params& p) {
  const int n = static_cast<int>(s->members.size());
  if (n >= p.max_nodes) {
    CompleteRound(s, p);
    return;
  }
  if (n < p.min_nodes || s->expected.empty()) return;
  for (const auto& id : s->expected)
    if (!s->FindMember(id)) return;
  CompleteRound(s, p);
}

void Close(State* s, int code, std::string message) {
  s->phase = Phase::kClosed;
  s->exit_code = code;
  s->message = std::move(message);
  s->expected.clear();
  s->waiting.clear();
  s->may_finish.clear();
}

// kJoin after a membership change: when every remaining member of the previous round has
// succeeded in it, the job is over (a new round would run finished workers again).
void MaybeFinish(State* s, const std::string& why) {
  if (s->phase != Phase::kJoin || s->may_finish.empty()) return;
  for (const auto& id : s->may_finish)
    if (!Contains(s->done, id)) return;
  Close(s, 0, "every worker on every remaining node succeeded (" + why + ")");
}

std::optional<State> ApplyJoin(const State& in, const NodeDesc& n, const Params& p) {
  if (in.phase == Phase::kClosed || in.FindMember(n.id) || in.IsWaiting(n.id)) return std::nullopt;
  if (!JoinBlocker(in, n, p).empty()) return std::nullopt;
  State s = in;
  if (s.phase == Phase::kJoin) {
    s.members.push_back(n);
    MaybeComplete(&s, p);
    return s;
  }
  // kRun: a newcomer. With room for it, the round is stopped so the next one includes it (a
  // membership change, not a counted restart); a full job keeps it waiting for the next round, and
  // so does a job that is finishing (a member's workers all succeeded: a new round would run them
  // again).
  if (static_cast<int>(s.members.size() + s.waiting.size()) >= p.max_nodes || !s.done.empty()) {
    s.waiting.push_back(n);
    return s;
  }
  std::vector<std::string> expected = Ids(s.members, s.waiting);
  StartNextRound(&s, std::move(expected), "node " + n.host + " joined", NextRound::kAfterMembershipChange);
  s.members.push_back(n);
  MaybeComplete(&s, p);
  return s;
}

std::optional<State> ApplyFail(const State& in, const Transition& t, const Params& p) {
  if (in.phase != Phase::kRun || in.round != t.round || !in.FindMember(t.id)) return std::nullopt;
  State s = in;
  Cause c = t.cause;
  c.node_rank = s.NodeRank(t.id);
  s.cause = c;
  if (c.fatal || s.restarts >= p.max_restarts) {
    std::string why = c.Describe();
    if (!c.fatal && p.max_restarts > 0) why += " (no restarts left, max_restarts=" + std::to_string(p.max_restarts) + ")";
    Close(&s, c.exit_code == 0 ? 1 : c.exit_code, why);
    return s;
  }
  s.restarts += 1;
  std::vector<std::string> expected = Ids(s.members, s.waiting);
  StartNextRound(&s, std::move(expected), "restart after " + c.Describe(), NextRound::kAfterFailure);
  return s;
}

std::optional<State> ApplySucceed(const State& in, const Transition& t) {
  if (Contains(in.done, t.id)) return std::nullopt;
  const bool in_run = in.phase == Phase::kRun && in.round == t.round && in.FindMember(t.id);
  const bool late = in.round == t.round + 1 && in.SuccessMayCount(t.id);
  if (!in_run && !late) return std::nullopt;
  State s = in;
  s.done.push_back(t.id);
  if (in_run && s.done.size() == s.members.size()) Close(&s, 0, std::string(kEveryNodeSucceeded));
  if (late) MaybeFinish(&s, "after " + s.reason);
  return s;
}

std::optional<State> ApplyGone(const State& in, const std::string& id, const char* how, const Params& p) {
  if (in.phase == Phase::kClosed) return std::nullopt;
  const NodeDesc* m = in.FindMember(id);
  const bool listed = m || in.IsWaiting(id) || Contains(in.expected, id);
  if (!listed) return std::nullopt;
  State s = in;
  // Which node: its host (several agents may share one) and its node rank in the round, or its id.
  std::string host = id;
  if (m) {
    const int rank = in.phase == Phase::kRun ? in.NodeRank(id) : -1;
    host = m->host + " (" + (rank >= 0 ? "node rank " + std::to_string(rank) + ", " : std::string()) + id + ")";
  }
  EraseId(&s.waiting, id);
  EraseId(&s.expected, id);
  if (s.phase == Phase::kRun && m) {
    EraseId(&s.members, id);
    // A node whose workers had all succeeded takes nothing from the others' round when it goes.
    if (EraseId(&s.done, id)) {
      if (s.done.size() == s.members.size()) Close(&s, 0, std::string(kEveryNodeSucceeded));
      return s;
    }
    // Every node left has finished its workers: the job is over, not a new round (which would
    // start those nodes' finished workers again, at a smaller size).
    if (!s.members.empty() && s.done.size() == s.members.size()) {
      Close(&s, 0, "every worker on every remaining node succeeded (node " + host + " " + how + " before its workers ended)");
      return s;
    }
    std::vector<std::string> expected = Ids(s.members, s.waiting);
    StartNextRound(&s, std::move(expected), "node " + host + " " + how, NextRound::kAfterMembershipChange);
    return s;
  }
  EraseId(&s.members, id);
  EraseId(&s.done, id);
  if (s.phase == Phase::kJoin) {
    const bool could_finish = EraseId(&s.may_finish, id);
    if (could_finish) MaybeFinish(&s, "node " + host + " " + how + " while the others had finished");
    if (s.phase == Phase::kJoin) MaybeComplete(&s, p);
  }
  return s;
}

Json NodeToJson(const NodeDesc& n) {
  Json j = {{"id", n.id}, {"host", n.host}, {"addr", n.addr}, {"port", n.store_port}, {"nproc", n.nproc}};
  if (n.declared_rank >= 0) j["rank"] = n.declared_rank;
  if (n.role != "default") j["role"] = n.role;
  return j;
}

NodeDesc NodeFromJson(const Json& j) {
  NodeDesc n;
  n.id = j.at("id").get<std::string>();
  n.host = j.at("host").get<std::string>();
  n.addr = j.at("addr").get<std::string>();
  n.store_port = IntAt<int>(j, "port");
  n.nproc = IntAt<int>(j, "nproc");
  n.declared_rank = j.contains("rank") ? IntAt<int>(j, "rank") : -1;
  if (j.contains("role")) n.role = j.at("role").get<std::string>();
  return n;
}

Json CauseToJson(const Cause& c) {
  return {{"node", c.node_id}, {"host", c.host}, {"node_rank", c.node_rank}, {"rank", c.rank},
          {"local_rank", c.local_rank}, {"what", c.what}, {"code", c.exit_code}, {"fatal", c.fatal}};
}

Cause CauseFromJson(const Json& j) {
  Cause c;
  c.node_id = j.at("node").get<std::string>();
  c.host = j.at("host").get<std::string>();
  c.node_rank = IntAt<int>(j, "node_rank");
  c.rank = IntAt<int>(j, "rank");
  c.local_rank = IntAt<int>(j, "local_rank");
  c.what = j.at("what").get<std::string>();
  c.exit_code = IntAt<int>(j, "code");
  c.fatal = j.at("fatal").get<bool>();
  return c;
}

std::optional<State> ApplyKind(const State& s, const Transition& t, const Params& p) {
  switch (t.kind) {
    case Transition::Kind::kJoin:
      return ApplyJoin(s, t.node, p);
    case Transition::Kind::kComplete: {
      if (s.phase != Phase::kJoin || s.round != t.round || static_cast<int>(s.members.size()) < p.min_nodes)
        return std::nullopt;
      State out = s;
      CompleteRound(&out, p);
      return out;
    }
    case Transition::Kind::kFail:
      return ApplyFail(s, t, p);
    case Transition::Kind::kSucceed:
      return ApplySucceed(s, t);
    case Transition::Kind::kLeave:
      return ApplyGone(s, t.id, "left", p);
    case Transition::Kind::kLost:
      return ApplyGone(s, t.id, "was lost (no heartbeat)", p);
    case Transition::Kind::kRefuse: {
      if (s.phase == Phase::kClosed) return std::nullopt;
      State out = s;
      out.refused = Refusal{t.id, t.params};
      return out;
    }
  }
  return std::nullopt;
}

Json ParamsToJson(const Params& p) {
  return {{"min", p.min_nodes}, {"max", p.max_nodes}, {"restarts", p.max_restarts}, {"static", p.static_ranks}};
}

Params ParamsFromJson(const Json& j) {
  Params p;
  p.min_nodes = IntAt<int>(j, "min");
  p.max_nodes = IntAt<int>(j, "max");
  p.max_restarts = IntAt<int>(j, "restarts");
  p.static_ranks = j.at("static").get<bool>();
  return p;
}

}  // namespace

std::string Cause::Describe() const {
  std::string s;
  if (node_rank >= 0) s += "node " + std::to_string(node_rank) + " ";
  s += "(" + host + "): ";
  if (rank >= 0) s += "rank " + std::to_string(rank) + " ";
  return s + what;
}

const char* PhaseName(Phase p) {
  switch (p) {
    case Phase::kJoin: return "join";
    case Phase::kRun: return "run";
    case Phase::kClosed: return "closed";
  }
  return "?";
}

const NodeDesc* State::FindMember(std::string_view id) const {
  for (const auto& n : members)
    if (n.id == id) return &n;
  return nullptr;
}

bool State::IsWaiting(std::string_view id) const {
  return std::any_of(waiting.begin(), waiting.end(), [&](const NodeDesc& n) { return n.id == id; });
}

bool State::SuccessMayCount(std::string_view id) const {
  return phase == Phase::kJoin && Contains(may_finish, id) && !Contains(done, id);
}

int State::NodeRank(std::string_view id) const {
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i].id == id) return static_cast<int>(i);
  return -1;
}

Transition Transition::Join(NodeDesc n) {
  Transition t;
  t.kind = Kind::kJoin;
  t.node = std::move(n);
  return t;
}
Transition Transition::Complete(uint64_t round) {
  Transition t;
  t.kind = Kind::kComplete;
  t.round = round;
  return t;
}
Transition Transition::Fail(uint64_t round, std::string id, Cause cause) {
  Transition t;
  t.kind = Kind::kFail;
  t.round = round;
  t.id = std::move(id);
  t.cause = std::move(cause);
  return t;
}
Transition Transition::Succeed(uint64_t round, std::string id) {
  Transition t;
  t.kind = Kind::kSucceed;
  t.round = round;
  t.id = std::move(id);
  return t;
}
Transition Transition::Leave(std::string id) {
  Transition t;
  t.kind = Kind::kLeave;
  t.id = std::move(id);
  return t;
}
Transition Transition::Lost(std::string id) {
  Transition t;
  t.kind = Kind::kLost;
  t.id = std::move(id);
  return t;
}
Transition Transition::Refuse(std::string id, Params params) {
  Transition t;
  t.kind = Kind::kRefuse;
  t.id = std::move(id);
  t.params = params;
  return t;
}

std::string JoinBlocker(const State& s, const NodeDesc& n, const Params& p) {
  if (s.phase == Phase::kClosed) return "the job has ended";
  if (!p.static_ranks) return "";
  if (s.phase == Phase::kRun) return "";  // waits for the next round (static jobs are always full)
  for (const auto& m : s.members)
    if (m.declared_rank == n.declared_rank && m.id != n.id)
      return "node rank " + std::to_string(n.declared_rank) + " is already taken by " + m.host + " (" + m.id +
             "): two agents with the same --node_rank?";
  return "";
}

std::optional<State> Apply(const State& s, const Transition& t, const Params& p) {
  std::optional<State> out = ApplyKind(s, t, p);
  if (out && t.kind != Transition::Kind::kRefuse) out->refused.reset();
  return out;
}

std::string ParamsMismatch(const Params& mine, const Params& job, std::string_view where) {
  auto nnodes = [](const Params& p) {
    return p.min_nodes == p.max_nodes ? std::to_string(p.max_nodes)
                                      : std::to_string(p.min_nodes) + ":" + std::to_string(p.max_nodes);
  };
  auto backend = [](const Params& p) { return p.static_ranks ? "static" : "an elastic one (c10d or etcd)"; };
  std::string out;
  auto add = [&](const std::string& clause) { out += (out.empty() ? "" : "; ") + clause; };
  const std::string at = " " + std::string(where) + ", ";
  if (nnodes(mine) != nnodes(job)) add("--nnodes=" + nnodes(mine) + at + nnodes(job) + " in the job");
  if (mine.max_restarts != job.max_restarts)
    add("--max_restarts=" + std::to_string(mine.max_restarts) + at + std::to_string(job.max_restarts) + " in the job");
  if (mine.static_ranks != job.static_ranks)
    add(std::string("the rendezvous backend is ") + backend(mine) + at + backend(job) + " in the job");
  return out;
}

std::string Encode(const State& s) {
  Json j;
  j["v"] = 4;  // 4: members carry their role
  j["round"] = s.round;
  j["phase"] = PhaseName(s.phase);
  j["members"] = Json::array();
  for (const auto& n : s.members) j["members"].push_back(NodeToJson(n));
  j["expected"] = s.expected;
  j["waiting"] = Json::array();
  for (const auto& n : s.waiting) j["waiting"].push_back(NodeToJson(n));
  j["done"] = s.done;
  j["may_finish"] = s.may_finish;
  j["restarts"] = s.restarts;
  j["reason"] = s.reason;
  if (s.cause) j["cause"] = CauseToJson(*s.cause);
  j["exit_code"] = s.exit_code;
  j["message"] = s.message;
  j["writer"] = s.writer;
  j["params"] = ParamsToJson(s.params);
  j["params"]["from"] = s.params_from;
  if (s.refused) {
    j["refused"] = ParamsToJson(s.refused->params);
    j["refused"]["id"] = s.refused->id;
  }
  // A cause's text comes from the workers' side (an argv0, an error file's message) and may not
  // be UTF-8: replaced, never thrown on.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

StatusOr<State> Decode(std::string_view text) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::Error("rendezvous state is not a JSON object");
  try {
    if (const int v = IntAt<int>(j, "v"); v != 4)
      return Status::Error("rendezvous state has format version " + std::to_string(v) +
                           ", this ctrun reads version 4: every node of a job must run the same ctrun release");
    State s;
    s.round = IntAt<uint64_t>(j, "round");
    const std::string phase = j.at("phase").get<std::string>();
    if (phase == "join") s.phase = Phase::kJoin;
    else if (phase == "run") s.phase = Phase::kRun;
    else if (phase == "closed") s.phase = Phase::kClosed;
    else return Status::Error("rendezvous state has an unknown phase '" + phase + "'");
    for (const auto& n : j.at("members")) s.members.push_back(NodeFromJson(n));
    s.expected = j.at("expected").get<std::vector<std::string>>();
    for (const auto& n : j.at("waiting")) s.waiting.push_back(NodeFromJson(n));
    s.done = j.at("done").get<std::vector<std::string>>();
    s.may_finish = j.at("may_finish").get<std::vector<std::string>>();
    s.restarts = IntAt<int>(j, "restarts");
    s.reason = j.at("reason").get<std::string>();
    if (j.contains("cause")) s.cause = CauseFromJson(j.at("cause"));
    s.exit_code = IntAt<int>(j, "exit_code");
    s.message = j.at("message").get<std::string>();
    s.writer = j.at("writer").get<std::string>();
    s.params = ParamsFromJson(j.at("params"));
    s.params_from = j.at("params").at("from").get<std::string>();
    if (j.contains("refused")) s.refused = Refusal{j.at("refused").at("id").get<std::string>(), ParamsFromJson(j.at("refused"))};
    return s;
  } catch (const Json::exception& e) {
    return Status::Error(std::string("malformed rendezvous state: ") + e.what());
  } catch (const BadField& e) {
    return Status::Error(std::string("malformed rendezvous state: ") + e.what());
  }
}

}  // namespace ctrun::rdzv
