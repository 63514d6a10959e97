// Pieces shared by the two TCPStore clients: the blocking StoreClient (store_client.h) and the
// event-driven AsyncStoreClient (async_store_client.h). Wire encoding itself lives in protocol.h.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "base/clock.h"
#include "store/protocol.h"

namespace ctrun::store {

// Connect retry backoff: starts at kConnectMinBackoff, doubles per failed round, capped.
inline constexpr Duration kConnectMinBackoff = std::chrono::milliseconds(10);
inline constexpr Duration kConnectMaxBackoff = std::chrono::milliseconds(1000);

// True for connect(2) errors worth retrying until the connect deadline: the server may simply not
// listen yet (agents start before the host's store) or the network is briefly unreachable.
bool RetryableConnectError(int err);

Request MakeRequest(Op op, std::vector<std::string> keys = {},
                    std::vector<std::string> values = {});
// ctrun AUTH carrying `token` (first message of a connection).
Request AuthRequest(const std::string& token);
// Modern-dialect VALIDATE (first message, or first after AUTH).
Request ValidateRequest();

// Client socket options: TCP_NODELAY, and TCP keepalive plus TCP_USER_TIMEOUT tuned so that a
// silently cut link (peer host gone, cable pulled) errors the socket within about `op_timeout`
// even while the connection is idle or parked in WAIT: keepalive starts after op_timeout/2 idle,
// probes every op_timeout/6 (both at least 1 s), 3 probes; unacknowledged data for op_timeout
// also closes it. Best effort: failures are ignored (a platform without one option still works).
void TunePeerSocket(int fd, Duration op_timeout);

// "[a, b, ...]" with at most 8 keys, for error messages.
std::string KeyList(const std::vector<std::string>& keys);

}  // namespace ctrun::store
