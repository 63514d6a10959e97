// libFuzzer target for the rendezvous state decoder (src/rendezvous/rdzv_state.cc): the state JSON
// is read from the rendezvous store or etcd, where any agent (or anything holding the token) can
// write it. Checked properties (a violation traps):
//  - Decode never crashes, throws, leaks or reads out of bounds (ASan/UBSan);
//  - a state that decodes re-encodes to text that decodes to the same encoding (a fixed point), so
//    agents that re-publish a state never drift from each other.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "rendezvous/rdzv_state.h"

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  auto s = ctrun::rdzv::Decode(in);
  if (!s.ok()) return 0;
  const std::string once = ctrun::rdzv::Encode(*s);
  auto again = ctrun::rdzv::Decode(once);
  Check(again.ok());
  Check(ctrun::rdzv::Encode(*again) == once);
  return 0;
}
