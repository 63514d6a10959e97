// Why the workers' store could not be bound, as one line for the user: the address does not
// resolve, it is not an address of this machine, or the port is in use (and by whom: a previous
// run of this very job, another job, a process this user cannot see; sys/port_owner.h). Only
// called after StoreServer::Start failed, before any worker started; it probes with a bind of its
// own to tell the cases apart.
#pragma once

#include <string>

#include "config/launch_config.h"

namespace ctrun {

struct StoreBindContext {
  std::string host;             // as the flag gave it, brackets removed ("::1")
  int port = 0;                 // 0: any free port
  std::string addr_flag;        // "--master_addr", "--rdzv_endpoint", "--local_addr"
  std::string port_flag;        // "--master_port", "--rdzv_endpoint"
  std::string run_id;           // this run's id
  std::string entrypoint_name;  // this run's entrypoint file name
};

// Where a single node's workers' store listens (MASTER_ADDR:MASTER_PORT) and the flags that chose
// it: --standalone, a free loopback port (or --local_addr); static, the endpoint rendezvous/
// settings resolved from --rdzv_endpoint or --master_addr:--master_port. The one answer for the
// run and for --dry-run.
StoreBindContext SingleNodeStoreAddress(const LaunchConfig& config);

// "cannot host the workers' store on HOST:PORT: <what is wrong>: <what to do>"; `detail` is the
// store's own message, used when no probe explains the failure.
std::string ExplainStoreBindFailure(const StoreBindContext& ctx, const std::string& detail);

}  // namespace ctrun
