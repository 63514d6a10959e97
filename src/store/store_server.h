// StoreServer: ctrun's c10d-compatible TCPStore server, event-driven on an EventLoop.
//
// It answers torch <= 2.0 clients (no handshake) and torch >= 2.1 clients (VALIDATE first) on the
// same port, choosing the dialect per connection from its first bytes (store/protocol.h), with one
// key space shared by all of them. Clients add their own key prefixes (torch 1.13 prefixes "/").
//
// Contract:
//  - Everything runs on the loop's thread: Start, Clear, the destructor and the handlers. The only
//    members safe to call from another thread are port(), num_keys(), num_connections(),
//    num_waiting() and total_pending_output() (relaxed atomics, for tests and metrics).
//  - Behaviour follows torch's own servers: GET / MULTI_GET on a missing key closes that
//    connection; WAIT parks the connection until every key exists (SET, ADD, APPEND, MULTI_SET,
//    COMPARE_SET and QUEUE_PUSH wake it); CANCEL_WAIT unparks it with WAIT_CANCELED; WATCH_KEY
//    (legacy) is acknowledged with KEY_CALLBACK_REGISTERED but no update is ever sent;
//    GETNUMKEYS counts every key in the map (as torch does, "init/" included, queues excluded).
//  - Hardening: a declared length over ServerOptions limits closes the connection before any
//    allocation; per-connection input is bounded by one request, output by max_pending_output
//    plus one reply (the connection stops being read until its peer drains it), a MULTI_GET
//    reply by max_multi_get_reply (checked before it is built; over it closes the connection);
//    max_connections caps accepted sockets (extra ones are accepted and closed at once, and
//    logged). The sum of every connection's pending output is kept as a running total (changed
//    where output is queued, sent, dropped on a reset and on close); when a request leaves it
//    over max_total_pending_output, the connections holding the most unsent output are closed,
//    largest first, until it is back within the bound, each logged (WarnPeer). So the total
//    exceeds the bound by at most the request's replies, and only until that request returns.
//    A victim is evicted at once (its output dropped, nothing more queued or run for it) and
//    closed after the current request: the connection being served may be one (its
//    ProcessInput then returns false), and no other connection is closed mid-dispatch.
//  - Optional token: when non-empty, a connection's first message must be ctrun's AUTH carrying
//    the same token (docs/store.md); anything else is refused, logged and closed. Until then a
//    connection is refused at its first byte unless that byte starts an AUTH, so it never holds
//    more input than one AUTH request (header + Limits::max_token_bytes), and it is closed if the
//    AUTH has not come within auth_timeout.
//  - Races: a client that disconnects while parked is unregistered from every waited key before
//    its fd is closed, so a later SET never writes to a reused fd; wake-ups to other connections
//    are buffered and flushed after the current request, never closing a connection mid-dispatch.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "base/status.h"
#include "base/unique_fd.h"
#include "store/protocol.h"
#include "sys/event_loop.h"

namespace ctrun::store {

struct ServerOptions {
  std::string bind_host = "127.0.0.1";  // "" or "0.0.0.0": every IPv4 address; "::" every address
  int port = 0;                         // 0: pick a free port (see StoreServer::port())
  int backlog = 4096;
  size_t max_connections = 8192;
  size_t max_value_bytes = 256u << 20;
  size_t max_key_bytes = 1u << 20;
  size_t max_pending_output = 64u << 20;  // per connection; reading pauses above it
  // All connections' pending output together; over it the largest holders are closed (logged).
  // Keep it well above max_value_bytes: one reply to a client that does read may be briefly
  // unsent. 0: no bound (each connection is still bounded by max_pending_output).
  size_t max_total_pending_output = 1u << 30;
  // One MULTI_GET reply, all its values together (as large as the biggest request by default).
  // A request may name a key up to 128K times, so without it one small request could ask for a
  // reply of 128K values; a longer reply closes the connection, logged, before it is built.
  // Other replies hold at most one value (max_value_bytes) and are not checked against it.
  size_t max_multi_get_reply = (256u << 20) + (16u << 20);
  std::string token;                      // empty: no AUTH required
  // With a token: a connection that has not authenticated this long after it was accepted is
  // closed (ctrun's clients send AUTH as soon as they connect). Zero: no deadline.
  Duration auth_timeout = std::chrono::seconds(30);
  // Non-zero: accepted sockets get TCP keepalive and TCP_USER_TIMEOUT from it (TunePeerSocket),
  // so a peer whose machine died or whose link was cut is closed instead of kept forever.
  Duration peer_timeout{0};
};

class StoreServer {
 public:
  static StatusOr<std::unique_ptr<StoreServer>> Start(EventLoop& loop, const ServerOptions& opts);
  ~StoreServer();  // closes the listener and every connection; must run on the loop thread
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const { return port_; }  // actual bound port
  // Drops every key and queue (between restart attempts). Parked waits stay parked: they wait
  // for keys that did not exist, and still do not.
  void Clear();
  size_t num_keys() const { return num_keys_.load(std::memory_order_relaxed); }
  size_t num_connections() const { return num_connections_.load(std::memory_order_relaxed); }
  // Connections currently parked in WAIT (tests).
  size_t num_waiting() const { return num_waiting_.load(std::memory_order_relaxed); }
  // Bytes of replies queued and not yet sent, over every connection (tests and metrics).
  size_t total_pending_output() const {
    return total_pending_output_.load(std::memory_order_relaxed);
  }

 private:
  struct Conn;
  using ConnId = uint64_t;

  StoreServer(EventLoop& loop, const ServerOptions& opts);
  Status Listen();
  void OnAccept();
  void OnConnEvent(ConnId id, uint32_t events);
  void ReadFrom(Conn& c);
  // Decodes and executes every complete request in c's input; false: close c.
  bool ProcessInput(Conn& c);
  bool Execute(Conn& c, Request& req);
  // `reason`, when not empty, is what repeats are recognised by instead of `what` (which may then
  // carry numbers that differ each time).
  void WarnPeer(const Conn& c, const std::string& what, const std::string& reason = "");
  void Send(Conn& c, std::string_view bytes);
  // The running total of pending output (total_pending_); every change of a Conn's pending()
  // goes through one of these.
  void AddPending(size_t n);
  void SubPending(size_t n);
  void DropOutput(Conn& c);  // discards c's unsent output
  // Over max_total_pending_output: evicts the largest holders until the total is within it.
  void EnforceTotalBound();
  void CloseEvicted();  // closes the connections EnforceTotalBound evicted; never mid-dispatch
  void FlushDirty();
  // Writes what the socket takes; false on a write error.
  bool Flush(Conn& c);
  void UpdateInterest(Conn& c);
  void Close(ConnId id, const char* why);

  // The key space.
  void DoSet(const std::string& key, std::string value);
  void WakeWaiters(const std::string& key, bool only_one);
  bool Exists(const std::string& key) const;
  void Park(Conn& c, const std::vector<std::string>& keys);
  void Unpark(Conn& c);
  void UpdateCounts();

  EventLoop& loop_;
  ServerOptions opts_;
  Limits limits_;
  UniqueFd listen_fd_;
  int port_ = 0;
  TimerQueue::TimerId accept_retry_timer_ = 0;
  uint64_t refused_over_limit_ = 0;

  std::unordered_map<ConnId, std::unique_ptr<Conn>> conns_;
  ConnId next_id_ = 1;
  std::vector<ConnId> dirty_;  // connections with output queued by another connection's request
  std::vector<ConnId> evicted_;  // over the total bound: closed once the current request is done
  size_t total_pending_ = 0;     // sum of every connection's pending()

  std::unordered_map<std::string, std::string> kv_;
  std::unordered_set<std::string> warned_;  // "<host>\n<what>" already warned about (WarnPeer)
  std::unordered_map<std::string, std::deque<std::string>> queues_;
  // key -> connections parked on it (in arrival order)
  std::unordered_map<std::string, std::vector<ConnId>> waiters_;

  std::atomic<size_t> num_keys_{0};
  std::atomic<size_t> num_connections_{0};
  std::atomic<size_t> num_waiting_{0};
  std::atomic<size_t> total_pending_output_{0};  // total_pending_, published as it changes
  size_t parked_ = 0;
};

}  // namespace ctrun::store
