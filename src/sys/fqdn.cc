#include "sys/fqdn.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <vector>

namespace ctrun {

std::string Fqdn(const std::string& hostname) {
  if (hostname.empty()) return hostname;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(hostname.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) return hostname;
  const void* addr = nullptr;
  socklen_t len = 0;
  if (res->ai_family == AF_INET) {
    addr = &reinterpret_cast<const sockaddr_in*>(res->ai_addr)->sin_addr;
    len = sizeof(in_addr);
  } else if (res->ai_family == AF_INET6) {
    addr = &reinterpret_cast<const sockaddr_in6*>(res->ai_addr)->sin6_addr;
    len = sizeof(in6_addr);
  }
  const int family = res->ai_family;
  std::string name = hostname;
  if (addr != nullptr) {
    hostent he{};
    hostent* result = nullptr;
    std::vector<char> buf(16384);
    int err = 0;
    if (::gethostbyaddr_r(addr, len, family, &he, buf.data(), buf.size(), &result, &err) == 0 && result &&
        result->h_name) {
      name = result->h_name;
      if (name.find('.') == std::string::npos)
        for (char** a = result->h_aliases; a && *a; ++a)
          if (std::string(*a).find('.') != std::string::npos) {
            name = *a;
            break;
          }
    }
  }
  ::freeaddrinfo(res);
  return name;
}

}  // namespace ctrun
