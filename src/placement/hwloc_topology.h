// LoadTopology: the machine's (or an hwloc XML file's) topology through hwloc, with PCI devices.
// hwloc is loaded with dlopen (libhwloc.so.15) the first time binding is asked for, not linked:
// libhwloc pulls libudev into every run and costs each start its dynamic loading, although most
// runs never bind. hwloc.h still provides the types: its ABI is stable within a major version,
// which is checked at load time (hwloc_get_api_version).
#pragma once

#include <string>

#include "base/status.h"
#include "placement/topology.h"

namespace ctrun {

// xml_path "": this machine. with_pci: also the PCI devices (GPU locality); discovering them
// reads much of sysfs, so CPU-only binding leaves them out. The error names the library or the
// file and what went wrong.
StatusOr<Topology> LoadTopology(const std::string& xml_path, bool with_pci = true);

}  // namespace ctrun
