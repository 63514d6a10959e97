// The host name torchrun prints in its failure summary: Python's socket.getfqdn() of this host
// (the name the host's address maps back to, e.g. "localhost" when /etc/hosts maps the host name
// to 127.0.0.1 under that name first). Resolver calls: use once, at the end of a run.
#pragma once

#include <string>

namespace ctrun {

// socket.getfqdn(hostname): resolve hostname, map its first address back (gethostbyaddr), and
// return the first of that name and its aliases that contains a '.', else that name; hostname
// itself when a step fails.
std::string Fqdn(const std::string& hostname);

}  // namespace ctrun
