// Deterministic snapshot payloads for the worker tests: Pattern(step) has a step-dependent length
// (1..6 MiB) and content, so a load can prove it got exactly the bytes saved for that step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ctrun::testing {

inline std::vector<std::byte> Pattern(uint64_t step) {
  const size_t n = (1u << 20) + static_cast<size_t>((step * 2654435761u) % (5u << 20));
  std::vector<std::byte> v(n);
  uint64_t x = step * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v[i] = static_cast<std::byte>(x);
  }
  return v;
}

}  // namespace ctrun::testing
