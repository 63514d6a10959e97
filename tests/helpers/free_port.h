// Free loopback TCP ports for tests that start servers (racy by nature: free a moment ago), drawn
// below the ephemeral range as ctrun's own (sys/free_port.h): a port from it could be taken,
// between the draw and the server's bind, as the local port of an outgoing connection of a test
// running alongside.
#pragma once

#include <vector>

#include "sys/free_port.h"

namespace ctrun::testing {

// `n` distinct ports that were free a moment ago (0 for each that could not be found).
inline std::vector<int> FreePorts(int n) { return FindFreePorts(n); }

// One such port (0 when none could be found).
inline int FreePort() { return FindFreePort(); }

}  // namespace ctrun::testing
