#include "agent/store_bind_error.h"

#include <netdb.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "base/unique_fd.h"
#include "config/rdzv_settings.h"
#include "sys/port_owner.h"

namespace ctrun {
namespace {

// errno of a bind like the store's (SO_REUSEADDR) to the first address of `ai`; 0 when it works.
int ProbeBind(const addrinfo* ai) {
  UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
  if (!fd) return errno;
  const int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  return ::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : errno;
}

}  // namespace

StoreBindContext SingleNodeStoreAddress(const LaunchConfig& config) {
  StoreBindContext c;
  c.run_id = config.run_id;
  c.entrypoint_name = std::filesystem::path(config.entrypoint).filename().string();
  if (config.standalone) {
    c.host = config.local_addr.empty() ? "127.0.0.1" : config.local_addr;
    c.addr_flag = "--local_addr";
    c.port_flag = "--master_port";
    return c;
  }
  const bool endpoint = !config.rdzv_endpoint.empty();
  c.addr_flag = endpoint ? "--rdzv_endpoint" : "--master_addr";
  c.port_flag = endpoint ? "--rdzv_endpoint" : "--master_port";
  if (!config.rdzv.endpoints.empty()) {
    c.host = config.rdzv.endpoints.front().host;
    c.port = config.rdzv.endpoints.front().port;
  } else {
    c.host = config.master_addr;
    c.port = config.master_port.value_or(29500);
  }
  return c;
}

std::string ExplainStoreBindFailure(const StoreBindContext& ctx, const std::string& detail) {
  const std::string where = "cannot host the workers' store on " + HostPort{ctx.host, ctx.port}.ToString() + ": ";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(ctx.port);
  if (const int rc = ::getaddrinfo(ctx.host.c_str(), port.c_str(), &hints, &res); rc != 0)
    return where + ctx.addr_flag + "=" + ctx.host + " does not resolve (" + ::gai_strerror(rc) +
           "): give a host name or IP address of this machine";
  const int err = ProbeBind(res);
  ::freeaddrinfo(res);
  if (err == EADDRINUSE)
    return where + DescribePortHolder(FindPortHolder(ctx.port), ctx.run_id, ctx.entrypoint_name, ctx.port_flag);
  if (err == EADDRNOTAVAIL)
    return where + ctx.addr_flag + "=" + ctx.host +
           " is not an address of this machine (node rank 0 hosts the store there): give one of its "
           "addresses, e.g. 127.0.0.1 for a single node";
  if (err == EACCES)
    return where + "port " + port + " needs privileges (ports below 1024): pick another " + ctx.port_flag;
  return where + detail;
}

}  // namespace ctrun
