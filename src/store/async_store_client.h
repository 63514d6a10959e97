// AsyncStoreClient: non-blocking c10d TCPStore client driven by ctrun's EventLoop (the multi-node
// rendezvous runs on it). The blocking StoreClient (store_client.h) is for workers and tools.
//
// Contract:
//  - Single-threaded: every method must be called on the loop's thread. No method blocks the
//    loop: connect is non-blocking; only name resolution (getaddrinfo) blocks: in Create(), and
//    again at each connect retry while the name does not resolve (EAI_NONAME/EAI_AGAIN: a DNS
//    record published after this node started), which is retried like a refused connect.
//  - Every callback runs later on the loop, never from inside the call that registered it; a
//    callback may call into the client or destroy it. A null callback is allowed (fire and forget).
//  - Dialect: modern (VALIDATE first), after a ctrun AUTH carrying options.token when non-empty.
//  - Requests are pipelined on one connection and the server answers in order, so callbacks run
//    in the order the requests were made. A request without a reply (SET) completes once its bytes
//    are handed to the kernel.
//  - WAIT parks the connection on the server, so requests made after a Wait are held back (not
//    sent) until that wait completes, times out or is canceled. Use a second client for
//    operations that must not queue behind a wait.
//  - Connecting starts with the first request (and again with the first request after a loss):
//    refused/unreachable connects are retried with capped exponential backoff until
//    options.connect_timeout, since the server may not listen yet. Requests made meanwhile queue.
//  - A reply that does not arrive within options.op_timeout of its request being sent drops the
//    connection (a parked Wait has its own timeout instead; TCP keepalive, see TunePeerSocket,
//    detects a silently cut link while it is parked). On any connection loss or protocol error
//    every pending callback (sent or queued) gets an error Status, in request order; the next
//    request reconnects. A request that failed may or may not have been applied.
//  - Like torch's server, ctrun's closes the connection on a GET or MULTI_GET of a missing key:
//    that fails every pending request. Wait for (or Check) the keys first.
//  - Destroying the client closes the connection and cancels its timers; no callback runs
//    afterwards, including ones already due in the same loop iteration.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "store/protocol.h"
#include "sys/event_loop.h"

namespace ctrun::store {

struct AsyncClientOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string token;                       // sent as ctrun AUTH first when non-empty
  Duration connect_timeout = Seconds(60);  // how long refused/unreachable connects are retried
  Duration op_timeout = Seconds(30);       // reply deadline of each request once sent
  size_t max_value_bytes = 256u << 20;     // a longer value in a reply is a protocol error
  // Called once per connect, at its first failed attempt that will be retried (refused,
  // unreachable, a name that does not resolve yet), with one line for the user; the retries go on
  // silently until connect_timeout. Not after the client was once connected.
  std::function<void(const std::string&)> on_unreachable;
  // Called before each retry of a connect that never reached the server, on the loop thread, so
  // the owner can bring up the server it waits for (a rendezvous host that lost a race for its
  // port to a socket that does not listen). Not after the client was once connected.
  std::function<void()> before_retry;
};

class AsyncStoreClient {
 public:
  template <typename T>
  using Callback = std::function<void(StatusOr<T>)>;
  using DoneCallback = std::function<void(Status)>;
  using WaitId = uint64_t;  // 0 is never a valid id

  // Resolves opts.host (blocking); a name that does not resolve yet is resolved again when
  // connecting. Connecting waits for the first request.
  static StatusOr<std::unique_ptr<AsyncStoreClient>> Create(EventLoop& loop,
                                                            const AsyncClientOptions& opts);
  ~AsyncStoreClient();
  AsyncStoreClient(const AsyncStoreClient&) = delete;
  AsyncStoreClient& operator=(const AsyncStoreClient&) = delete;

  void Set(std::string key, std::string value, DoneCallback done = nullptr);
  // The new value; a missing key counts as 0.
  void Add(std::string key, int64_t delta, Callback<int64_t> done);
  // torch semantics: the value now stored. Missing key: stores and returns `desired` when
  // `expected` is empty, else returns `expected` and stores nothing.
  void CompareSet(std::string key, std::string expected, std::string desired,
                  Callback<std::string> done);
  // The key must exist (a missing key drops the connection, see above).
  void Get(std::string key, Callback<std::string> done);
  // true when every key exists.
  void Check(std::vector<std::string> keys, Callback<bool> done);
  // true once every key exists; false when `timeout` (counted from this call) passed first, in
  // which case CANCEL_WAIT unparks the connection and it stays usable. No timeout: wait forever.
  WaitId Wait(std::vector<std::string> keys, std::optional<Duration> timeout, Callback<bool> done);
  // Drops a Wait: its callback never runs. If it is parked on the server, CANCEL_WAIT unparks the
  // connection. No-op for an unknown or finished id.
  void CancelWait(WaitId id);
  // true when the key existed.
  void DeleteKey(std::string key, Callback<bool> done);
  // Values in key order; every key must exist (see Get).
  void MultiGet(std::vector<std::string> keys, Callback<std::vector<std::string>> done);
  void Ping(DoneCallback done);

  bool connected() const { return state_ == State::kConnected; }
  // Requests not completed yet (queued or on the wire).
  size_t pending() const { return queue_.size() + inflight_.size(); }
  // "HOST:PORT".
  const std::string& where() const { return where_; }
  const AsyncClientOptions& options() const { return opts_; }

 private:
  struct Address {
    sockaddr_storage addr{};
    socklen_t len = 0;
  };
  // One decoded reply; which field is used depends on the op.
  struct Reply {
    int64_t i = 0;               // ADD, DELETE_KEY, CHECK (0 ready), WAIT (1 satisfied)
    std::string s;               // GET, COMPARE_SET
    std::vector<std::string> v;  // MULTI_GET
  };
  using ReplyCallback = std::function<void(StatusOr<Reply>)>;
  struct Pending {
    Op op = Op::kPing;
    std::string bytes;                      // encoded request, until it moves into wbuf_
    ReplyCallback done;                     // null: nobody listens (or the Wait was canceled)
    uint64_t end = 0;                       // connection offset just past it, once in wbuf_
    TimePoint deadline = TimePoint::max();  // reply deadline (a Wait's: its own timeout)
    uint32_t nonce = 0;                     // PING
    size_t count = 0;                       // MULTI_GET: number of values
    WaitId wait_id = 0;                     // WAIT
    bool cancel_sent = false;               // WAIT: a CANCEL_WAIT follows it on the wire
    bool satisfied = false;                 // WAIT: STOP_WAITING seen
  };
  enum class State { kIdle, kConnecting, kBackoff, kConnected };
  enum class Parse { kNeedMore, kDone, kBad };

  AsyncStoreClient(EventLoop& loop, const AsyncClientOptions& opts, std::vector<Address> addrs);
  std::weak_ptr<char> Guard() const { return alive_; }

  // Typed callbacks -> ReplyCallback (null stays null).
  template <typename T, typename Pick>
  static ReplyCallback Adapt(Callback<T> done, Pick pick);
  static ReplyCallback AdaptStatus(DoneCallback done);

  Pending& Enqueue(const Request& req, ReplyCallback done);
  void ScheduleKick();
  void Kick();
  // Sends what may be sent, completes what has completed, re-arms the deadline timer.
  void Progress();
  // Runs the callbacks collected by the steps above, in order, until the client is destroyed.
  // The last statement of every loop handler: nothing may touch `this` after it.
  void Deliver();
  // Queues p's callback with r for Deliver().
  void Complete(Pending& p, StatusOr<Reply> r);

  // Connecting.
  void StartConnect();
  void TryConnect();
  void OnConnectWritable();
  void OnConnectError(int err);
  void RetryLater();  // backoff, then TryConnect; gives up at the connect deadline
  static std::vector<Address> Resolve(const std::string& host, int port, int* gai);
  void OnConnected();
  void OnConnectDeadline();

  // The connected socket. Flush/Drain/ReadAvailable return false when they dropped it.
  void OnIo(uint32_t events);
  void Pump();  // queue_ -> wbuf_, unless a WAIT is parked
  bool Flush();
  bool Drain();  // completes finished requests at the front of inflight_
  bool ReadAvailable();
  Parse ParseReply(Pending& p, std::string_view* in, Reply* out, std::string* err) const;
  static Parse ParseWaitReply(Pending& p, std::string_view* in, Reply* out, std::string* err);
  // uint64 length + bytes; out may be null (only checks that the value is complete).
  static Parse ReadValue(std::string_view* in, size_t max, std::string* out, std::string* err);
  void SendCancel(Pending& wait);
  bool UpdateInterest();  // false: the connection failed (FailAll)
  Status LostStatus(int err) const;

  // Deadlines.
  void ArmDeadlineTimer();
  void OnDeadline();

  // Drops the connection (or the connect attempt); every pending callback gets `st`.
  void FailAll(const Status& st);
  void CloseSocket();  // back to kIdle, buffers cleared
  void CloseFd();

  EventLoop& loop_;
  AsyncClientOptions opts_;
  std::vector<Address> addrs_;
  std::string where_;
  std::shared_ptr<char> alive_ = std::make_shared<char>(0);  // expires with the client

  State state_ = State::kIdle;
  UniqueFd fd_;
  bool want_out_ = false;  // EPOLLOUT registered
  size_t addr_index_ = 0;
  Duration backoff_{};
  TimePoint connect_deadline_{};
  std::string last_connect_error_;

  std::deque<Pending> queue_;     // not sent yet
  std::deque<Pending> inflight_;  // sent (or in wbuf_), awaiting reply or write completion
  bool wait_parked_ = false;      // a WAIT is on the wire without a CANCEL_WAIT after it
  std::string wbuf_;
  size_t wbuf_off_ = 0;
  uint64_t queued_bytes_ = 0;  // bytes put in wbuf_ since connecting
  uint64_t sent_bytes_ = 0;    // bytes the kernel took since connecting
  std::string rbuf_;
  size_t rbuf_off_ = 0;
  bool got_reply_ = false;  // any reply byte on this connection (for error hints)
  bool said_unreachable_ = false;  // on_unreachable was called for the current connect
  bool ever_connected_ = false;    // a connection was made once (on_unreachable is for the first)

  struct Ready {
    WaitId wait_id = 0;
    std::function<void()> run;
  };
  std::deque<Ready> ready_;

  uint32_t next_nonce_ = 1;
  WaitId next_wait_id_ = 1;
  TimerQueue::TimerId kick_timer_ = 0;
  TimerQueue::TimerId deadline_timer_ = 0;
  TimePoint armed_deadline_ = TimePoint::max();
  TimerQueue::TimerId connect_timer_ = 0;
  TimerQueue::TimerId backoff_timer_ = 0;
};

}  // namespace ctrun::store
