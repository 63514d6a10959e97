#include "rendezvous/rendezvous.h"

#include <algorithm>
#include <cmath>

namespace ctrun::rdzv {
namespace {

std::string SecondsText(Duration d) {
  const double s = ToSeconds(d);
  char buf[32];
  std::snprintf(buf, sizeof buf, s == std::floor(s) ? "%.0f s" : "%.1f s", s);
  return buf;
}

}  // namespace

Rendezvous::Rendezvous(std::unique_ptr<RendezvousLog> log, TimerQueue& timers, RendezvousOptions options,
                       std::string self_id)
    : log_(std::move(log)), timers_(timers), options_(std::move(options)), self_id_(std::move(self_id)) {
  std::weak_ptr<bool> alive = alive_;
  log_->SetOnLost([this, alive](const std::string& id) {
    if (alive.expired() || id == self_id_) return;
    if (listener_) listener_->OnRendezvousLog(1, "node " + id + " missed its heartbeat deadline; dropping it");
    Enqueue(Transition::Lost(id));
  });
  log_->StartLiveness(self_id_, options_.liveness);
  State initial;
  initial.writer = "init";
  initial.params = options_.params;  // the job's rules if this agent creates the log
  initial.params_from = self_id_;
  initial_ = Encode(initial);
  ReadHead();
}

Rendezvous::~Rendezvous() {
  *alive_ = false;
  if (join_timer_) timers_.CancelTimer(*join_timer_);
  if (last_call_timer_) timers_.CancelTimer(*last_call_timer_);
}

void Rendezvous::Join(NodeDesc self) {
  if (mode_ == Mode::kEnded || left_ || !refusal_.empty()) return;
  self_ = std::move(self);
  self_.id = self_id_;
  mode_ = Mode::kJoining;
  want_join_ = true;
  if (join_timer_) timers_.CancelTimer(*join_timer_);
  join_timer_ = timers_.AddTimerAfter(options_.join_timeout, [this] {
    join_timer_.reset();
    OnJoinTimeout();
  });
  React();
  Pump();
}

void Rendezvous::ReportFailure(Cause cause) {
  if (!has_active_round_ || left_) return;
  cause.node_id = self_id_;
  cause.host = self_.host;
  Enqueue(Transition::Fail(active_round_, self_id_, std::move(cause)));
}

void Rendezvous::ReportSucceeded() {
  if (mode_ != Mode::kActive) return;
  mode_ = Mode::kSucceeded;
  Enqueue(Transition::Succeed(active_round_, self_id_));
  React();  // the round may already have moved on while the workers finished
}

void Rendezvous::Leave() {
  if (left_) return;
  left_ = true;
  want_join_ = false;
  Enqueue(Transition::Leave(self_id_));
  log_->StopLiveness();
}

void Rendezvous::ReadHead() {
  reading_head_ = true;
  std::weak_ptr<bool> alive = alive_;
  log_->Head(initial_, [this, alive](StatusOr<LogEntry> head) {
    if (!alive.expired()) OnHead(std::move(head));
  });
}

void Rendezvous::OnHead(StatusOr<LogEntry> head) {
  reading_head_ = false;
  if (!head.ok()) {
    Fatal("cannot read the rendezvous state (" + log_->Describe() + "): " + head.message());
    return;
  }
  if (head_ && head->index <= head_index_) {  // a head older than an entry already compacted
    if (++stale_head_reads_ < kMaxStaleHeadReads) return ReadHead();
    Fatal("lost the rendezvous (" + log_->Describe() + "): entry " + std::to_string(head_index_ + 1) +
          " was compacted, yet the newest entry is " + std::to_string(head->index));
    return;
  }
  stale_head_reads_ = 0;
  OnEntry(head->index, head->value);
  Pump();
}

// Entries are applied in index order; one learned twice (from our own Append and from the Wait)
// is ignored the second time. An agent that fell behind by more than the log keeps (it reads a
// compacted entry) skips to the newest entry: each entry is the whole state, and what an agent
// does follows from the state it sees, not from the steps between two states.
void Rendezvous::OnEntry(uint64_t index, const std::string& value) {
  if (head_ && index <= head_index_) return;
  if (value == kCompactedEntry) {
    if (!reading_head_) ReadHead();
    return;
  }
  auto state = Decode(value);
  if (!state.ok()) {
    Fatal("entry " + std::to_string(index) + " of the rendezvous log: " + state.message());
    return;
  }
  const bool first = !head_;
  if (first) first_index_ = index;
  head_ = std::move(state.value());
  if (!refusal_.empty()) {  // an append of the refusal lost its race: Pump retries it on this entry
    head_index_ = index;
    return;
  }
  // A closed log is an earlier job's (ReactWhileJoining says so): its rules do not matter.
  if (first && head_->phase != Phase::kClosed) {
    if (std::string diff = ParamsMismatch(options_.params, head_->params); !diff.empty()) {
      Refuse(index, "this node's flags differ from those of the job it is joining (" + log_->Describe() + "): " +
                        diff + ", set by " + head_->params_from +
                        ", the node that started the rendezvous; every node of a job must give the same values");
      return;
    }
  }
  if (!first && head_->refused) SayRefusal(*head_->refused);
  head_index_ = index;
  std::weak_ptr<bool> alive = alive_;
  log_->Wait(index + 1, [this, alive, next = index + 1](StatusOr<std::string> v) {
    if (alive.expired()) return;
    if (!v.ok()) {
      Fatal("lost the rendezvous (" + log_->Describe() + "): " + v.message());
      return;
    }
    OnEntry(next, *v);
    Pump();
  });
  log_->WatchMembers(WatchSet());
  React();
}

// Each agent watches the liveness of only the next kWatchedPeers nodes after itself in id order
// (a ring over members, waiting and expected nodes), so watching costs O(nodes) in all, and every
// node has kWatchedPeers watchers; when a watcher dies too, the ring closes over it once it is
// dropped, and the node gets a new watcher (with a fresh deadline).
std::vector<std::string> Rendezvous::WatchSet() const {
  std::vector<std::string> ids{self_id_};
  for (const auto& n : head_->members) ids.push_back(n.id);
  for (const auto& n : head_->waiting) ids.push_back(n.id);
  for (const auto& id : head_->expected) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  const size_t self = static_cast<size_t>(std::find(ids.begin(), ids.end(), self_id_) - ids.begin());
  std::vector<std::string> watch;
  for (size_t k = 1; k <= kWatchedPeers && k < ids.size(); ++k) watch.push_back(ids[(self + k) % ids.size()]);
  return watch;
}

void Rendezvous::React() {
  if (!head_ || mode_ == Mode::kEnded) return;
  switch (mode_) {
    case Mode::kJoining:
      ReactWhileJoining();
      return;
    case Mode::kActive:
    case Mode::kSucceeded:
      ReactWhileRunning();
      return;
    default:
      return;
  }
}

void Rendezvous::ReactWhileJoining() {
  const State& s = *head_;
  if (s.phase == Phase::kClosed && !has_active_round_ && head_index_ == first_index_) {
    // Closed before this agent arrived: the log belongs to an earlier job with the same run id.
    // (A node that was waiting while the job ended takes the job's outcome below.)
    Fatal("the rendezvous of run id '" + options_.run_id + "' (" + log_->Describe() +
          ") belongs to a job that already ended (" + (s.message.empty() ? "closed" : s.message) +
          "); start the new job with another --rdzv_id");
    return;
  }
  if (s.phase == Phase::kClosed) {
    JobEnd end;
    end.exit_code = s.exit_code;
    end.message = s.message;
    end.cause = s.cause;
    end.cause_is_local = s.cause && s.cause->node_id == self_id_;
    End(std::move(end));
    return;
  }
  const bool member = s.FindMember(self_id_) != nullptr;
  if (s.phase == Phase::kRun && member && (!has_active_round_ || s.round > active_round_)) {
    mode_ = Mode::kActive;
    want_join_ = false;
    active_round_ = s.round;
    has_active_round_ = true;
    if (join_timer_) timers_.CancelTimer(*join_timer_);
    join_timer_.reset();
    if (listener_) listener_->OnRoundReady(MakeRound());
    return;
  }
  if (s.phase == Phase::kJoin) {
    if (member && static_cast<int>(s.members.size()) >= options_.params.min_nodes)
      ArmLastCall();
    else
      DisarmLastCall();  // below MIN again (a member left or was lost): MIN reached anew arms anew
  }
  if (s.phase == Phase::kRun && s.IsWaiting(self_id_) && said_waiting_round_ != s.round) {
    said_waiting_round_ = s.round;
    if (listener_)
      listener_->OnRendezvousLog(0, "waiting to join: round " + std::to_string(s.round) + " runs with " +
                                        std::to_string(s.members.size()) + " node(s) and " +
                                        (s.done.empty() ? "has no room" : "is finishing (a node's workers succeeded)") +
                                        "; this node joins the next round, if there is one");
  }
}

void Rendezvous::ReactWhileRunning() {
  const State& s = *head_;
  std::string why;
  if (mode_ == Mode::kSucceeded && s.round == active_round_ + 1 && s.SuccessMayCount(self_id_)) {
    return;  // our success lost its race with a membership change; it is queued and may end the job
  }
  if (s.phase == Phase::kClosed) {
    why = s.message;
  } else if (s.round > active_round_) {
    why = s.reason.empty() ? "a new rendezvous round started" : s.reason;
  } else if (s.phase == Phase::kRun && !s.FindMember(self_id_)) {
    why = "this node was dropped from the rendezvous (its heartbeats did not arrive in time)";
  } else {
    return;
  }
  if (mode_ == Mode::kSucceeded && s.phase == Phase::kClosed) {
    mode_ = Mode::kJoining;  // nothing left to stop: read the outcome
    ReactWhileJoining();
    return;
  }
  mode_ = Mode::kStopping;
  if (listener_) listener_->OnRoundStopping(why);
}

void Rendezvous::Enqueue(Transition t) {
  intents_.push_back(std::move(t));
  Pump();
}

// At most one append is in flight. Queued transitions go first, in order; each is re-applied to
// the newest state, and dropped once it changes nothing. The standing wish to join comes last.
void Rendezvous::Pump() {
  while (head_ && !appending_ && !reading_head_) {
    if (!refusal_.empty() && intents_.empty()) {  // the refusal is written, or changed nothing
      Fatal(refusal_);
      return;
    }
    std::optional<State> next;
    const bool from_intent = !intents_.empty();
    if (from_intent) {
      next = Apply(*head_, intents_.front(), options_.params);
      if (!next) {
        intents_.pop_front();
        continue;
      }
    } else if (want_join_ && mode_ == Mode::kJoining) {
      next = Apply(*head_, Transition::Join(self_), options_.params);
      if (!next) return;
    } else {
      return;
    }
    next->writer = self_id_ + "#" + std::to_string(++seq_);
    appending_ = true;
    const uint64_t index = head_index_ + 1;
    std::weak_ptr<bool> alive = alive_;
    log_->Append(index, Encode(*next), [this, alive, index, from_intent](StatusOr<AppendResult> r) {
      if (alive.expired()) return;
      appending_ = false;
      if (!r.ok()) {
        Fatal(refusal_.empty() ? "cannot write to the rendezvous (" + log_->Describe() + "): " + r.message() : refusal_);
        return;
      }
      if (r->won && from_intent && !intents_.empty()) intents_.pop_front();
      OnEntry(index, r->value);
      Pump();
    });
  }
}

void Rendezvous::ArmLastCall() {
  if (last_call_round_ == head_->round) return;
  last_call_round_ = head_->round;
  if (last_call_timer_) timers_.CancelTimer(*last_call_timer_);
  last_call_timer_ = timers_.AddTimerAfter(options_.last_call, [this, round = head_->round] {
    last_call_timer_.reset();
    Enqueue(Transition::Complete(round));
  });
}

void Rendezvous::DisarmLastCall() {
  if (last_call_timer_) timers_.CancelTimer(*last_call_timer_);
  last_call_timer_.reset();
  last_call_round_ = UINT64_MAX;
}

// This node is refused: it writes so into the log (the job's nodes name it, and a job that never
// fills says why), then ends with `why`, also when that write fails.
void Rendezvous::Refuse(uint64_t index, std::string why) {
  refusal_ = std::move(why);
  want_join_ = false;
  head_index_ = index;
  intents_.clear();
  Enqueue(Transition::Refuse(self_id_, options_.params));
}

void Rendezvous::SayRefusal(const Refusal& r) {
  const std::string text = "node " + r.id + " was refused: its flags differ from this job's (" +
                           ParamsMismatch(r.params, head_->params, "there") + ")";
  if (refusals_seen_.size() < 3) refusals_seen_.push_back(text);
  if (listener_) listener_->OnRendezvousLog(1, text);
}

void Rendezvous::OnJoinTimeout() {
  if (mode_ != Mode::kJoining) return;
  std::string msg = "rendezvous timed out after " + SecondsText(options_.join_timeout) + " (" + log_->Describe() + ")";
  if (head_) {
    const State& s = *head_;
    msg += ": " + std::to_string(s.members.size()) + " node(s) joined round " + std::to_string(s.round);
    if (!s.members.empty()) msg += " (" + Members() + ")";
    msg += ", need at least " + std::to_string(options_.params.min_nodes);
    // Every node runs by the rules of entry 0 (a node whose --nnodes differs is refused), so a
    // static round that has every rank completes: when none is missing, JoinBlocker says why.
    if (options_.params.static_ranks) {
      if (const std::string missing = MissingRanks(); !missing.empty()) msg += "; missing node rank(s): " + missing;
    }
    if (std::string b = JoinBlocker(s, self_, options_.params); !b.empty()) msg += "; this node could not join: " + b;
  }
  for (const std::string& r : refusals_seen_) msg += "; " + r;
  Enqueue(Transition::Leave(self_id_));
  Fatal(msg);
}

void Rendezvous::Fatal(const std::string& what) {
  if (mode_ == Mode::kEnded) return;
  // Once the job is closed its outcome is known: a store host that exits (it lingers only
  // briefly) or an unreachable etcd cannot change it, even while this agent still stops workers.
  if (head_ && head_->phase == Phase::kClosed && has_active_round_) return;
  JobEnd end;
  if (mode_ == Mode::kSucceeded) {
    // Every worker here succeeded and only the exit barrier is lost: exit 0, as torchrun does when
    // its exit barrier fails, and say that the other nodes' outcome is not known here.
    end.message = what + "; every worker on this node had succeeded (the other nodes' outcome is not known here)";
    End(std::move(end));
    return;
  }
  end.exit_code = kExitRendezvous;
  end.message = what;
  end.rendezvous_error = true;
  End(std::move(end));
}

void Rendezvous::End(JobEnd end) {
  mode_ = Mode::kEnded;
  want_join_ = false;
  if (join_timer_) timers_.CancelTimer(*join_timer_);
  if (last_call_timer_) timers_.CancelTimer(*last_call_timer_);
  join_timer_.reset();
  last_call_timer_.reset();
  if (listener_) listener_->OnJobEnd(end);
}

RoundInfo Rendezvous::MakeRound() const {
  const State& s = *head_;
  RoundInfo r;
  r.round = s.round;
  r.nodes = s.members;
  r.num_nodes = static_cast<int>(s.members.size());
  r.restart_count = s.restarts;
  r.reason = s.reason;
  r.node_rank = s.NodeRank(self_id_);
  r.world_size = 0;
  for (int i = 0; i < r.num_nodes; ++i) {
    if (i == r.node_rank) r.base_rank = r.world_size;
    r.world_size += s.members[static_cast<size_t>(i)].nproc;
  }
  r.master_addr = s.members.front().addr;
  r.master_port = s.members.front().store_port;
  return r;
}

std::string Rendezvous::MissingRanks() const {
  std::string out;
  for (int r = 0; r < options_.params.max_nodes; ++r) {
    bool present = false;
    for (const auto& n : head_->members) present = present || n.declared_rank == r;
    if (!present) out += (out.empty() ? "" : ", ") + std::to_string(r);
  }
  return out;
}

std::vector<Rendezvous::NodeName> Rendezvous::UnfinishedNodes() const {
  std::vector<NodeName> out;
  if (mode_ != Mode::kSucceeded || !head_ || head_->phase != Phase::kRun) return out;
  const std::vector<std::string>& done = head_->done;
  for (size_t i = 0; i < head_->members.size(); ++i) {
    const NodeDesc& n = head_->members[i];  // kRun: in node-rank order
    if (n.id != self_id_ && std::find(done.begin(), done.end(), n.id) == done.end())
      out.push_back({static_cast<int>(i), n.host});
  }
  return out;
}

std::string Rendezvous::Members() const {
  std::string out;
  for (const auto& n : head_->members) {
    if (!out.empty()) out += ", ";
    out += n.host;
    if (n.declared_rank >= 0) out += " (node " + std::to_string(n.declared_rank) + ")";
  }
  return out;
}

}  // namespace ctrun::rdzv
