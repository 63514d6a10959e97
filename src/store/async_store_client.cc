#include "store/async_store_client.h"

#include <netdb.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "store/client_util.h"
#include "sys/posix_util.h"

namespace ctrun::store {
namespace {

constexpr size_t kReadChunk = 64 * 1024;
constexpr int kMaxReadsPerEvent = 16;  // then yield to other fds; level-triggered, so no loss
constexpr size_t kCompactAt = 1u << 20;

bool ExpectsReply(Op op) {
  switch (op) {
    case Op::kSet:
    case Op::kAppend:
    case Op::kMultiSet:
    case Op::kQueuePush:
    case Op::kValidate:
      return false;
    default:
      return true;
  }
}

std::string Where(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

TimePoint DeadlineAfter(TimePoint now, Duration d) {
  return d >= TimePoint::max() - now ? TimePoint::max() : now + d;
}

std::string SecondsText(Duration d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", ToSeconds(d));
  return buf;
}

}  // namespace

// --- creation and teardown ---------------------------------------------------------------------

namespace {

// EAI_NONAME / EAI_AGAIN (and EAI_NODATA where glibc has it): a name that does not resolve *yet*
// (a pod's DNS record is published after the other pods start) or a resolver that did not answer.
bool RetryableResolveError(int gai) {
#ifdef EAI_NODATA
  if (gai == EAI_NODATA) return true;
#endif
  return gai == EAI_NONAME || gai == EAI_AGAIN;
}

}  // namespace

// getaddrinfo for host:port; *gai gets its code (0 on success).
std::vector<AsyncStoreClient::Address> AsyncStoreClient::Resolve(const std::string& host, int port, int* gai) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::vector<AsyncStoreClient::Address> addrs;
  *gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (*gai != 0) return addrs;
  for (const addrinfo* ai = res; ai; ai = ai->ai_next) {
    if (ai->ai_addrlen > sizeof(sockaddr_storage)) continue;
    AsyncStoreClient::Address a;
    std::memcpy(&a.addr, ai->ai_addr, ai->ai_addrlen);
    a.len = ai->ai_addrlen;
    addrs.push_back(a);
  }
  ::freeaddrinfo(res);
  return addrs;
}

StatusOr<std::unique_ptr<AsyncStoreClient>> AsyncStoreClient::Create(
    EventLoop& loop, const AsyncClientOptions& opts) {
  const std::string where = Where(opts.host, opts.port);
  if (opts.port <= 0 || opts.port > 65535) return Status::Error("store: bad port in " + where);
  int gai = 0;
  std::vector<Address> addrs = Resolve(opts.host, opts.port, &gai);
  if (gai != 0 && !RetryableResolveError(gai))
    return Status::Error("store: cannot resolve " + where + ": " + gai_strerror(gai));
  if (gai == 0 && addrs.empty()) return Status::Error("store: no usable address for " + where);
  return std::unique_ptr<AsyncStoreClient>(new AsyncStoreClient(loop, opts, std::move(addrs)));
}

AsyncStoreClient::AsyncStoreClient(EventLoop& loop, const AsyncClientOptions& opts,
                                   std::vector<Address> addrs)
    : loop_(loop), opts_(opts), addrs_(std::move(addrs)), where_(Where(opts.host, opts.port)) {}

AsyncStoreClient::~AsyncStoreClient() {
  CloseFd();
  for (TimerQueue::TimerId t : {kick_timer_, deadline_timer_, connect_timer_, backoff_timer_}) {
    if (t) loop_.CancelTimer(t);
  }
  // Pending callbacks are destroyed without running; alive_ expires, so a handler that is
  // delivering callbacks right now stops.
}

// --- requests ----------------------------------------------------------------------------------

template <typename T, typename Pick>
AsyncStoreClient::ReplyCallback AsyncStoreClient::Adapt(Callback<T> done, Pick pick) {
  if (!done) return nullptr;
  return [done = std::move(done), pick](StatusOr<Reply> r) {
    if (!r.ok()) return done(r.status());
    done(pick(*r));
  };
}

AsyncStoreClient::ReplyCallback AsyncStoreClient::AdaptStatus(DoneCallback done) {
  if (!done) return nullptr;
  return [done = std::move(done)](StatusOr<Reply> r) { done(r.status()); };
}

AsyncStoreClient::Pending& AsyncStoreClient::Enqueue(const Request& req, ReplyCallback done) {
  Pending p;
  p.op = req.op;
  EncodeRequest(Dialect::kModern, req, &p.bytes);  // every op used here exists in it
  p.done = std::move(done);
  queue_.push_back(std::move(p));
  ScheduleKick();
  return queue_.back();
}

void AsyncStoreClient::Set(std::string key, std::string value, DoneCallback done) {
  Enqueue(MakeRequest(Op::kSet, {std::move(key)}, {std::move(value)}),
          AdaptStatus(std::move(done)));
}

void AsyncStoreClient::Add(std::string key, int64_t delta, Callback<int64_t> done) {
  Request r = MakeRequest(Op::kAdd, {std::move(key)});
  r.delta = delta;
  Enqueue(r, Adapt(std::move(done), [](Reply& x) { return x.i; }));
}

void AsyncStoreClient::CompareSet(std::string key, std::string expected, std::string desired,
                                  Callback<std::string> done) {
  Enqueue(MakeRequest(Op::kCompareSet, {std::move(key)}, {std::move(expected), std::move(desired)}),
          Adapt(std::move(done), [](Reply& x) { return std::move(x.s); }));
}

void AsyncStoreClient::Get(std::string key, Callback<std::string> done) {
  Enqueue(MakeRequest(Op::kGet, {std::move(key)}),
          Adapt(std::move(done), [](Reply& x) { return std::move(x.s); }));
}

void AsyncStoreClient::Check(std::vector<std::string> keys, Callback<bool> done) {
  Enqueue(MakeRequest(Op::kCheck, std::move(keys)),
          Adapt(std::move(done), [](Reply& x) { return x.i == kCheckReady; }));
}

AsyncStoreClient::WaitId AsyncStoreClient::Wait(std::vector<std::string> keys,
                                                std::optional<Duration> timeout,
                                                Callback<bool> done) {
  Pending& p = Enqueue(MakeRequest(Op::kWait, std::move(keys)),
                       Adapt(std::move(done), [](Reply& x) { return x.i != 0; }));
  p.wait_id = next_wait_id_++;
  if (timeout) p.deadline = DeadlineAfter(loop_.Now(), *timeout);
  return p.wait_id;
}

void AsyncStoreClient::CancelWait(WaitId id) {
  if (id == 0) return;
  std::erase_if(ready_, [id](const Ready& r) { return r.wait_id == id; });
  auto is_it = [id](const Pending& p) { return p.op == Op::kWait && p.wait_id == id; };
  if (auto it = std::find_if(queue_.begin(), queue_.end(), is_it); it != queue_.end()) {
    queue_.erase(it);
    return;
  }
  auto it = std::find_if(inflight_.begin(), inflight_.end(), is_it);
  if (it == inflight_.end()) return;
  it->done = nullptr;
  if (!it->cancel_sent) {
    SendCancel(*it);
    ScheduleKick();
  }
}

void AsyncStoreClient::DeleteKey(std::string key, Callback<bool> done) {
  Enqueue(MakeRequest(Op::kDeleteKey, {std::move(key)}),
          Adapt(std::move(done), [](Reply& x) { return x.i > 0; }));
}

void AsyncStoreClient::MultiGet(std::vector<std::string> keys,
                                Callback<std::vector<std::string>> done) {
  const size_t n = keys.size();
  Enqueue(MakeRequest(Op::kMultiGet, std::move(keys)),
          Adapt(std::move(done), [](Reply& x) { return std::move(x.v); }))
      .count = n;
}

void AsyncStoreClient::Ping(DoneCallback done) {
  Request r = MakeRequest(Op::kPing);
  r.u32 = next_nonce_++;
  Enqueue(r, AdaptStatus(std::move(done))).nonce = r.u32;
}

// --- scheduling --------------------------------------------------------------------------------

void AsyncStoreClient::ScheduleKick() {
  if (kick_timer_) return;
  kick_timer_ = loop_.AddTimerAfter(Duration::zero(), [this, g = Guard()] {
    if (g.expired()) return;
    kick_timer_ = 0;
    Kick();
  });
}

void AsyncStoreClient::Kick() {
  if (state_ == State::kIdle && !queue_.empty()) StartConnect();
  Progress();
  Deliver();
}

void AsyncStoreClient::Progress() {
  while (state_ == State::kConnected) {
    Pump();
    if (!Flush() || !Drain()) break;
    // A completed WAIT may have released queued requests.
    if (wait_parked_ || queue_.empty()) break;
  }
  ArmDeadlineTimer();
}

void AsyncStoreClient::Deliver() {
  std::weak_ptr<char> guard = Guard();
  while (!ready_.empty()) {
    std::function<void()> run = std::move(ready_.front().run);
    ready_.pop_front();
    run();
    if (guard.expired()) return;  // a callback destroyed the client
  }
}

void AsyncStoreClient::Complete(Pending& p, StatusOr<Reply> r) {
  if (!p.done) return;
  ready_.push_back({p.op == Op::kWait ? p.wait_id : 0,
                    [cb = std::move(p.done), r = std::move(r)]() mutable { cb(std::move(r)); }});
}

// --- connecting --------------------------------------------------------------------------------

void AsyncStoreClient::StartConnect() {
  connect_deadline_ = DeadlineAfter(loop_.Now(), opts_.connect_timeout);
  backoff_ = kConnectMinBackoff;
  addr_index_ = 0;
  said_unreachable_ = false;
  last_connect_error_ = "no attempt finished";
  connect_timer_ = loop_.AddTimer(connect_deadline_, [this, g = Guard()] {
    if (g.expired()) return;
    connect_timer_ = 0;
    OnConnectDeadline();
    Progress();
    Deliver();
  });
  TryConnect();
}

void AsyncStoreClient::TryConnect() {
  state_ = State::kConnecting;
  if (addrs_.empty()) {  // the name did not resolve yet: again now, then retried like a refusal
    int gai = 0;
    addrs_ = Resolve(opts_.host, opts_.port, &gai);
    if (addrs_.empty()) {
      last_connect_error_ = std::string("cannot resolve it: ") + (gai ? gai_strerror(gai) : "no usable address");
      if (gai != 0 && !RetryableResolveError(gai))
        return FailAll(Status::Error("store: cannot resolve " + where_ + ": " + gai_strerror(gai)));
      return RetryLater();
    }
  }
  const Address& a = addrs_[addr_index_];
  UniqueFd fd(::socket(a.addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return OnConnectError(errno);
  TunePeerSocket(fd.get(), opts_.op_timeout);
  // Non-blocking: the handshake goes on after EINPROGRESS (or EINTR); writability reports its
  // outcome, also when it finished at once.
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&a.addr), a.len) != 0 &&
      errno != EINPROGRESS && errno != EINTR) {
    return OnConnectError(errno);
  }
  fd_ = std::move(fd);
  Status st = loop_.AddFd(fd_.get(), EPOLLOUT, [this, g = Guard()](uint32_t events) {
    if (!g.expired()) OnIo(events);
  });
  if (!st.ok()) {
    fd_.reset();
    FailAll(Status::Error("store: " + st.message()));
  }
}

void AsyncStoreClient::OnConnectWritable() {
  int err = 0;
  socklen_t len = sizeof err;
  if (::getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  if (err != 0) return OnConnectError(err);
  OnConnected();
}

void AsyncStoreClient::OnConnectError(int err) {
  CloseFd();
  last_connect_error_ = std::strerror(err);
  if (!RetryableConnectError(err)) {
    return FailAll(Status::Error("store: connect to " + where_ + ": " + last_connect_error_));
  }
  if (++addr_index_ < addrs_.size()) return TryConnect();
  addr_index_ = 0;
  RetryLater();
}

void AsyncStoreClient::RetryLater() {
  // Said once, and only while the server was never reached: a connection lost later is reported
  // by its owner (a rendezvous that lost its store ends), not as a wait that will not happen.
  if (!said_unreachable_ && !ever_connected_ && opts_.on_unreachable) {
    said_unreachable_ = true;
    opts_.on_unreachable("cannot reach " + where_ + " yet (" + last_connect_error_ + "); retrying for up to " +
                         SecondsText(opts_.connect_timeout));
  }
  // Sleep, at most until the connect deadline, whose own timer then gives up.
  const TimePoint now = loop_.Now();
  if (now >= connect_deadline_) return OnConnectDeadline();
  state_ = State::kBackoff;
  const Duration sleep = std::min(backoff_, connect_deadline_ - now);
  backoff_timer_ = loop_.AddTimerAfter(sleep, [this, g = Guard()] {
    if (g.expired()) return;
    backoff_timer_ = 0;
    if (!ever_connected_ && opts_.before_retry) {
      opts_.before_retry();
      if (g.expired()) return;  // the hook destroyed the client
    }
    TryConnect();
    Progress();
    Deliver();
  });
  backoff_ = std::min(backoff_ * 2, kConnectMaxBackoff);
}

void AsyncStoreClient::OnConnectDeadline() {
  if (state_ == State::kConnecting || state_ == State::kBackoff) {
    FailAll(Status::Error("store: could not connect to " + where_ + " within " +
                          SecondsText(opts_.connect_timeout) + ": " + last_connect_error_));
  }
}

void AsyncStoreClient::OnConnected() {
  state_ = State::kConnected;
  ever_connected_ = true;
  if (connect_timer_) loop_.CancelTimer(connect_timer_);
  connect_timer_ = 0;
  // AUTH (when configured) and VALIDATE lead; requests are pipelined right behind them, since
  // the server handles a connection's bytes in order and closes it on a refused token.
  if (!opts_.token.empty()) {
    Pending auth;
    auth.op = Op::kAuth;
    auth.deadline = DeadlineAfter(loop_.Now(), opts_.op_timeout);
    EncodeRequest(Dialect::kModern, AuthRequest(opts_.token), &wbuf_);
    auth.end = wbuf_.size();
    inflight_.push_front(std::move(auth));
  }
  EncodeRequest(Dialect::kModern, ValidateRequest(), &wbuf_);
  queued_bytes_ = wbuf_.size();
  want_out_ = true;
  if (Status st = loop_.ModifyFd(fd_.get(), EPOLLIN | EPOLLOUT); !st.ok())
    FailAll(Status::Error("store: " + st.message()));  // nothing could ever be sent
}

// --- the connected socket ----------------------------------------------------------------------

void AsyncStoreClient::OnIo(uint32_t events) {
  if (state_ == State::kConnecting) {
    OnConnectWritable();
  } else if (state_ == State::kConnected && (events & (EPOLLIN | EPOLLHUP | EPOLLERR))) {
    ReadAvailable();
  }
  Progress();  // also flushes on EPOLLOUT
  Deliver();
}

void AsyncStoreClient::Pump() {
  const TimePoint now = loop_.Now();
  while (!queue_.empty() && !wait_parked_) {
    Pending p = std::move(queue_.front());
    queue_.pop_front();
    wbuf_ += p.bytes;
    queued_bytes_ += p.bytes.size();
    p.bytes = std::string();
    p.end = queued_bytes_;
    if (p.op == Op::kWait) {
      wait_parked_ = true;  // the server answers nothing else until it is satisfied or canceled
    } else {
      p.deadline = DeadlineAfter(now, opts_.op_timeout);
    }
    inflight_.push_back(std::move(p));
  }
}

bool AsyncStoreClient::Flush() {
  while (wbuf_off_ < wbuf_.size()) {
    ssize_t n = RetryOnEintr([&] {
      return ::send(fd_.get(), wbuf_.data() + wbuf_off_, wbuf_.size() - wbuf_off_, MSG_NOSIGNAL);
    });
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      FailAll(LostStatus(errno));
      return false;
    }
    if (n <= 0) break;
    wbuf_off_ += static_cast<size_t>(n);
    sent_bytes_ += static_cast<uint64_t>(n);
  }
  if (wbuf_off_ == wbuf_.size()) {
    wbuf_.clear();
    wbuf_off_ = 0;
  } else if (wbuf_off_ >= kCompactAt) {
    wbuf_.erase(0, wbuf_off_);
    wbuf_off_ = 0;
  }
  return UpdateInterest();
}

bool AsyncStoreClient::UpdateInterest() {
  const bool want = wbuf_off_ < wbuf_.size();
  if (want == want_out_) return true;
  want_out_ = want;
  if (Status st = loop_.ModifyFd(fd_.get(), EPOLLIN | (want ? EPOLLOUT : 0u)); !st.ok()) {
    FailAll(Status::Error("store: " + st.message()));  // the rest of the requests would never go out
    return false;
  }
  return true;
}

bool AsyncStoreClient::ReadAvailable() {
  char buf[kReadChunk];
  bool eof = false;
  int err = 0;
  for (int i = 0; i < kMaxReadsPerEvent; ++i) {
    ssize_t n = RetryOnEintr([&] { return ::recv(fd_.get(), buf, sizeof buf, 0); });
    if (n > 0) {
      rbuf_.append(buf, static_cast<size_t>(n));
      got_reply_ = true;
      if (static_cast<size_t>(n) < sizeof buf) break;
      continue;
    }
    if (n == 0) {
      eof = true;
    } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
      err = errno;
    }
    break;
  }
  // Replies that arrived before a close still complete (those ahead of a GET of a missing key).
  if (!Drain()) return false;
  if (eof || err != 0) {
    FailAll(LostStatus(err));
    return false;
  }
  return true;
}

bool AsyncStoreClient::Drain() {
  while (!inflight_.empty()) {
    Pending& p = inflight_.front();
    Reply reply;
    if (!ExpectsReply(p.op)) {
      if (sent_bytes_ < p.end) break;  // completes once the kernel took all of it
    } else {
      std::string_view in(rbuf_);
      in.remove_prefix(rbuf_off_);
      std::string err;
      Parse r = ParseReply(p, &in, &reply, &err);
      rbuf_off_ = rbuf_.size() - in.size();
      if (r == Parse::kNeedMore) break;
      if (r == Parse::kBad) {
        FailAll(Status::Error("store: bad " + std::string(OpName(p.op)) + " reply from " + where_ +
                              ": " + err));
        return false;
      }
    }
    if (p.op == Op::kWait && !p.cancel_sent) wait_parked_ = false;
    if (p.op != Op::kAuth) Complete(p, std::move(reply));
    inflight_.pop_front();
  }
  if (rbuf_off_ < rbuf_.size() && inflight_.empty()) {
    FailAll(Status::Error("store: unexpected bytes from " + where_ + " (no request pending)"));
    return false;
  }
  if (rbuf_off_ == rbuf_.size()) {
    rbuf_.clear();
    rbuf_off_ = 0;
  } else if (rbuf_off_ >= kCompactAt) {
    rbuf_.erase(0, rbuf_off_);
    rbuf_off_ = 0;
  }
  return true;
}

AsyncStoreClient::Parse AsyncStoreClient::ParseReply(Pending& p, std::string_view* in, Reply* out,
                                                     std::string* err) const {
  std::string_view v = *in;  // consumed only once the whole reply is there
  switch (p.op) {
    case Op::kAuth:
    case Op::kCheck: {
      uint8_t b = 0;
      if (!ReadU8(&v, &b)) return Parse::kNeedMore;
      if (p.op == Op::kAuth ? b != kAuthOk : b > kCheckNotReady) {
        *err = "unexpected byte " + std::to_string(b);
        return Parse::kBad;
      }
      out->i = b;
      break;
    }
    case Op::kWait:
      return ParseWaitReply(p, in, out, err);
    case Op::kAdd:
    case Op::kDeleteKey:
    case Op::kNumKeys:
    case Op::kQueueLen:
      if (!ReadI64(&v, &out->i)) return Parse::kNeedMore;
      break;
    case Op::kPing: {
      uint32_t echo = 0;
      if (!ReadU32(&v, &echo)) return Parse::kNeedMore;
      if (echo != p.nonce) {
        *err = "the echoed nonce does not match";
        return Parse::kBad;
      }
      break;
    }
    case Op::kGet:
    case Op::kCompareSet:
      if (Parse r = ReadValue(&v, opts_.max_value_bytes, &out->s, err); r != Parse::kDone) return r;
      break;
    case Op::kMultiGet: {
      std::string_view probe = v;  // check that all values are there before copying any
      for (size_t i = 0; i < p.count; ++i) {
        Parse r = ReadValue(&probe, opts_.max_value_bytes, nullptr, err);
        if (r != Parse::kDone) return r;
      }
      out->v.resize(p.count);
      for (auto& s : out->v) ReadValue(&v, opts_.max_value_bytes, &s, err);
      break;
    }
    default:
      *err = "a reply to a request that has none";
      return Parse::kBad;
  }
  *in = v;
  return Parse::kDone;
}

// WAIT's reply: STOP_WAITING; after a CANCEL_WAIT, WAIT_CANCELED, possibly preceded by a
// STOP_WAITING that crossed the cancel (the keys did arrive). Bytes are consumed one at a time and
// that STOP_WAITING is remembered in p.satisfied.
AsyncStoreClient::Parse AsyncStoreClient::ParseWaitReply(Pending& p, std::string_view* in,
                                                         Reply* out, std::string* err) {
  uint8_t b = 0;
  while (ReadU8(in, &b)) {
    if (b == kStopWaiting && !p.satisfied) {
      p.satisfied = true;
      if (p.cancel_sent) continue;
      out->i = 1;
      return Parse::kDone;
    }
    if (b == kWaitCanceled && p.cancel_sent) {
      out->i = p.satisfied ? 1 : 0;
      return Parse::kDone;
    }
    *err = "unexpected byte " + std::to_string(b);
    return Parse::kBad;
  }
  return Parse::kNeedMore;
}

AsyncStoreClient::Parse AsyncStoreClient::ReadValue(std::string_view* in, size_t max,
                                                    std::string* out, std::string* err) {
  std::string_view v = *in;
  uint64_t len = 0;
  if (!ReadU64(&v, &len)) return Parse::kNeedMore;
  if (len > max) {
    *err = "a value of " + std::to_string(len) + " bytes, over the limit";
    return Parse::kBad;
  }
  if (v.size() < len) return Parse::kNeedMore;
  if (out) out->assign(v.data(), static_cast<size_t>(len));
  v.remove_prefix(static_cast<size_t>(len));
  *in = v;
  return Parse::kDone;
}

// Appends CANCEL_WAIT behind the parked WAIT. The server then answers WAIT_CANCELED, and requests
// queued behind the wait may follow on the wire right away.
void AsyncStoreClient::SendCancel(Pending& wait) {
  wait.cancel_sent = true;
  wait.deadline = DeadlineAfter(loop_.Now(), opts_.op_timeout);
  wait_parked_ = false;
  const size_t before = wbuf_.size();
  EncodeRequest(Dialect::kModern, MakeRequest(Op::kCancelWait), &wbuf_);
  queued_bytes_ += wbuf_.size() - before;
}

Status AsyncStoreClient::LostStatus(int err) const {
  std::string msg = "store: connection to " + where_ + " lost (" +
                    (err ? std::strerror(err) : "closed by the server") + ")";
  const Op front = inflight_.empty() ? Op::kPing : inflight_.front().op;
  if (front == Op::kAuth) {
    msg += ": the server refused the AUTH token";
  } else if (front == Op::kGet || front == Op::kMultiGet) {
    msg += std::string(" during ") + OpName(front) + ": a missing key closes the connection";
  } else if (!got_reply_ && opts_.token.empty()) {
    msg += " before any reply: does the server require an AUTH token?";
  }
  return Status::Error(msg);
}

// --- deadlines ---------------------------------------------------------------------------------

void AsyncStoreClient::ArmDeadlineTimer() {
  TimePoint next = TimePoint::max();
  for (const Pending& p : inflight_) next = std::min(next, p.deadline);
  for (const Pending& p : queue_) next = std::min(next, p.deadline);  // only Waits have one
  if (next == armed_deadline_) return;
  if (deadline_timer_) loop_.CancelTimer(deadline_timer_);
  deadline_timer_ = 0;
  armed_deadline_ = next;
  if (next == TimePoint::max()) return;
  deadline_timer_ = loop_.AddTimer(next, [this, g = Guard()] {
    if (g.expired()) return;
    deadline_timer_ = 0;
    armed_deadline_ = TimePoint::max();
    OnDeadline();
  });
}

void AsyncStoreClient::OnDeadline() {
  const TimePoint now = loop_.Now();
  // A Wait still queued times out without involving the server.
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (it->deadline > now) {
      ++it;
      continue;
    }
    Complete(*it, Reply{});  // i = 0: not satisfied
    it = queue_.erase(it);
  }
  const Pending* late = nullptr;
  for (Pending& p : inflight_) {
    if (p.deadline > now) continue;
    if (p.op == Op::kWait && !p.cancel_sent) {
      SendCancel(p);
      continue;
    }
    late = &p;
    break;
  }
  if (late) {
    FailAll(Status::Error("store: no reply to " + std::string(OpName(late->op)) + " from " +
                          where_ + " within " + SecondsText(opts_.op_timeout) +
                          "; connection dropped"));
  }
  Progress();
  Deliver();
}

// --- failure -----------------------------------------------------------------------------------

void AsyncStoreClient::FailAll(const Status& st) {
  if (!inflight_.empty() || !queue_.empty()) spdlog::debug("{}", st.message());
  CloseSocket();
  for (auto* q : {&inflight_, &queue_}) {
    for (Pending& p : *q) {
      if (p.op != Op::kAuth) Complete(p, st);
    }
    q->clear();
  }
}

void AsyncStoreClient::CloseSocket() {
  CloseFd();
  for (TimerQueue::TimerId* t : {&connect_timer_, &backoff_timer_}) {
    if (*t) loop_.CancelTimer(*t);
    *t = 0;
  }
  state_ = State::kIdle;
  wait_parked_ = false;
  wbuf_.clear();
  wbuf_off_ = 0;
  rbuf_.clear();
  rbuf_off_ = 0;
  queued_bytes_ = 0;
  sent_bytes_ = 0;
  got_reply_ = false;
}

void AsyncStoreClient::CloseFd() {
  if (fd_) loop_.RemoveFd(fd_.get());
  fd_.reset();
  want_out_ = false;
}

}  // namespace ctrun::store
