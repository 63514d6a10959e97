#include "rendezvous/settings.h"

#include "cli/value_parsers.h"

#include <arpa/inet.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <functional>
#include <map>

namespace ctrun::rdzv {
namespace {

constexpr int kC10dDefaultPort = 29400;
constexpr int kEtcdDefaultPort = 2379;

// Numbers use the command line's own grammar (cli/value_parsers.h), with the key in the message.
StatusOr<double> PositiveSeconds(const std::string& key, const std::string& v) {
  auto d = ParseSeconds(v, /*zero_ok=*/false);
  if (!d.ok()) return Status::Error("--rdzv_conf " + key + "=" + v + ": expected a number of seconds: " + d.message());
  return *d;
}

// torch's get_as_bool: 1/true/t/yes/y and 0/false/f/no/n, in any case.
StatusOr<bool> Bool(const std::string& key, const std::string& v) {
  std::string lower = v;
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (const char* yes : {"1", "true", "t", "yes", "y"})
    if (lower == yes) return true;
  for (const char* no : {"0", "false", "f", "no", "n"})
    if (lower == no) return false;
  return Status::Error("--rdzv_conf " + key + "=" + v + ": expected true/false, yes/no or 1/0");
}

using Setter = std::function<Status(RdzvSettings*, const std::string& key, const std::string& value)>;

Setter SecondsField(double RdzvSettings::*field) {
  return [field](RdzvSettings* s, const std::string& k, const std::string& v) -> Status {
    auto d = PositiveSeconds(k, v);
    if (!d.ok()) return d.status();
    s->*field = *d;
    return {};
  };
}

Setter TextField(std::string RdzvSettings::*field) {
  return [field](RdzvSettings* s, const std::string&, const std::string& v) -> Status {
    s->*field = v;
    return {};
  };
}

// A TLS file: checked at the start, not when the first request fails. One PEM file each: libcurl
// reads the CA bundle as a file (a directory of hashed certificates fails every request).
Setter FileField(std::string RdzvSettings::*field) {
  return [field](RdzvSettings* s, const std::string& k, const std::string& v) -> Status {
    if (::access(v.c_str(), R_OK) != 0) return Status::Errno("--rdzv_conf " + k + "=" + v, errno);
    struct stat st {};
    if (::stat(v.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
      return Status::Error("--rdzv_conf " + k + "=" + v + ": not a regular file (give one PEM file)");
    s->*field = v;
    return {};
  };
}

// Two spellings of one file (a relative and an absolute path, a link) are the same file.
bool SameFile(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  if (a == b) return true;
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

const std::map<std::string, Setter>& Keys() {
  static const std::map<std::string, Setter> keys = {
      {"join_timeout", SecondsField(&RdzvSettings::join_timeout)},
      {"timeout", SecondsField(&RdzvSettings::timeout)},  // the static backend's join timeout
      // torchrun puts --node_rank there itself, over whatever was given: taken, not used.
      {"rank", [](RdzvSettings*, const std::string&, const std::string&) -> Status { return {}; }},
      {"last_call_timeout", SecondsField(&RdzvSettings::last_call_timeout)},
      {"close_timeout", SecondsField(&RdzvSettings::close_timeout)},
      {"keep_alive_interval", SecondsField(&RdzvSettings::keep_alive_interval)},
      {"read_timeout", SecondsField(&RdzvSettings::read_timeout)},
      {"keep_alive_max_attempt",
       [](RdzvSettings* s, const std::string& k, const std::string& v) -> Status {
         auto n = ParseInt(v);
         if (!n.ok() || *n < 1 || *n > 1000)
           return Status::Error("--rdzv_conf " + k + "=" + v + ": expected an integer from 1 to 1000");
         s->keep_alive_max_attempt = *n;
         return {};
       }},
      {"is_host",
       [](RdzvSettings* s, const std::string& k, const std::string& v) -> Status {
         auto b = Bool(k, v);
         if (!b.ok()) return b.status();
         s->is_host = *b;
         return {};
       }},
      {"store_type",
       [](RdzvSettings*, const std::string& k, const std::string& v) -> Status {
         if (v == "tcp") return {};
         return Status::Error("--rdzv_conf " + k + "=" + v + ": ctrun's c10d rendezvous runs on its TCP store only");
       }},
      {"use_libuv", [](RdzvSettings*, const std::string&, const std::string&) -> Status { return {}; }},
      {"etcd_prefix", TextField(&RdzvSettings::etcd_prefix)},
      {"protocol",
       [](RdzvSettings* s, const std::string& k, const std::string& v) -> Status {
         if (v != "http" && v != "https")
           return Status::Error("--rdzv_conf " + k + "=" + v + ": expected http or https");
         s->protocol = v;
         return {};
       }},
      // torchrun's etcd backend names them cacert, cert, key; its etcd-v2 backend ca_cert,
      // ssl_cert, ssl_cert_key. Both sets are taken for both backends. A cert alone is a PEM
      // file that holds the key too.
      {"cacert", FileField(&RdzvSettings::cacert)},
      {"cert", FileField(&RdzvSettings::cert)},
      {"key", FileField(&RdzvSettings::key)},
      {"ca_cert", FileField(&RdzvSettings::cacert)},
      {"ssl_cert", FileField(&RdzvSettings::cert)},
      {"ssl_cert_key", FileField(&RdzvSettings::key)},
      {"username", TextField(&RdzvSettings::username)},
  };
  return keys;
}

Status ApplyConf(const std::map<std::string, std::string>& conf, RdzvSettings* s) {
  for (const auto& [k, v] : conf) {
    auto it = Keys().find(k);
    if (it == Keys().end()) {
      std::string known;
      for (const auto& kv : Keys()) known += (known.empty() ? "" : ", ") + kv.first;
      return Status::Error("--rdzv_conf: unknown key '" + k + "' (known: " + known + ")");
    }
    if (Status st = it->second(s, k, v); !st.ok()) return st;
  }
  // Both names of one file (cacert and ca_cert, ...) must not name two files: which would win is
  // an accident of the order of the keys.
  for (const auto& [a, b] : {std::pair<std::string, std::string>{"cacert", "ca_cert"}, {"cert", "ssl_cert"},
                             {"key", "ssl_cert_key"}}) {
    auto ia = conf.find(a), ib = conf.find(b);
    if (ia != conf.end() && ib != conf.end() && !SameFile(ia->second, ib->second))
      return Status::Error("--rdzv_conf: " + a + "=" + ia->second + " and " + b + "=" + ib->second +
                           " name two different files for one setting; give one");
  }
  if (s->cert.empty() && !s->key.empty())
    return Status::Error("--rdzv_conf: a client key (key, ssl_cert_key) needs its certificate (cert, ssl_cert)");
  return {};
}

// A literal IPv6 address, with or without a zone ("fe80::1%eth0"; a zone holds no ':', so
// "fe80::1%lo:29613" is an address and a port).
bool IsIPv6(std::string_view text) {
  const size_t zone = text.find('%');
  if (zone != std::string_view::npos &&
      (zone + 1 == text.size() || text.find(':', zone) != std::string_view::npos))
    return false;
  in6_addr a;
  return ::inet_pton(AF_INET6, std::string(text.substr(0, zone)).c_str(), &a) == 1;
}

StatusOr<int> Port(std::string_view text, std::string_view whole) {
  int port = 0;
  for (char ch : text) {
    if (ch < '0' || ch > '9' || port > 65535) return Status::Error("bad port in '" + std::string(whole) + "'");
    port = port * 10 + (ch - '0');
  }
  if (text.empty() || port < 1 || port > 65535)
    return Status::Error("bad port in '" + std::string(whole) + "' (expected 1-65535)");
  return port;
}

// "HOST:0": a c10d endpoint on any free port, which torchrun takes (its --standalone is exactly
// that). A bare IPv6 address ending in ":0" ("fe80::1:0") has no port and is not one.
bool PortIsZero(std::string_view endpoint) {
  return endpoint.ends_with(":0") && !ParseHostPort(endpoint, kC10dDefaultPort).ok() &&
         ParseHostPort(endpoint.substr(0, endpoint.size() - 2), kC10dDefaultPort).ok();
}

Status ResolveEndpoints(LaunchConfig* c, RdzvSettings* s) {
  if (s->backend == "static") {
    // torchrun: the endpoint, else --master_addr:--master_port; the endpoint must name its port.
    HostPort master{c->master_addr, c->master_port.value_or(29500)};
    if (!c->rdzv_endpoint.empty()) {
      auto hp = ParseHostPort(c->rdzv_endpoint, 0);
      if (!hp.ok()) return Status::Error("--rdzv_endpoint=" + c->rdzv_endpoint + ": " + hp.message());
      if (hp->port == 0)
        return Status::Error("--rdzv_endpoint=" + c->rdzv_endpoint +
                             ": the static backend needs HOST:PORT (or drop it and use --master_addr/--master_port)");
      master = *hp;
    } else if (auto hp = ParseHostPort(c->master_addr, master.port); hp.ok()) {
      master.host = hp->host;  // a config not from the CLI may still hold "[::1]"
    }
    s->endpoints = {master};
    return {};
  }
  const int def = s->backend == "etcd" ? kEtcdDefaultPort : kC10dDefaultPort;
  // torchrun: no endpoint is localhost at the backend's port (a single machine's job).
  if (c->rdzv_endpoint.empty()) c->rdzv_endpoint = "localhost:" + std::to_string(def);
  if (c->rdzv_endpoint.find("://") != std::string::npos)
    return Status::Error("--rdzv_endpoint=" + c->rdzv_endpoint +
                         ": give HOST[:PORT] without a scheme (for TLS to etcd: --rdzv_conf protocol=https)");
  std::string_view rest = c->rdzv_endpoint;
  while (!rest.empty()) {
    size_t comma = rest.find(',');
    std::string_view one = rest.substr(0, comma);
    auto hp = ParseHostPort(one, def);
    if (!hp.ok()) return Status::Error("--rdzv_endpoint=" + c->rdzv_endpoint + ": " + hp.message());
    s->endpoints.push_back(*hp);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  if (s->backend == "c10d" && s->endpoints.size() != 1)
    return Status::Error("--rdzv_endpoint=" + c->rdzv_endpoint + ": the c10d backend takes one HOST[:PORT]");
  return {};
}

}  // namespace

StatusOr<HostPort> ParseHostPort(std::string_view text, int default_port) {
  if (text.empty()) return Status::Error("empty address");
  HostPort hp{"", default_port};
  if (text.front() == '[') {
    size_t close = text.find(']');
    if (close == std::string_view::npos || close == 1) return Status::Error("unbalanced '[' in '" + std::string(text) + "'");
    hp.host = std::string(text.substr(1, close - 1));
    std::string_view after = text.substr(close + 1);
    if (after.empty()) return hp;
    if (after.front() != ':') return Status::Error("expected ':PORT' after ']' in '" + std::string(text) + "'");
    auto p = Port(after.substr(1), text);
    if (!p.ok()) return p.status();
    hp.port = *p;
    return hp;
  }
  size_t colon = text.find(':');
  if (colon != std::string_view::npos && text.find(':', colon + 1) != std::string_view::npos) {
    // A bare IPv6 address (no port). What is not one is refused, never split at its last ':' as
    // torchrun does (it reads "::1" as host ":" and port 1).
    if (IsIPv6(text)) {
      hp.host = std::string(text);
      return hp;
    }
    const size_t last = text.rfind(':');
    if (IsIPv6(text.substr(0, last)) && Port(text.substr(last + 1), text).ok())
      return Status::Error("'" + std::string(text) + "': an IPv6 address with a port is written in brackets: [" +
                           std::string(text.substr(0, last)) + "]:" + std::string(text.substr(last + 1)));
    return Status::Error("'" + std::string(text) + "' is neither HOST:PORT nor an IPv6 address");
  }
  hp.host = std::string(text.substr(0, colon));
  if (hp.host.empty()) return Status::Error("no host in '" + std::string(text) + "'");
  if (colon == std::string_view::npos) return hp;
  auto p = Port(text.substr(colon + 1), text);
  if (!p.ok()) return p.status();
  hp.port = *p;
  return hp;
}

Status ResolveSettings(LaunchConfig* c) {
  RdzvSettings s;
  s.backend = c->rdzv_backend == "etcd-v2" ? "etcd" : c->rdzv_backend;
  if (!c->standalone && s.backend == "c10d" && PortIsZero(c->rdzv_endpoint)) {
    if (c->max_nodes > 1)
      return Status::Error("--rdzv_endpoint=" + c->rdzv_endpoint +
                           ": port 0 (any free port) works only for a single node (--nnodes=1): the other "
                           "nodes could not learn the port");
    c->standalone = true;  // as torchrun, whose --standalone is c10d at localhost:0
  }
  // torchrun's standalone job ignores the node rank. One from PET_NODE_RANK (set in every worker
  // pod of a Kubeflow PyTorchJob) is not the user's and goes with it; --node_rank is refused.
  if (c->standalone && c->node_rank_from_env) c->node_rank = 0;
  if (c->standalone) {
    if (c->max_nodes > 1) {
      return Status::Error("--standalone runs a single node, but " + std::string(c->nnodes_from_env ? "PET_NNODES=" : "--nnodes=") +
                           FormatNnodes(c->min_nodes, c->max_nodes) + " asks for more: drop one of them");
    }
    if (c->node_rank != 0)
      return Status::Error("--node_rank=" + std::to_string(c->node_rank) +
                           " with --standalone: a single node has node rank 0 (drop --node_rank)");
    if (Status st = ApplyConf(c->rdzv_conf, &s); !st.ok()) return st;  // checked, though one node needs none
    c->rdzv = s;
    return {};
  }
  if (s.backend != "static" && s.backend != "c10d" && s.backend != "etcd")
    return Status::Error("--rdzv_backend=" + c->rdzv_backend + ": unknown backend (static, c10d, etcd, etcd-v2)");
  if (Status st = ApplyConf(c->rdzv_conf, &s); !st.ok()) return st;
  // As in torchrun, each backend reads one key: static `timeout` (its LaunchConfig sets 900 when
  // none is given), c10d and etcd `join_timeout` (600), which ignore `timeout` (torchrun always
  // passes its 900 there). A static job given only join_timeout waits that long.
  if (s.backend == "static") {
    if (c->rdzv_conf.count("timeout")) s.join_timeout = s.timeout;
    else if (!c->rdzv_conf.count("join_timeout")) s.join_timeout = 900;
  }
  if (s.backend == "static") {
    if (c->min_nodes != c->max_nodes)
      return Status::Error("--nnodes=" + std::to_string(c->min_nodes) + ":" + std::to_string(c->max_nodes) +
                           ": the static rendezvous needs a fixed node count (use --rdzv_backend=c10d for MIN:MAX)");
    if (c->node_rank >= c->max_nodes)
      return Status::Error("--node_rank=" + std::to_string(c->node_rank) + " is out of range for --nnodes=" +
                           std::to_string(c->max_nodes) + (c->max_nodes == 1 ? " (the default)" : "") +
                           ": node ranks are 0.." + std::to_string(c->max_nodes - 1));
    if (Status st = ResolveEndpoints(c, &s); !st.ok()) return st;
    if (c->max_nodes == 1) {
      c->rdzv = s;  // the single-node agent: endpoints[0] is where its workers' store listens
      return {};
    }
  } else if (Status st = ResolveEndpoints(c, &s); !st.ok()) {
    return st;
  }
  s.multi_node = true;
  c->rdzv = s;
  return {};
}

}  // namespace ctrun::rdzv
