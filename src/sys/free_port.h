// Free loopback TCP ports for a server that something else binds later (worker rank 0's store
// with --no-agent-store, gdbserver of --debug-rank; the tests' servers). Racy by nature: a port
// is only known to have been free a moment ago. Ports are drawn below the kernel's ephemeral range,
// so the one race that no careful neighbour can avoid is gone: a port from that range can be taken,
// before the server binds it, as the local port of any outgoing connection on the machine (and then
// the bind fails while nothing listens there). Never near torchrun's defaults (29400, 29500), which
// people pass by hand. From the range (the kernel's choice, port 0) only when too few lie below it.
#pragma once

#include <string>
#include <vector>

#include "base/unique_fd.h"

namespace ctrun {

// `n` distinct ports, all free at once a moment ago (bound together, then released); 0 for each
// that could not be found.
std::vector<int> FindFreePorts(int n);
inline int FindFreePort() { return FindFreePorts(1)[0]; }

// A TCP socket bound to loopback `port` (0: the kernel's choice), not listening; *bound gets the
// port, 0 when the bind failed (the fd is then empty).
UniqueFd BindLoopback(int port, int* bound);

// The low end of the ephemeral range in an ip_local_port_range file (32768 when unreadable).
int EphemeralPortsStart(const std::string& path = "/proc/sys/net/ipv4/ip_local_port_range");

}  // namespace ctrun
