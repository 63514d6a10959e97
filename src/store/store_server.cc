#include "store/store_server.h"

#include "store/client_util.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <utility>

#include <spdlog/spdlog.h>

#include "sys/posix_util.h"

namespace ctrun::store {
namespace {

constexpr size_t kReadChunk = 64 * 1024;
constexpr int kMaxReadsPerEvent = 16;  // 1 MiB per wake-up, then let other connections run
constexpr auto kAcceptRetry = std::chrono::milliseconds(100);

std::string PeerName(const sockaddr_storage& ss) {
  const auto* sa = reinterpret_cast<const sockaddr*>(&ss);
  const std::string host = NumericHost(sa);
  int port = 0;
  if (ss.ss_family == AF_INET) port = ntohs(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) port = ntohs(reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port);
  return (host.empty() ? "?" : host) + ":" + std::to_string(port);
}

// std::stoll semantics (what torch's ADD handler uses): leading blanks and a sign are accepted,
// trailing bytes ignored; no digits or out of range is an error.
bool ParseCounter(const std::string& s, int64_t* v) {
  errno = 0;
  char* end = nullptr;
  long long r = std::strtoll(s.c_str(), &end, 10);
  if (end == s.c_str() || errno == ERANGE) return false;
  *v = r;
  return true;
}

// "300 MiB", "1.1 GiB": one decimal at most, for log lines.
std::string BytesText(size_t n) {
  static const char* const kUnits[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  size_t u = 0;
  while (v >= 1024 && u + 1 < std::size(kUnits)) {
    v /= 1024;
    ++u;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  std::string s = buf;
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
  return s + " " + kUnits[u];
}

bool TokenEquals(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

struct StoreServer::Conn {
  ConnId id = 0;
  UniqueFd fd;
  std::string peer;
  RequestParser parser;
  bool authed = false;
  TimerQueue::TimerId auth_timer = 0;  // pending auth_timeout while !authed (0: none)
  std::string in;           // unparsed input; bounded by one request plus one read burst
  std::string out;          // pending output from out_off on
  size_t out_off = 0;
  bool dirty = false;       // listed in dirty_
  bool paused = false;      // not read while out is over max_pending_output
  bool reset = false;       // the socket has an error: queued requests still run, replies are dropped
  bool evicted = false;     // over the total bound (in evicted_): nothing more is run or queued
  uint32_t interest = EPOLLIN;
  bool parked = false;      // in WAIT
  // Keys still missing while parked, each once (a WAIT may name a key twice); a set, so parking
  // on k keys and waking them one by one is O(k), not O(k^2).
  std::unordered_set<std::string> awaited;

  size_t pending() const { return out.size() - out_off; }
};

StoreServer::StoreServer(EventLoop& loop, const ServerOptions& opts) : loop_(loop), opts_(opts) {
  limits_.max_key_bytes = opts.max_key_bytes;
  limits_.max_value_bytes = opts.max_value_bytes;
  limits_.max_request_bytes = opts.max_value_bytes + opts.max_key_bytes + (16u << 20);
}

StatusOr<std::unique_ptr<StoreServer>> StoreServer::Start(EventLoop& loop,
                                                           const ServerOptions& opts) {
  std::unique_ptr<StoreServer> s(new StoreServer(loop, opts));
  if (Status st = s->Listen(); !st.ok()) return st;
  return s;
}

StoreServer::~StoreServer() {
  if (accept_retry_timer_) loop_.CancelTimer(accept_retry_timer_);
  for (auto& [id, c] : conns_) {
    if (c->auth_timer) loop_.CancelTimer(c->auth_timer);
    loop_.RemoveFd(c->fd.get());
  }
  if (listen_fd_) loop_.RemoveFd(listen_fd_.get());
}

Status StoreServer::Listen() {
  std::string host = opts_.bind_host.empty() ? "0.0.0.0" : opts_.bind_host;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  std::string port = std::to_string(opts_.port);
  if (int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    return Status::Error("store: cannot resolve bind address '" + host + "': " + gai_strerror(rc));
  }
  Status last = Status::Error("store: no address to bind for '" + host + "'");
  for (addrinfo* ai = res; ai; ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd) {
      last = Status::Errno("store: socket", errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ai->ai_family == AF_INET6) {
      int zero = 0;  // "::" serves IPv4 too
      ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    }
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      last = Status::Errno("store: bind " + host + ":" + port, errno);
      continue;
    }
    if (::listen(fd.get(), opts_.backlog) != 0) {
      last = Status::Errno("store: listen", errno);
      continue;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len);
    port_ = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                     : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    listen_fd_ = std::move(fd);
    last = Status::Ok();
    break;
  }
  ::freeaddrinfo(res);
  if (!last.ok()) return last;
  return loop_.AddFd(listen_fd_.get(), EPOLLIN, [this](uint32_t) { OnAccept(); });
}

void StoreServer::OnAccept() {
  for (;;) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    int raw = ::accept4(listen_fd_.get(), reinterpret_cast<sockaddr*>(&ss), &len,
                        SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (raw < 0) {
      int err = errno;
      if (err == EINTR || err == ECONNABORTED || err == EPROTO) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) break;
      // Out of fds or memory: the listener stays readable, so stop watching it for a moment
      // instead of spinning, and let existing connections finish.
      spdlog::warn("store: accept failed: {}; pausing accepts for {} ms", std::strerror(err),
                   kAcceptRetry.count());
      if (Status s = loop_.ModifyFd(listen_fd_.get(), 0); !s.ok())
        spdlog::warn("store: cannot pause accepts: {}", s.message());  // accept fails again meanwhile
      accept_retry_timer_ = loop_.AddTimerAfter(kAcceptRetry, [this] {
        accept_retry_timer_ = 0;
        if (Status s = loop_.ModifyFd(listen_fd_.get(), EPOLLIN); !s.ok())
          spdlog::error("store: cannot resume accepting connections: {}; no new client is accepted", s.message());
      });
      break;
    }
    UniqueFd fd(raw);
    std::string peer = PeerName(ss);
    if (conns_.size() >= opts_.max_connections) {
      // A flood must not turn into a log flood: the first refusal and every 1000th are logged.
      if (refused_over_limit_++ % 1000 == 0) {
        spdlog::warn("store: refused connection from {}: limit of {} connections reached ({} so far)",
                     peer, opts_.max_connections, refused_over_limit_);
      }
      continue;  // fd closes here
    }
    if (opts_.peer_timeout > Duration::zero()) {
      TunePeerSocket(fd.get(), opts_.peer_timeout);
    } else {
      int one = 1;
      ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    auto c = std::make_unique<Conn>();
    c->id = next_id_++;
    c->peer = std::move(peer);
    c->parser = RequestParser(limits_);
    c->authed = opts_.token.empty();
    ConnId id = c->id;
    if (Status st = loop_.AddFd(fd.get(), EPOLLIN, [this, id](uint32_t ev) { OnConnEvent(id, ev); });
        !st.ok()) {
      spdlog::warn("store: cannot watch connection from {}: {}", c->peer, st.message());
      continue;
    }
    c->fd = std::move(fd);
    if (!c->authed && opts_.auth_timeout > Duration::zero()) {
      c->auth_timer = loop_.AddTimerAfter(opts_.auth_timeout, [this, id] {
        auto ct = conns_.find(id);
        if (ct == conns_.end()) return;
        ct->second->auth_timer = 0;
        char secs[32];
        std::snprintf(secs, sizeof secs, "%g", ToSeconds(opts_.auth_timeout));
        WarnPeer(*ct->second,
                 std::string("closing connection from {}: no AUTH within ") + secs + " s");
        Close(id, nullptr);
        UpdateCounts();
      });
    }
    conns_.emplace(id, std::move(c));
  }
  UpdateCounts();
}

void StoreServer::OnConnEvent(ConnId id, uint32_t events) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  Conn& c = *it->second;
  if (events & EPOLLERR) {
    // A reset leaves what arrived before it readable: a SET pipelined ahead of a peer's abortive
    // close still lands, as with an orderly close. No reply can reach the peer, so none is kept,
    // which also unpauses it. ReadFrom closes it once recv reports the error.
    c.reset = true;
    c.paused = false;
    DropOutput(c);
    ReadFrom(c);
  } else if ((events & EPOLLHUP) && c.paused) {
    // A paused connection is not read, so a hang-up would otherwise be reported forever.
    Close(id, nullptr);
  } else {
    bool alive = true;
    if (events & EPOLLOUT) {
      if (!Flush(c)) {
        Close(id, nullptr);
        alive = false;
      } else if (c.paused && c.pending() <= opts_.max_pending_output) {
        c.paused = false;
        if (!ProcessInput(c)) {
          Flush(c);
          Close(id, nullptr);
          alive = false;
        }
      }
    }
    if (alive && (events & (EPOLLIN | EPOLLHUP)) && !c.paused) ReadFrom(c);
  }
  CloseEvicted();  // `c` may be gone from here on
  UpdateCounts();  // before the replies go out, so a client never sees counts older than them
  FlushDirty();
  if (auto again = conns_.find(id); again != conns_.end()) UpdateInterest(*again->second);
  UpdateCounts();
}

void StoreServer::ReadFrom(Conn& c) {
  char buf[kReadChunk];
  bool eof = false;
  for (int i = 0; i < kMaxReadsPerEvent; ++i) {
    ssize_t n = RetryOnEintr([&] { return ::recv(c.fd.get(), buf, sizeof buf, 0); });
    if (n > 0) {
      c.in.append(buf, static_cast<size_t>(n));
      if (static_cast<size_t>(n) < sizeof buf) break;
      continue;
    }
    if (n == 0) eof = true;
    else if (errno != EAGAIN && errno != EWOULDBLOCK) eof = true;  // reset: same as a close
    break;
  }
  ConnId id = c.id;
  // Requests that arrived before an EOF still run (a client may SET and close at once).
  if (!ProcessInput(c)) {
    Flush(c);
    Close(id, nullptr);
    return;
  }
  if (eof) {
    Flush(c);
    Close(id, nullptr);
  }
}

bool StoreServer::ProcessInput(Conn& c) {
  size_t off = 0;
  bool ok = true;
  while (!c.paused && c.in.size() - off >= c.parser.min_bytes()) {
    // Before AUTH only an AUTH may start: anything else is refused at its first byte rather than
    // after the whole request was buffered (a SET may declare 256 MiB). The parser bounds an AUTH
    // by max_token_bytes, so an unauthenticated connection keeps at most one AUTH's bytes.
    if (!c.authed && static_cast<uint8_t>(c.in[off]) != kAuthByte) {
      WarnPeer(c, "refused connection from {}: no AUTH token presented");
      ok = false;
      break;
    }
    Request req;
    size_t used = 0;
    auto r = c.parser.Parse(std::string_view(c.in).substr(off), &req, &used);
    if (r == RequestParser::Result::kNeedMore) break;
    if (r == RequestParser::Result::kError) {
      WarnPeer(c, "closing connection from {}: " + c.parser.error());
      ok = false;
      break;
    }
    off += used;
    if (!Execute(c, req)) {
      ok = false;
      break;
    }
    const bool over_total =
        opts_.max_total_pending_output != 0 && total_pending_ > opts_.max_total_pending_output;
    if (c.pending() > opts_.max_pending_output || over_total) {
      // Write what the socket takes: only the rest is held here. Over max_pending_output the peer
      // is not reading its replies: stop reading it.
      if (!Flush(c)) {
        DropOutput(c);  // the socket failed: none of it can be sent, and c is closed below
        ok = false;
      } else if (c.pending() > opts_.max_pending_output) {
        c.paused = true;
      }
    }
    if (over_total) EnforceTotalBound();  // even when c failed: the others may still be over
    if (!ok || c.evicted) {  // an evicted c's output is dropped already; the caller closes it
      ok = false;
      break;
    }
  }
  if (!ok) {
    c.in.clear();
    return false;
  }
  c.in.erase(0, off);
  return true;
}

// One warning per host and reason: a client that keeps retrying (an agent with the wrong token, an
// HTTP client at the store's port) does not flood the log; its repeats go to the debug level.
// `what` holds "{}" where the peer goes. The set is bounded: a scan from many hosts restarts it.
void StoreServer::WarnPeer(const Conn& c, const std::string& what, const std::string& reason) {
  const size_t at = what.find("{}");
  const std::string text = "store: " + what.substr(0, at) + c.peer + what.substr(at + 2);
  const std::string host = c.peer.substr(0, c.peer.rfind(':'));
  if (warned_.size() >= 1024) warned_.clear();
  if (!warned_.insert(host + "\n" + (reason.empty() ? what : reason)).second) {
    spdlog::debug("{}", text);
    return;
  }
  spdlog::warn("{} (the same from {} again: debug level only)", text, host);
}

bool StoreServer::Execute(Conn& c, Request& req) {
  std::string reply;
  switch (req.op) {  // !c.authed here only for an AUTH (ProcessInput refused anything else)
    case Op::kAuth:
      if (!opts_.token.empty() && !TokenEquals(req.values[0], opts_.token)) {
        WarnPeer(c, "refused connection from {}: wrong AUTH token");
        return false;
      }
      c.authed = true;
      if (c.auth_timer) loop_.CancelTimer(std::exchange(c.auth_timer, 0));
      AppendU8(&reply, kAuthOk);
      break;
    case Op::kValidate:
      break;  // the parser already checked the magic
    case Op::kSet:
      DoSet(req.keys[0], std::move(req.values[0]));
      break;
    case Op::kCompareSet: {
      const std::string& key = req.keys[0];
      std::string& expected = req.values[0];
      std::string& desired = req.values[1];
      auto it = kv_.find(key);
      if (it == kv_.end()) {
        if (expected.empty()) {
          AppendBytes(&reply, desired);
          DoSet(key, std::move(desired));
        } else {
          AppendBytes(&reply, expected);  // torch "lies" here; clients rely on it
        }
      } else {
        if (it->second == expected) it->second = std::move(desired);
        AppendBytes(&reply, it->second);
      }
      break;
    }
    case Op::kGet: {
      auto it = kv_.find(req.keys[0]);
      if (it == kv_.end()) {
        spdlog::debug("store: GET of missing key '{}' from {}: closing, as torch does",
                      req.keys[0], c.peer);
        return false;
      }
      AppendU64(&reply, it->second.size());
      Send(c, reply);
      Send(c, it->second);  // no copy of the value into `reply`
      return true;
    }
    case Op::kAdd: {
      int64_t value = req.delta;
      if (auto it = kv_.find(req.keys[0]); it != kv_.end()) {
        int64_t old = 0;
        if (!ParseCounter(it->second, &old)) {
          spdlog::warn("store: ADD on non-numeric key '{}' from {}: closing, as torch does",
                       req.keys[0], c.peer);
          return false;
        }
        value = static_cast<int64_t>(static_cast<uint64_t>(old) + static_cast<uint64_t>(value));
      }
      AppendI64(&reply, value);
      DoSet(req.keys[0], std::to_string(value));
      break;
    }
    case Op::kCheck: {
      bool all = std::all_of(req.keys.begin(), req.keys.end(),
                             [&](const std::string& k) { return Exists(k); });
      AppendU8(&reply, all ? kCheckReady : kCheckNotReady);
      break;
    }
    case Op::kWait:
      if (std::all_of(req.keys.begin(), req.keys.end(),
                      [&](const std::string& k) { return Exists(k); })) {
        AppendU8(&reply, kStopWaiting);
      } else {
        Park(c, req.keys);
      }
      break;
    case Op::kNumKeys:
      AppendI64(&reply, static_cast<int64_t>(kv_.size()));
      break;
    case Op::kWatchKey:
      AppendU8(&reply, kKeyCallbackRegistered);
      break;
    case Op::kDeleteKey:
      AppendI64(&reply, static_cast<int64_t>(kv_.erase(req.keys[0])));
      break;
    case Op::kAppend: {
      auto it = kv_.find(req.keys[0]);
      if (it == kv_.end()) {
        DoSet(req.keys[0], std::move(req.values[0]));
      } else {
        it->second += req.values[0];
        WakeWaiters(req.keys[0], false);
      }
      break;
    }
    case Op::kMultiGet: {
      // The reply's length is known before anything is copied: keys may repeat, so a small
      // request can name one large value 128K times, and building that reply would exhaust
      // memory (or throw) in the agent that hosts the store.
      size_t total = 0;
      for (const auto& k : req.keys) {
        auto it = kv_.find(k);
        if (it == kv_.end()) {
          spdlog::debug("store: MULTI_GET of missing key '{}' from {}: closing", k, c.peer);
          return false;
        }
        total += sizeof(uint64_t) + it->second.size();
        if (total > opts_.max_multi_get_reply) {
          WarnPeer(c, "closing connection from {}: MULTI_GET reply over the limit of " +
                          std::to_string(opts_.max_multi_get_reply) + " bytes");
          return false;
        }
      }
      for (const auto& k : req.keys) {  // straight into the output, as GET does: no copy
        const std::string& v = kv_.find(k)->second;
        std::string len;
        AppendU64(&len, v.size());
        Send(c, len);
        Send(c, v);
      }
      return true;
    }
    case Op::kMultiSet:
      for (size_t i = 0; i < req.keys.size(); ++i) DoSet(req.keys[i], std::move(req.values[i]));
      break;
    case Op::kCancelWait:
      Unpark(c);
      AppendU8(&reply, kWaitCanceled);
      break;
    case Op::kPing:
      AppendU32(&reply, req.u32);
      break;
    case Op::kQueuePush:
      queues_[req.keys[0]].push_back(std::move(req.values[0]));
      WakeWaiters(req.keys[0], true);
      break;
    case Op::kQueuePop: {
      auto it = queues_.find(req.keys[0]);
      size_t n = it == queues_.end() ? 0 : it->second.size();
      AppendI64(&reply, static_cast<int64_t>(n));
      if (n > 0) {
        AppendBytes(&reply, it->second.front());
        it->second.pop_front();
        if (it->second.empty()) queues_.erase(it);
      }
      break;
    }
    case Op::kQueueLen: {
      auto it = queues_.find(req.keys[0]);
      AppendI64(&reply, static_cast<int64_t>(it == queues_.end() ? 0 : it->second.size()));
      break;
    }
  }
  if (!reply.empty()) Send(c, reply);
  return true;
}

void StoreServer::Send(Conn& c, std::string_view bytes) {
  if (c.reset || c.evicted) return;
  c.out.append(bytes);
  AddPending(bytes.size());
  if (!c.dirty) {
    c.dirty = true;
    dirty_.push_back(c.id);
  }
}

void StoreServer::FlushDirty() {
  while (!dirty_.empty()) {
    std::vector<ConnId> ids;
    ids.swap(dirty_);
    for (ConnId id : ids) {
      auto it = conns_.find(id);
      if (it == conns_.end()) continue;
      Conn& c = *it->second;
      c.dirty = false;
      if (!Flush(c)) {
        Close(id, nullptr);
        continue;
      }
      UpdateInterest(c);
    }
  }
}

bool StoreServer::Flush(Conn& c) {
  while (c.pending() > 0) {
    ssize_t n = RetryOnEintr([&] {
      return ::send(c.fd.get(), c.out.data() + c.out_off, c.pending(), MSG_NOSIGNAL);
    });
    if (n > 0) {
      c.out_off += static_cast<size_t>(n);
      SubPending(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    return false;
  }
  if (c.pending() == 0) {
    c.out.clear();
    c.out_off = 0;
    if (c.out.capacity() > (1u << 20)) c.out.shrink_to_fit();
  } else if (c.out_off > (1u << 20) && c.out_off > c.out.size() / 2) {
    c.out.erase(0, c.out_off);
    c.out_off = 0;
  }
  return true;
}

// A paused connection always waits for writability: its replies can be drained elsewhere (a
// wake-up's FlushDirty), and with nothing pending and no EPOLLIN it had no event left that could
// resume it (a slow reader stalled for good, seen under ASan). EPOLLOUT then fires at once and
// OnConnEvent resumes it.
void StoreServer::UpdateInterest(Conn& c) {
  uint32_t want = (c.paused ? 0u : uint32_t{EPOLLIN}) | (c.pending() || c.paused ? uint32_t{EPOLLOUT} : 0u);
  if (want == c.interest) return;
  if (loop_.ModifyFd(c.fd.get(), want).ok()) c.interest = want;
}

void StoreServer::Close(ConnId id, const char* why) {
  auto it = conns_.find(id);
  if (it == conns_.end()) return;
  Conn& c = *it->second;
  if (why) spdlog::debug("store: closing connection from {}: {}", c.peer, why);
  if (c.auth_timer) loop_.CancelTimer(c.auth_timer);
  Unpark(c);  // before the fd is closed, so a later wake-up cannot reach a reused fd
  SubPending(c.pending());
  loop_.RemoveFd(c.fd.get());
  conns_.erase(it);
}

void StoreServer::AddPending(size_t n) {
  total_pending_ += n;
  total_pending_output_.store(total_pending_, std::memory_order_relaxed);
}

void StoreServer::SubPending(size_t n) {
  total_pending_ -= n;  // never below 0: n is always part of one connection's pending()
  total_pending_output_.store(total_pending_, std::memory_order_relaxed);
}

void StoreServer::DropOutput(Conn& c) {
  SubPending(c.pending());
  std::string().swap(c.out);  // its memory too: a dropped reply may be 256 MiB
  c.out_off = 0;
}

// Runs only over the bound, so the O(connections log connections) ranking is off the hot path.
// Victims get no more output (Send) and run no more requests (ProcessInput stops at `evicted`);
// they are closed by CloseEvicted once the current request is done, so no Conn& held up the stack
// is invalidated here.
void StoreServer::EnforceTotalBound() {
  const size_t bound = opts_.max_total_pending_output;
  if (bound == 0 || total_pending_ <= bound) return;
  std::vector<Conn*> holders;
  for (auto& [id, c] : conns_) {
    if (c->pending() > 0) holders.push_back(c.get());
  }
  std::sort(holders.begin(), holders.end(),
            [](const Conn* a, const Conn* b) { return a->pending() > b->pending(); });
  const std::string held = BytesText(total_pending_);
  for (Conn* v : holders) {
    if (total_pending_ <= bound) break;
    WarnPeer(*v,
             "closing connection from {}: " + BytesText(v->pending()) +
                 " of replies unread while the store holds " + held + " unsent (bound " +
                 BytesText(bound) + ")",
             "closing connection from {}: replies unread over the bound on unsent output");
    DropOutput(*v);
    v->evicted = true;
    evicted_.push_back(v->id);
  }
}

void StoreServer::CloseEvicted() {
  std::vector<ConnId> ids;
  ids.swap(evicted_);
  for (ConnId id : ids) Close(id, nullptr);  // one the dispatch closed itself is gone already
}

bool StoreServer::Exists(const std::string& key) const {
  if (kv_.count(key)) return true;
  auto q = queues_.find(key);
  return q != queues_.end() && !q->second.empty();
}

void StoreServer::DoSet(const std::string& key, std::string value) {
  kv_[key] = std::move(value);
  WakeWaiters(key, false);
}

void StoreServer::Park(Conn& c, const std::vector<std::string>& keys) {
  Unpark(c);  // a client has at most one WAIT in flight; a new one replaces the old
  for (const auto& k : keys) {
    if (Exists(k) || !c.awaited.insert(k).second) continue;
    waiters_[k].push_back(c.id);
  }
  c.parked = true;
  ++parked_;
}

void StoreServer::Unpark(Conn& c) {
  if (!c.parked) return;
  for (const auto& k : c.awaited) {
    auto it = waiters_.find(k);
    if (it == waiters_.end()) continue;
    auto& ids = it->second;
    ids.erase(std::remove(ids.begin(), ids.end(), c.id), ids.end());
    if (ids.empty()) waiters_.erase(it);
  }
  c.awaited.clear();
  c.parked = false;
  --parked_;
}

void StoreServer::WakeWaiters(const std::string& key, bool only_one) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  std::vector<ConnId> ids = std::move(it->second);
  waiters_.erase(it);
  size_t i = 0;
  bool woke = false;
  for (; i < ids.size() && !woke; ++i) {
    auto ct = conns_.find(ids[i]);
    if (ct == conns_.end()) continue;
    Conn& w = *ct->second;
    w.awaited.erase(key);
    if (w.awaited.empty()) {
      w.parked = false;
      --parked_;
      char stop = static_cast<char>(kStopWaiting);
      Send(w, std::string_view(&stop, 1));
      woke = only_one;
    }
  }
  // QUEUE_PUSH wakes a single waiter (one item, one popper); the rest keep waiting.
  if (i < ids.size()) waiters_[key].assign(ids.begin() + static_cast<std::ptrdiff_t>(i), ids.end());
}

void StoreServer::Clear() {
  kv_.clear();
  queues_.clear();
  UpdateCounts();
}

void StoreServer::UpdateCounts() {
  num_keys_.store(kv_.size(), std::memory_order_relaxed);
  num_connections_.store(conns_.size(), std::memory_order_relaxed);
  num_waiting_.store(parked_, std::memory_order_relaxed);
}

}  // namespace ctrun::store
