// crc32c.h — CRC-32C (Castagnoli), the checksum of snapshot files (private to ctrun_worker).
//
// Contract: crc32c_extend(crc, data, n) continues a running CRC (start from 0) and returns the
// finished value, so crc32c_extend(crc32c_extend(0, a), b) == crc32c(a ++ b). Uses the SSE4.2
// crc32 instruction when the CPU has it (checked once at run time), else a slice-by-8 table.
// Chosen over zlib's crc32 (no extra dependency; ~10x faster with SSE4.2) and over XXH64
// (zstd does not export it). Check value: crc32c("123456789") == 0xE3069283.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ctrun::worker {

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n);
inline uint32_t crc32c(const void* data, size_t n) { return crc32c_extend(0, data, n); }
uint32_t crc32c_software(uint32_t crc, const void* data, size_t n);  // for tests

}  // namespace ctrun::worker
