#include "store/store_client.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "store/client_util.h"
#include "sys/posix_util.h"

namespace ctrun::store {
namespace {

constexpr auto kCancelGrace = std::chrono::seconds(5);

TimePoint Now() { return std::chrono::steady_clock::now(); }

// Milliseconds left until deadline, rounded up, >= 0.
int MsLeft(TimePoint deadline) {
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(deadline - Now()).count();
  return ms <= 0 ? 0 : static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

// Waits for `events` on fd until deadline: 1 ready, 0 timed out, -1 error (errno).
int PollUntil(int fd, short events, TimePoint deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int ms = MsLeft(deadline);
    int n = ::poll(&p, 1, ms);
    if (n < 0 && errno == EINTR) continue;
    if (n != 0 || ms == 0) return n < 0 ? -1 : n;
    // poll may return early by a tick; loop until the deadline has really passed.
    if (Now() >= deadline) return 0;
  }
}

void SleepUntil(TimePoint t) {
  auto d = t - Now();
  if (d <= Duration::zero()) return;
  timespec ts{static_cast<time_t>(d.count() / 1000000000), static_cast<long>(d.count() % 1000000000)};
  while (::nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

// One non-blocking connect attempt bounded by deadline; returns the socket or sets *err.
UniqueFd TryConnect(const addrinfo* ai, TimePoint deadline, int* err) {
  UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) {
    *err = errno;
    return {};
  }
  if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      *err = errno;
      return {};
    }
    int r = PollUntil(fd.get(), POLLOUT, deadline);
    if (r <= 0) {
      *err = r == 0 ? ETIMEDOUT : errno;
      return {};
    }
    int so = 0;
    socklen_t len = sizeof so;
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so, &len);
    if (so != 0) {
      *err = so;
      return {};
    }
  }
  int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

}  // namespace

StatusOr<std::unique_ptr<StoreClient>> StoreClient::Connect(const ClientOptions& opts) {
  std::unique_ptr<StoreClient> c(new StoreClient(opts));
  if (Status st = c->EnsureConnected(Now() + opts.connect_timeout); !st.ok()) return st;
  return c;
}

StoreClient::~StoreClient() = default;

void StoreClient::Disconnect() {
  fd_.reset();
  rbuf_.clear();
  rbuf_off_ = 0;
}

Status StoreClient::Fail(Status st) {
  Disconnect();
  return st;
}

Status StoreClient::EnsureConnected(TimePoint deadline) {
  if (fd_) return Status::Ok();
  const std::string where = opts_.host + ":" + std::to_string(opts_.port);
  Duration backoff = kConnectMinBackoff;
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* res = nullptr;
    std::string port = std::to_string(opts_.port);
    int err = 0;
    std::string why;
    int gai = ::getaddrinfo(opts_.host.c_str(), port.c_str(), &hints, &res);
    if (gai != 0) {
      why = gai_strerror(gai);
      if (gai != EAI_AGAIN && gai != EAI_NONAME) return Status::Error("store: resolve " + where + ": " + why);
    } else {
      for (addrinfo* ai = res; ai && !fd_; ai = ai->ai_next) fd_ = TryConnect(ai, deadline, &err);
      ::freeaddrinfo(res);
      if (fd_) {
        rbuf_.clear();
        rbuf_off_ = 0;
        if (Status st = Handshake(deadline); !st.ok()) return Fail(st);
        return Status::Ok();
      }
      why = std::strerror(err);
      if (!RetryableConnectError(err)) return Status::Error("store: connect " + where + ": " + why);
    }
    if (Now() + backoff >= deadline) {
      return Status::Error("store: could not connect to " + where + " before the timeout: " + why);
    }
    SleepUntil(Now() + backoff);
    backoff = std::min<Duration>(backoff * 2, kConnectMaxBackoff);
  }
}

Status StoreClient::Handshake(TimePoint deadline) {
  std::string bytes;
  if (!opts_.token.empty()) {
    EncodeRequest(opts_.dialect, AuthRequest(opts_.token), &bytes);
    if (Status st = SendRaw(bytes, deadline); !st.ok()) return st;
    std::string ack;
    if (Status st = ReadExact(1, &ack, deadline); !st.ok()) {
      return Status::Error("store: the server refused the AUTH token (" + st.message() + ")");
    }
    if (static_cast<uint8_t>(ack[0]) != kAuthOk) return Status::Error("store: bad AUTH reply");
    bytes.clear();
  }
  if (opts_.dialect == Dialect::kModern) {
    EncodeRequest(opts_.dialect, ValidateRequest(), &bytes);
    return SendRaw(bytes, deadline);
  }
  return Status::Ok();
}

Status StoreClient::SendRaw(std::string_view bytes, TimePoint deadline) {
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = RetryOnEintr(
        [&] { return ::send(fd_.get(), bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL); });
    if (n > 0) {
      off += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return Status::Errno("store: send", errno);
    int r = PollUntil(fd_.get(), POLLOUT, deadline);
    if (r == 0) return Status::Error("store: send timed out");
    if (r < 0) return Status::Errno("store: poll", errno);
  }
  return Status::Ok();
}

Status StoreClient::SendRequest(const Request& req, TimePoint deadline) {
  std::string bytes;
  if (!EncodeRequest(opts_.dialect, req, &bytes)) {
    return Status::Error(std::string("store: ") + OpName(req.op) + " is not part of the " +
                         DialectName(opts_.dialect) + " dialect");
  }
  if (Status st = EnsureConnected(deadline); !st.ok()) return st;
  if (Status st = SendRaw(bytes, deadline); !st.ok()) return Fail(st);
  return Status::Ok();
}

Status StoreClient::ReadExact(size_t n, std::string* out, TimePoint deadline) {
  char buf[64 * 1024];
  while (rbuf_.size() - rbuf_off_ < n) {
    ssize_t got = RetryOnEintr([&] { return ::recv(fd_.get(), buf, sizeof buf, 0); });
    if (got > 0) {
      rbuf_.append(buf, static_cast<size_t>(got));
      continue;
    }
    if (got == 0) return Status::Error("store: connection closed by the server");
    if (errno != EAGAIN && errno != EWOULDBLOCK) return Status::Errno("store: recv", errno);
    int r = PollUntil(fd_.get(), POLLIN, deadline);
    if (r == 0) return Status::Error("store: timed out waiting for a reply");
    if (r < 0) return Status::Errno("store: poll", errno);
  }
  out->assign(rbuf_, rbuf_off_, n);
  rbuf_off_ += n;
  if (rbuf_off_ == rbuf_.size()) {
    rbuf_.clear();
    rbuf_off_ = 0;
  }
  return Status::Ok();
}

StatusOr<uint8_t> StoreClient::ReadU8Reply(TimePoint deadline) {
  std::string b;
  if (Status st = ReadExact(1, &b, deadline); !st.ok()) return Fail(st);
  return static_cast<uint8_t>(b[0]);
}

StatusOr<int64_t> StoreClient::ReadI64Reply(TimePoint deadline) {
  std::string b;
  if (Status st = ReadExact(8, &b, deadline); !st.ok()) return Fail(st);
  std::string_view v(b);
  int64_t x = 0;
  ReadI64(&v, &x);
  return x;
}

StatusOr<std::string> StoreClient::ReadBytesReply(TimePoint deadline) {
  std::string b;
  if (Status st = ReadExact(8, &b, deadline); !st.ok()) return Fail(st);
  std::string_view v(b);
  uint64_t len = 0;
  ReadU64(&v, &len);
  if (len > opts_.max_value_bytes) {
    return Fail(Status::Error("store: reply of " + std::to_string(len) + " bytes over the limit"));
  }
  std::string value;
  if (Status st = ReadExact(static_cast<size_t>(len), &value, deadline); !st.ok()) return Fail(st);
  return value;
}

Status StoreClient::SendOnly(const Request& req) {
  std::lock_guard<std::mutex> lock(mu_);
  return SendRequest(req, Now() + opts_.timeout);
}

Status StoreClient::Set(std::string_view key, std::string_view value) {
  return SendOnly(MakeRequest(Op::kSet, {std::string(key)}, {std::string(value)}));
}

StatusOr<std::string> StoreClient::Get(std::string_view key) { return Get(key, opts_.timeout); }

StatusOr<std::string> StoreClient::Get(std::string_view key, Duration timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> keys = {std::string(key)};
  auto ready = WaitLocked(keys, timeout);
  if (!ready.ok()) return ready.status();
  if (!*ready) return Status::Error("store wait timed out: key " + keys[0] + " not set");
  Request r = MakeRequest(Op::kGet, std::move(keys));
  TimePoint deadline = Now() + opts_.timeout;
  if (Status st = SendRequest(r, deadline); !st.ok()) return st;
  return ReadBytesReply(deadline);
}

StatusOr<int64_t> StoreClient::Add(std::string_view key, int64_t delta) {
  std::lock_guard<std::mutex> lock(mu_);
  Request r = MakeRequest(Op::kAdd, {std::string(key)});
  r.delta = delta;
  TimePoint deadline = Now() + opts_.timeout;
  if (Status st = SendRequest(r, deadline); !st.ok()) return st;
  return ReadI64Reply(deadline);
}

StatusOr<std::string> StoreClient::CompareSet(std::string_view key, std::string_view expected,
                                              std::string_view desired) {
  std::lock_guard<std::mutex> lock(mu_);
  Request r = MakeRequest(Op::kCompareSet, {std::string(key)},
                          {std::string(expected), std::string(desired)});
  TimePoint deadline = Now() + opts_.timeout;
  if (Status st = SendRequest(r, deadline); !st.ok()) return st;
  return ReadBytesReply(deadline);
}

StatusOr<bool> StoreClient::WaitLocked(const std::vector<std::string>& keys, Duration timeout) {
  Request r = MakeRequest(Op::kWait, keys);
  TimePoint deadline = Now() + timeout;
  if (Status st = SendRequest(r, deadline); !st.ok()) return st;
  std::string b;
  Status st = ReadExact(1, &b, deadline);
  if (st.ok()) {
    if (static_cast<uint8_t>(b[0]) != kStopWaiting) return Fail(Status::Error("store: bad WAIT reply"));
    return true;
  }
  if (!fd_ || Now() < deadline) return Fail(st);  // an I/O error, not the deadline
  if (opts_.dialect == Dialect::kLegacy) {
    // torch <= 1.13 servers have no CANCEL_WAIT: the parked connection is useless now.
    Disconnect();
    return false;
  }
  // Unpark on the server. A STOP_WAITING may race ahead of WAIT_CANCELED: then the keys did arrive.
  Request cancel = MakeRequest(Op::kCancelWait);
  TimePoint grace = Now() + kCancelGrace;
  if (Status s2 = SendRequest(cancel, grace); !s2.ok()) return false;
  bool satisfied = false;
  for (;;) {
    auto reply = ReadU8Reply(grace);
    if (!reply.ok()) return false;  // connection dropped; the next call reconnects
    if (*reply == kWaitCanceled) return satisfied;
    if (*reply != kStopWaiting) {
      Disconnect();  // a bad CANCEL_WAIT reply: the connection cannot be trusted any more
      return false;
    }
    satisfied = true;
  }
}

Status StoreClient::Wait(const std::vector<std::string>& keys) { return Wait(keys, opts_.timeout); }

Status StoreClient::Wait(const std::vector<std::string>& keys, Duration timeout) {
  auto r = TryWait(keys, timeout);
  if (!r.ok()) return r.status();
  if (!*r) {
    return Status::Error("store wait timed out after " + FormatSeconds(ToSeconds(timeout)) +
                         " for keys " + KeyList(keys));
  }
  return Status::Ok();
}

StatusOr<bool> StoreClient::TryWait(const std::vector<std::string>& keys, Duration timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  return WaitLocked(keys, timeout);
}

StatusOr<bool> StoreClient::Check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  Request r = MakeRequest(Op::kCheck, keys);
  TimePoint deadline = Now() + opts_.timeout;
  if (Status st = SendRequest(r, deadline); !st.ok()) return st;
  auto reply = ReadU8Reply(deadline);
  if (!reply.ok()) return reply.status();
  return *reply == kCheckReady;
}

StatusOr<bool> StoreClient::DeleteKey(std::string_view key) {
  std::lock_guard<std::mutex> lock(mu_);
  Request r = MakeRequest(Op::kDeleteKey, {std::string(key)});
  TimePoint deadline = Now() + opts_.timeout;
  if (Status st = SendRequest(r, deadline); !st.ok()) return st;
  auto n = ReadI64Reply(deadline);
  if (!n.ok()) return n.status();
  return *n == 1;
}

StatusOr<int64_t> StoreClient::NumKeys() {
  std::lock_guard<std::mutex> lock(mu_);
  Request r = MakeRequest(Op::kNumKeys);
  TimePoint deadline = Now() + opts_.timeout;
  if (Status st = SendRequest(r, deadline); !st.ok()) return st;
  return ReadI64Reply(deadline);
}

StatusOr<std::vector<std::string>> StoreClient::MultiGet(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  auto ready = WaitLocked(keys, opts_.timeout);
  if (!ready.ok()) return ready.status();
  if (!*ready) return Status::Error("store wait timed out: keys " + KeyList(keys) + " not set");
  Request r = MakeRequest(Op::kMultiGet, keys);
  TimePoint deadline = Now() + opts_.timeout;
  if (Status st = SendRequest(r, deadline); !st.ok()) return st;
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    auto v = ReadBytesReply(deadline);
    if (!v.ok()) return v.status();
    values.push_back(std::move(*v));
  }
  return values;
}

Status StoreClient::MultiSet(const std::vector<std::string>& keys,
                             const std::vector<std::string>& values) {
  if (keys.size() != values.size()) return Status::Error("store: MultiSet needs one value per key");
  return SendOnly(MakeRequest(Op::kMultiSet, keys, values));
}

Status StoreClient::Append(std::string_view key, std::string_view value) {
  return SendOnly(MakeRequest(Op::kAppend, {std::string(key)}, {std::string(value)}));
}

Status StoreClient::Ping() {
  std::lock_guard<std::mutex> lock(mu_);
  TimePoint deadline = Now() + opts_.timeout;
  Request r;
  if (opts_.dialect == Dialect::kLegacy) {
    r.op = Op::kNumKeys;  // no PING before torch 2.3; any round trip will do
    if (Status st = SendRequest(r, deadline); !st.ok()) return st;
    return ReadI64Reply(deadline).status();
  }
  r.op = Op::kPing;
  r.u32 = next_nonce_++;
  if (Status st = SendRequest(r, deadline); !st.ok()) return st;
  std::string b;
  if (Status st = ReadExact(4, &b, deadline); !st.ok()) return Fail(st);
  std::string_view v(b);
  uint32_t echo = 0;
  ReadU32(&v, &echo);
  if (echo != r.u32) return Fail(Status::Error("store: PING reply does not match"));
  return Status::Ok();
}

}  // namespace ctrun::store
