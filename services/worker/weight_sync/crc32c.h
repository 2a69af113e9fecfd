// CRC32C (Castagnoli, iSCSI polynomial 0x1EDC6F41, reflected) over byte ranges: the per-bucket
// checksum of the weight-sync wire protocol.
//
// x86-64 CPUs with SSE4.2 use the crc32 instruction (~8 GB/s on one core); elsewhere a table
// fallback (~0.5 GB/s) gives the same values. The choice is made once per process. Pure
// functions, thread-safe. Crc32c("123456789") == 0xE3069283.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/types/span.h"

namespace rl::weight_sync {

// Extends `crc` (the value returned for the bytes before `data`; 0 to start) over `data`.
uint32_t Crc32cExtend(uint32_t crc, const uint8_t* data, size_t size);

inline uint32_t Crc32c(absl::Span<const uint8_t> data) {
  return Crc32cExtend(0, data.data(), data.size());
}

}  // namespace rl::weight_sync
