// Backend: builds the multi-node rendezvous of a run from LaunchConfig::rdzv — the log it runs on
// (ctrun's store for static/c10d, etcd v3 for etcd), the store this agent hosts when it is the
// rendezvous host, this node's address as the others reach it, and the Rendezvous itself.
#pragma once

#include <memory>
#include <string>

#include "base/status.h"
#include "config/launch_config.h"
#include "rendezvous/rendezvous.h"
#include "store/store_server.h"
#include "sys/event_loop.h"

namespace ctrun::rdzv {

// Not movable: the rendezvous of a c10d host candidate that found its port taken may set
// hosted_store later (see MakeBackend). Members are destroyed in reverse order: the rendezvous,
// whose log may set hosted_store, before the store.
struct Backend {
  Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  std::unique_ptr<store::StoreServer> hosted_store;  // set when this agent hosts the rendezvous store
  std::unique_ptr<Rendezvous> rendezvous;
  std::string node_addr;  // --local_addr, else the local address that routes to the endpoint
};

// The token agents present to the rendezvous store (ctrun AUTH): $CTRUN_RDZV_TOKEN, else the run id.
std::string RendezvousToken(const LaunchConfig& config);

// Fills *backend (empty). A c10d agent on the endpoint's machine that finds the port taken
// connects as a client; while nothing answers there, it tries again to host before each retry of
// its connect, and hosted_store is set when it does. Errors are one line for the user (ctrun
// exits with kExitRendezvous).
[[nodiscard]] Status MakeBackend(const LaunchConfig& config, EventLoop& loop, const std::string& hostname,
                                 Backend* backend);

}  // namespace ctrun::rdzv
