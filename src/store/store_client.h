// StoreClient: blocking c10d TCPStore client with a deadline on every call. Used by ctrun agents
// (multi-node rendezvous), the worker library, tests and benchmarks.
//
// Contract:
//  - Speaks the torch >= 2.1 dialect by default (VALIDATE on connect, CANCEL_WAIT on a timed-out
//    wait, PING); Dialect::kLegacy speaks torch <= 2.0 so it also works against a torch 1.13
//    server (which lacks APPEND/MULTI_*/CANCEL_WAIT/PING: Append/MultiGet/MultiSet fail there, Ping
//    falls back to GETNUMKEYS).
//  - Keys are sent as given: no prefix is added (torch 1.13 clients add "/"; do that yourself to
//    share keys with them).
//  - Connect retries refused/unreachable connections with capped exponential backoff until
//    connect_timeout. Every call then has a deadline (options.timeout unless it takes one); on a
//    timeout or I/O error the call fails with a Status and the connection is dropped, and the next
//    call reconnects (within its own deadline). An operation that failed mid-way may or may not
//    have been applied.
//  - Get/MultiGet first wait for the keys (as torch's client does), because the server closes a
//    connection that GETs a missing key.
//  - Thread-safe: calls are serialized by an internal mutex (one request in flight, like torch).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "base/unique_fd.h"
#include "store/protocol.h"

namespace ctrun::store {

struct ClientOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  Duration connect_timeout = Seconds(60);
  Duration timeout = Seconds(300);  // default deadline of each call
  Dialect dialect = Dialect::kModern;
  std::string token;  // sent as ctrun AUTH before anything else when non-empty
  size_t max_value_bytes = 256u << 20;  // refuse larger replies instead of allocating them
};

class StoreClient {
 public:
  // Connects (with retry) before returning.
  static StatusOr<std::unique_ptr<StoreClient>> Connect(const ClientOptions& opts);
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  Status Set(std::string_view key, std::string_view value);
  StatusOr<std::string> Get(std::string_view key);  // waits up to options.timeout for the key
  StatusOr<std::string> Get(std::string_view key, Duration timeout);
  StatusOr<int64_t> Add(std::string_view key, int64_t delta);
  // torch semantics: returns the value now stored. Missing key: sets and returns `desired` when
  // `expected` is empty, else returns `expected` without setting.
  StatusOr<std::string> CompareSet(std::string_view key, std::string_view expected,
                                   std::string_view desired);
  // Blocks until every key exists. A timeout is an error whose message starts with
  // "store wait timed out".
  Status Wait(const std::vector<std::string>& keys, Duration timeout);
  Status Wait(const std::vector<std::string>& keys);
  // true: every key existed within `timeout`; false: timed out (the connection stays usable).
  StatusOr<bool> TryWait(const std::vector<std::string>& keys, Duration timeout);
  StatusOr<bool> Check(const std::vector<std::string>& keys);
  StatusOr<bool> DeleteKey(std::string_view key);  // true if it existed
  StatusOr<int64_t> NumKeys();
  StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys);
  Status MultiSet(const std::vector<std::string>& keys, const std::vector<std::string>& values);
  Status Append(std::string_view key, std::string_view value);
  Status Ping();

  const ClientOptions& options() const { return opts_; }

 private:
  explicit StoreClient(const ClientOptions& opts) : opts_(opts) {}

  Status EnsureConnected(TimePoint deadline);
  Status Handshake(TimePoint deadline);
  // Sends one request; on failure the connection is dropped.
  Status SendRequest(const Request& req, TimePoint deadline);
  Status SendRaw(std::string_view bytes, TimePoint deadline);
  Status SendOnly(const Request& req);  // locks; for requests without a reply
  // Reads exactly n reply bytes into *out.
  Status ReadExact(size_t n, std::string* out, TimePoint deadline);
  StatusOr<uint8_t> ReadU8Reply(TimePoint deadline);
  StatusOr<int64_t> ReadI64Reply(TimePoint deadline);
  StatusOr<std::string> ReadBytesReply(TimePoint deadline);
  StatusOr<bool> WaitLocked(const std::vector<std::string>& keys, Duration timeout);
  void Disconnect();        // drops the connection; the next call reconnects
  Status Fail(Status st);  // Disconnect(), then returns st

  ClientOptions opts_;
  std::mutex mu_;
  UniqueFd fd_;
  std::string rbuf_;   // bytes received but not yet consumed
  size_t rbuf_off_ = 0;
  uint32_t next_nonce_ = 1;
};

}  // namespace ctrun::store
