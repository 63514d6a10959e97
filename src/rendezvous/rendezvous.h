// Rendezvous: one agent's side of the multi-node rendezvous. It follows the shared log of states
// (rendezvous_log.h) entry by entry, appends this agent's transitions (rdzv_state.h), and tells the
// agent what to do through RendezvousListener: start a round's workers, stop them, end the job.
//
// It never blocks: it is driven by the log's callbacks and the TimerQueue, on the event loop's
// thread, and is tested with an in-memory log and a fake clock (tests/rendezvous/unit).
//
// The agent's side of the protocol:
//   Join(self)         after start, and again after each round's workers are all gone
//   -> OnRoundReady    start the round's workers with these ranks
//   ReportFailure(c)   a local worker failed (the agent stops its workers itself)
//   ReportSucceeded()  every local worker succeeded (the agent waits for the others: exit barrier)
//   -> OnRoundStopping another node failed, a node joined/left/was lost, or the job ended
//   -> OnJobEnd        the outcome every agent agrees on, or a rendezvous error of this agent
//   Leave()            the agent got a terminating signal: leave without closing the job
// Timers: join_timeout per Join (-> OnJobEnd with kExitRendezvous), last_call once a joining round
// has min nodes (again, if it fell below), and the log's liveness deadline for the next kWatchedPeers nodes (-> kLost).
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/rdzv_state.h"
#include "rendezvous/rendezvous_log.h"
#include "sys/event_loop.h"

namespace ctrun::rdzv {

// ctrun's exit code when the rendezvous itself fails (join timeout, store or etcd unreachable,
// node rank conflict): see README "Exit codes".
inline constexpr int kExitRendezvous = 3;

struct RendezvousOptions {
  Params params;
  Duration join_timeout = Seconds(600);  // rdzv_conf join_timeout
  Duration last_call = Seconds(30);      // rdzv_conf last_call_timeout
  LivenessOptions liveness;              // keep_alive_interval, x keep_alive_max_attempt
  std::string run_id;                    // for messages
};

// A completed round as this node sees it.
struct RoundInfo {
  uint64_t round = 0;
  int node_rank = 0;
  int num_nodes = 1;
  int base_rank = 0;     // global rank of this node's local rank 0
  int world_size = 1;    // sum of every node's nproc
  int restart_count = 0;  // job-wide (TORCHELASTIC_RESTART_COUNT)
  std::string master_addr;  // node rank 0's workers' store
  int master_port = 0;
  std::vector<NodeDesc> nodes;  // node-rank order
  std::string reason;           // why this round started ("" for the first)
};

struct JobEnd {
  int exit_code = 0;
  std::string message;
  std::optional<Cause> cause;   // the root cause when the job failed
  bool cause_is_local = false;  // the root cause was one of this node's workers
  bool rendezvous_error = false;  // this agent's own rendezvous failed (not an agreed outcome)
};

class RendezvousListener {
 public:
  virtual ~RendezvousListener() = default;
  virtual void OnRoundReady(const RoundInfo& round) = 0;
  virtual void OnRoundStopping(const std::string& why) = 0;
  virtual void OnJobEnd(const JobEnd& end) = 0;
  virtual void OnRendezvousLog(int /*level: 0 info, 1 warn, 2 error*/, const std::string& /*msg*/) {}
};

class Rendezvous {
 public:
  // How many other nodes each agent watches for liveness (see WatchSet in rendezvous.cc).
  static constexpr size_t kWatchedPeers = 2;
  static constexpr int kMaxStaleHeadReads = 3;

  Rendezvous(std::unique_ptr<RendezvousLog> log, TimerQueue& timers, RendezvousOptions options,
             std::string self_id);
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  void SetListener(RendezvousListener* listener) { listener_ = listener; }
  const std::string& self_id() const { return self_id_; }

  // self.id is ignored (self_id() is used); self.store_port may differ per round.
  void Join(NodeDesc self);
  void ReportFailure(Cause cause);
  void ReportSucceeded();
  void Leave();
  // In the exit barrier: every worker of this node succeeded, and the job has not ended. The
  // nodes of the round that have not (node rank, host), in node-rank order; empty otherwise.
  struct NodeName {
    int node_rank = -1;
    std::string host;
  };
  std::vector<NodeName> UnfinishedNodes() const;
  // No transition is waiting to be written (for a bounded drain before exit), or none can be: the
  // log was never read (an unreachable store has no round to leave).
  bool idle() const { return !appending_ && (intents_.empty() || !head_); }
  const RendezvousLog& log() const { return *log_; }
  // How long after a node's death the rendezvous reports it lost, at most: the liveness deadline,
  // plus one interval for the watcher's own round.
  Duration loss_reported_within() const { return options_.liveness.deadline + options_.liveness.interval; }

 private:
  enum class Mode { kStarting, kJoining, kActive, kSucceeded, kStopping, kEnded };

  void ReadHead();
  void OnHead(StatusOr<LogEntry> head);
  void OnEntry(uint64_t index, const std::string& value);
  void React();
  void ReactWhileJoining();
  void ReactWhileRunning();
  void Pump();
  void Enqueue(Transition t);
  void Fatal(const std::string& what);
  void End(JobEnd end);
  void ArmLastCall();     // once per round, when MIN is reached
  void DisarmLastCall();  // the round fell below MIN again
  void OnJoinTimeout();
  void Refuse(uint64_t index, std::string why);
  void SayRefusal(const Refusal& r);
  RoundInfo MakeRound() const;
  std::vector<std::string> WatchSet() const;
  std::string Members() const;
  std::string MissingRanks() const;

  std::unique_ptr<RendezvousLog> log_;
  TimerQueue& timers_;
  const RendezvousOptions options_;
  const std::string self_id_;
  RendezvousListener* listener_ = nullptr;

  Mode mode_ = Mode::kStarting;
  NodeDesc self_;
  bool want_join_ = false;
  bool left_ = false;
  std::string initial_;  // the encoded state that creates an empty log
  std::optional<State> head_;
  uint64_t head_index_ = 0;
  // This agent fell more than the log keeps behind (it read a compacted entry) and reads the head
  // again; no append goes out meanwhile (it would go to an index long taken). Counts such reads
  // that brought nothing newer.
  bool reading_head_ = false;
  int stale_head_reads_ = 0;
  uint64_t first_index_ = 0;  // the entry this agent first read
  uint64_t active_round_ = 0;
  bool has_active_round_ = false;
  std::deque<Transition> intents_;
  bool appending_ = false;
  uint64_t seq_ = 0;
  std::optional<TimerQueue::TimerId> join_timer_;
  std::optional<TimerQueue::TimerId> last_call_timer_;
  uint64_t last_call_round_ = UINT64_MAX;
  uint64_t said_waiting_round_ = UINT64_MAX;  // the round this node was last told it waits for
  // This node's flags differ from the job's: it appends its refusal (a trace for the job's nodes),
  // then ends with this message; it takes no other part.
  std::string refusal_;
  std::vector<std::string> refusals_seen_;  // other nodes refused while this one waited, for OnJoinTimeout
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace ctrun::rdzv
