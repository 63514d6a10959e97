#include "rendezvous/backend.h"

#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>

#include "base/unique_fd.h"
#include "sys/port_owner.h"
#include "sys/posix_util.h"
#include "rendezvous/etcd_log.h"
#include "rendezvous/store_log.h"

namespace ctrun::rdzv {
namespace {

// A rendezvous backend that cannot be reached yet (its requests are being retried).
void SayUnreachable(const std::string& what) { spdlog::warn("rendezvous: {}", what); }

// Numeric form of every address of `host` (getaddrinfo; blocking, once at start-up).
std::vector<std::string> Resolve(const std::string& host) {
  std::vector<std::string> out;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return out;
  for (addrinfo* a = res; a; a = a->ai_next)
    if (std::string h = NumericHost(a->ai_addr); !h.empty()) out.push_back(std::move(h));
  ::freeaddrinfo(res);
  return out;
}

// The addresses of this machine's interfaces (getifaddrs), numeric.
std::vector<std::string> LocalAddresses() {
  std::vector<std::string> out;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return out;
  for (ifaddrs* i = ifs; i; i = i->ifa_next)
    if (i->ifa_addr)
      if (std::string h = NumericHost(i->ifa_addr); !h.empty()) out.push_back(std::move(h));
  ::freeifaddrs(ifs);
  return out;
}

// Whether `host` names this machine (as torchrun's c10d host check: localhost, a loopback
// address, the host name, or an address of one of its interfaces).
bool IsThisMachine(const std::string& host, const std::string& hostname) {
  if (host == "localhost" || host == hostname || host == hostname.substr(0, hostname.find('.'))) return true;
  const std::vector<std::string> mine = LocalAddresses();
  for (const std::string& a : Resolve(host)) {
    if (a.rfind("127.", 0) == 0 || a == "::1") return true;
    for (const auto& m : mine)
      if (a == m) return true;
  }
  return false;
}

// The local address the kernel would use to reach `target` (a UDP connect sends nothing).
std::string RouteSource(const HostPort& target) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(target.host.c_str(), std::to_string(target.port).c_str(), &hints, &res) != 0) return "";
  std::string out;
  for (addrinfo* a = res; a && out.empty(); a = a->ai_next) {
    UniqueFd s(::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    if (s && ::connect(s.get(), a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&local), &len) == 0)
      out = NumericHost(reinterpret_cast<sockaddr*>(&local));
  }
  ::freeaddrinfo(res);
  return out;
}

RendezvousOptions MakeOptions(const LaunchConfig& c) {
  const RdzvSettings& r = c.rdzv;
  RendezvousOptions o;
  o.params.min_nodes = c.min_nodes;
  o.params.max_nodes = c.max_nodes;
  o.params.max_restarts = c.max_restarts;
  o.params.static_ranks = r.backend == "static";
  o.join_timeout = Seconds(r.join_timeout);
  o.last_call = Seconds(r.last_call_timeout);
  o.liveness.interval = Seconds(r.keep_alive_interval);
  o.liveness.deadline = Seconds(r.keep_alive_interval * r.keep_alive_max_attempt);
  o.run_id = c.run_id;
  return o;
}

// Whether this agent hosts the rendezvous store, and whether it must (else, when the port is
// taken, it connects as a client). static: node rank 0 must. c10d: the agent whose address
// matches the endpoint (or is_host=1) tries; when several agents on one machine match, the first
// to bind hosts and the others connect as clients.
struct HostRole {
  bool host = false;
  bool must = false;
};

HostRole StoreHostRole(const LaunchConfig& c, const std::string& hostname) {
  const RdzvSettings& r = c.rdzv;
  if (r.backend == "static") return {c.node_rank == 0, c.node_rank == 0};
  if (r.backend == "c10d") return {r.is_host ? *r.is_host : IsThisMachine(r.endpoints.front().host, hostname),
                                   r.is_host.value_or(false)};
  return {};
}

store::ServerOptions HostOptions(const LaunchConfig& c) {
  const RdzvSettings& r = c.rdzv;
  const HostPort& ep = r.endpoints.front();
  store::ServerOptions opts;
  opts.bind_host = ep.host.find(':') != std::string::npos ? "::" : "0.0.0.0";
  opts.port = ep.port;
  opts.token = RendezvousToken(c);
  opts.peer_timeout = Seconds(r.read_timeout);  // connections of dead or cut-off agents are closed
  return opts;
}

std::string PortFlag(const LaunchConfig& c) {
  return c.rdzv.backend == "static" ? "--master_port" : "--rdzv_endpoint port";
}

// The reason the store cannot be hosted on the endpoint's port, for one line: its holder when
// /proc shows one, else the bind error.
std::string CannotHost(const LaunchConfig& c, const std::string& bind_error) {
  const int port = c.rdzv.endpoints.front().port;
  const std::string head = "cannot host the rendezvous store on port " + std::to_string(port) + ": ";
  if (std::optional<PortHolder> holder = FindPortHolder(port))
    return head + DescribePortHolder(holder, c.run_id, std::filesystem::path(c.entrypoint).filename().string(),
                                     PortFlag(c), /*single_node=*/false);
  return head + bind_error + " (pick another " + PortFlag(c) + ")";
}

StatusOr<std::unique_ptr<store::StoreServer>> MaybeHostStore(const LaunchConfig& c, EventLoop& loop, HostRole role) {
  if (!role.host) return std::unique_ptr<store::StoreServer>();
  auto server = store::StoreServer::Start(loop, HostOptions(c));
  if (server.ok()) return std::move(server.value());
  if (!role.must) return std::unique_ptr<store::StoreServer>();  // a client: see HostWhenFree
  return Status::Error(CannotHost(c, server.message()));
}

// A c10d host candidate that found the port taken is a client, on the guess that another agent
// here hosts. Its connects being refused prove the guess wrong: nothing listens there (the holder
// is a connection's local port, or a server on one address only). Before each retry it tries to
// host again, so the job starts as soon as the port is free instead of timing out. *slot is the
// Backend's hosted_store, which outlives the log that calls this. The log's two connections
// each hold a copy: the warning's flag is shared.
std::function<void()> HostWhenFree(const LaunchConfig& c, EventLoop& loop, std::unique_ptr<store::StoreServer>* slot) {
  return [&loop, slot, c, said = std::make_shared<bool>(false)] {
    if (*slot) return;
    auto server = store::StoreServer::Start(loop, HostOptions(c));
    if (server.ok()) {
      spdlog::info("rendezvous: hosting the store on port {} now that the port is free", server.value()->port());
      *slot = std::move(server.value());
    } else if (!*said) {
      *said = true;
      spdlog::warn("rendezvous: {}; nothing answers there either, so ctrun hosts it as soon as it is free",
                   CannotHost(c, server.message()));
    }
  };
}

// before_retry: see StoreLogOptions (the store backends only).
StatusOr<std::unique_ptr<RendezvousLog>> MakeLog(const LaunchConfig& c, EventLoop& loop,
                                                 std::function<void()> before_retry) {
  const RdzvSettings& r = c.rdzv;
  if (r.backend == "etcd") {
    EtcdLogOptions o;
    for (const auto& ep : r.endpoints) o.etcd.endpoints.push_back(r.protocol + "://" + ep.ToString());
    o.prefix = r.etcd_prefix;
    o.run_id = c.run_id;
    o.etcd.tls.ca_file = r.cacert;
    o.etcd.tls.cert_file = r.cert;
    o.etcd.tls.key_file = r.key;
    o.etcd.user = r.username;
    if (const char* pw = std::getenv("CTRUN_ETCD_PASSWORD")) o.etcd.password = pw;
    // One attempt stays short (the client's default): a write caught in an etcd leader change is
    // only freed by resending it; read_timeout bounds the whole operation with its retries.
    o.etcd.retry_deadline = Seconds(r.read_timeout);
    o.etcd.on_unreachable = SayUnreachable;
    auto log = EtcdLog::Create(&loop, std::move(o));
    if (!log.ok()) return log.status();
    return std::unique_ptr<RendezvousLog>(std::move(log.value()));
  }
  StoreLogOptions o;
  o.host = r.endpoints.front().host;
  o.port = r.endpoints.front().port;
  o.run_id = c.run_id;
  o.token = RendezvousToken(c);
  o.connect_timeout = Seconds(r.join_timeout);
  o.op_timeout = Seconds(r.read_timeout);
  o.on_unreachable = SayUnreachable;
  o.before_retry = std::move(before_retry);
  auto log = StoreLog::Create(loop, o);
  if (!log.ok()) return log.status();
  return std::unique_ptr<RendezvousLog>(std::move(log.value()));
}

}  // namespace

std::string RendezvousToken(const LaunchConfig& config) {
  if (const char* t = std::getenv("CTRUN_RDZV_TOKEN"); t && *t) return t;
  return "ctrun-run:" + config.run_id;
}

Status MakeBackend(const LaunchConfig& c, EventLoop& loop, const std::string& hostname, Backend* b) {
  const HostRole role = StoreHostRole(c, hostname);
  auto hosted = MaybeHostStore(c, loop, role);
  if (!hosted.ok()) return hosted.status();
  b->hosted_store = std::move(hosted.value());
  const HostPort& ep = c.rdzv.endpoints.front();
  b->node_addr = c.local_addr;
  if (b->node_addr.empty()) b->node_addr = RouteSource(ep);
  if (b->node_addr.empty()) b->node_addr = hostname;
  auto log = MakeLog(c, loop, role.host && !b->hosted_store ? HostWhenFree(c, loop, &b->hosted_store) : nullptr);
  if (!log.ok()) return Status::Error("cannot reach the rendezvous at " + ep.ToString() + ": " + log.message());
  const std::string nonce = RandomHex(4);
  const std::string id =
      hostname.substr(0, hostname.find('.')) + "/" + std::to_string(::getpid()) + "/" + (nonce.empty() ? "0" : nonce);
  b->rendezvous = std::make_unique<Rendezvous>(std::move(log.value()), loop, MakeOptions(c), id);
  return Status::Ok();
}

}  // namespace ctrun::rdzv
