#include "services/worker/weight_sync/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace rl::weight_sync {
namespace {

constexpr uint32_t kPolyReflected = 0x82F63B78u;

constexpr std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPolyReflected : c >> 1;
    table[i] = c;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kTable = MakeTable();

uint32_t ExtendPortable(uint32_t crc, const uint8_t* data, size_t size) {
  uint32_t c = ~crc;
  for (size_t i = 0; i < size; ++i) c = kTable[(c ^ data[i]) & 0xFFu] ^ (c >> 8);
  return ~c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t crc, const uint8_t* data,
                                                       size_t size) {
  uint64_t c = ~crc;
  while (size > 0 && (reinterpret_cast<uintptr_t>(data) & 7) != 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *data++);
    --size;
  }
  while (size >= 32) {
    uint64_t w[4];
    std::memcpy(w, data, sizeof(w));
    c = _mm_crc32_u64(c, w[0]);
    c = _mm_crc32_u64(c, w[1]);
    c = _mm_crc32_u64(c, w[2]);
    c = _mm_crc32_u64(c, w[3]);
    data += 32;
    size -= 32;
  }
  while (size >= 8) {
    uint64_t w;
    std::memcpy(&w, data, sizeof(w));
    c = _mm_crc32_u64(c, w);
    data += 8;
    size -= 8;
  }
  while (size > 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *data++);
    --size;
  }
  return ~static_cast<uint32_t>(c);
}
#endif

using ExtendFn = uint32_t (*)(uint32_t, const uint8_t*, size_t);

ExtendFn Choose() {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("sse4.2")) return ExtendSse42;
#endif
  return ExtendPortable;
}

}  // namespace

uint32_t Crc32cExtend(uint32_t crc, const uint8_t* data, size_t size) {
  static const ExtendFn fn = Choose();
  return fn(crc, data, size);
}

}  // namespace rl::weight_sync
