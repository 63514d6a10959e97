// Rendezvous settings: --rdzv_backend / --rdzv_endpoint / --rdzv_conf / --master_* / --nnodes ->
// the typed LaunchConfig::rdzv, once, before anything starts. Bad input is one line for exit 2.
#pragma once

#include <string_view>

#include "base/status.h"
#include "config/launch_config.h"

namespace ctrun::rdzv {

// Fills config->rdzv. Errors name the flag and the value.
Status ResolveSettings(LaunchConfig* config);

// "host", "host:port", "[v6]", "[v6]:port", "v6 without brackets" (no port then) -> HostPort;
// default_port when none is given. Text with two or more ':' that is not a valid IPv6 address is
// an error (one that is an address and a port names the bracketed form).
StatusOr<HostPort> ParseHostPort(std::string_view text, int default_port);

}  // namespace ctrun::rdzv
