// RdzvSettings: the typed rendezvous settings of a multi-node run, derived once from the flags
// (--rdzv_backend, --rdzv_endpoint, --rdzv_conf, --master_addr/--master_port, --nnodes) by
// rendezvous/settings.h. Plain data; the raw --rdzv_conf map stays in LaunchConfig for reference.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ctrun {

struct HostPort {
  std::string host;  // a name, an IPv4 address, or an IPv6 address without brackets
  int port = 0;
  // "host:port", with brackets around an IPv6 address.
  std::string ToString() const;
};

struct RdzvSettings {
  // false: the single-node agent (--standalone, or static with one node); nothing below is used.
  bool multi_node = false;
  std::string backend = "static";      // static | c10d | etcd ("etcd-v2" is an alias of etcd)
  std::vector<HostPort> endpoints;     // static: the master (also for one node: where its workers'
                                       // store listens); c10d: the store; etcd: one or more
  // --rdzv_conf keys, with torchrun's defaults (seconds).
  double join_timeout = 600;           // join_timeout (static: timeout, 900 when not given, as torchrun)
  double timeout = 0;                  // timeout as given (0: not): the static backend's join timeout
  double last_call_timeout = 30;       // last_call_timeout
  double close_timeout = 30;           // close_timeout (accepted; ctrun closes at once)
  double keep_alive_interval = 5;      // keep_alive_interval
  int keep_alive_max_attempt = 3;      // keep_alive_max_attempt: deadline = interval x attempts
  double read_timeout = 60;            // read_timeout: one store / etcd request
  std::optional<bool> is_host;         // is_host (c10d): host the store or not; unset: by address
  std::string etcd_prefix = "/torchelastic/p2p";  // etcd_prefix
  std::string protocol = "http";       // protocol (etcd): http | https
  std::string cacert, cert, key;       // cacert / cert / key (etcd TLS)
  std::string username;                // username (etcd auth; password from CTRUN_ETCD_PASSWORD)
};

}  // namespace ctrun
