#include "config/rdzv_settings.h"

namespace ctrun {

std::string HostPort::ToString() const {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

}  // namespace ctrun
