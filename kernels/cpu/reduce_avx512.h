// Horizontal sums of many AVX-512 float vectors at once, bit-identical to one
// _mm512_reduce_add_ps each (the reduction Highway's SumOfLanes uses on AVX3): the same pairs
// are added (lanes l and l + 8, then l + 4, l + 2, l + 1; IEEE addition is commutative), for
// 16 vectors in one tree of 15 additions and 30 shuffles, where 16 separate reductions take
// about 4 times the instructions. A matmul tile's 24 dot products end with this.
// x86-64 GCC/Clang only; the functions carry their own AVX-512F target attribute, so they inline
// into any AVX-512 code (Highway's AVX3 target, the matmul_avx512.cc kernels).
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

namespace rl::kernels::cpu::avx512 {

#define RL_AVX512_INLINE __attribute__((target("avx512f"), always_inline)) inline

// Lane j (j < kN ≤ 16) = _mm512_reduce_add_ps(v[j]); the other lanes are zero.
template <int kN>
RL_AVX512_INLINE __m512 ReduceAdd16(const __m512* v) {
  __m512 s1[8], s2[4], s3[2];
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {  // lanes (l) + (l + 8) of two vectors, in 128-bit blocks
    const __m512 a = 2 * j < kN ? v[2 * j] : _mm512_setzero_ps();
    const __m512 b = 2 * j + 1 < kN ? v[2 * j + 1] : _mm512_setzero_ps();
    s1[j] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {  // (l) + (l + 4): each block then holds one vector's 4 sums
    s2[j] = _mm512_add_ps(_mm512_shuffle_f32x4(s1[2 * j], s1[2 * j + 1], 0x88),
                          _mm512_shuffle_f32x4(s1[2 * j], s1[2 * j + 1], 0xDD));
  }
#pragma GCC unroll 2
  for (int j = 0; j < 2; ++j) {  // (l) + (l + 2)
    s3[j] = _mm512_add_ps(_mm512_shuffle_ps(s2[2 * j], s2[2 * j + 1], 0x44),
                          _mm512_shuffle_ps(s2[2 * j], s2[2 * j + 1], 0xEE));
  }
  const __m512 s4 = _mm512_add_ps(_mm512_shuffle_ps(s3[0], s3[1], 0x88),  // (l) + (l + 1)
                                  _mm512_shuffle_ps(s3[0], s3[1], 0xDD));
  // Lane l of s4 is the sum of v[(l % 4) * 4 + l / 4].
  const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  return _mm512_permutexvar_ps(order, s4);
}

// sums[j] = _mm512_reduce_add_ps(v[j]) for j < kN; `sums` has room for kN rounded up to 16.
template <int kN>
RL_AVX512_INLINE void ReduceAddEach(const __m512* v, float* sums) {
#pragma GCC unroll 4
  for (int j = 0; j + 16 <= kN; j += 16) _mm512_storeu_ps(sums + j, ReduceAdd16<16>(v + j));
  if constexpr (kN % 16 != 0) {
    _mm512_storeu_ps(sums + kN - kN % 16, ReduceAdd16<kN % 16>(v + kN - kN % 16));
  }
}

// A tile's kR x kC sums (row-major, kN = kR · kC of them in the first kN floats of `sums`, which
// holds whole vectors of 16) stored into y: row r's kC sums at y + r * row_stride, one masked
// store per row.
template <int kR, int kC>
RL_AVX512_INLINE void StoreRows(const float* sums, float* y, int64_t row_stride) {
  constexpr int kVectors = (kR * kC + 15) / 16;
  __m512 s[kVectors + 1];
#pragma GCC unroll 4
  for (int q = 0; q < kVectors; ++q) s[q] = _mm512_loadu_ps(sums + 16 * q);
  s[kVectors] = _mm512_setzero_ps();
  const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  constexpr __mmask16 kMask = static_cast<__mmask16>((1u << kC) - 1);
#pragma GCC unroll 16
  for (int r = 0; r < kR; ++r) {
    const int first = r * kC;  // flat index of the row's first sum
    const int q = first / 16;
    const int o = first % 16;
    __m512 row;
    if (o == 0) {
      row = s[q];
    } else if (o + kC <= 16) {
      row = _mm512_permutexvar_ps(_mm512_add_epi32(iota, _mm512_set1_epi32(o)), s[q]);
    } else {  // the row straddles s[q] and s[q + 1]: indices 16-31 pick from the second
      row = _mm512_permutex2var_ps(s[q], _mm512_add_epi32(iota, _mm512_set1_epi32(o)), s[q + 1]);
    }
    _mm512_mask_storeu_ps(y + r * row_stride, kMask, row);
  }
}

// The sums of a tile's kR x kC accumulators (row-major in acc) stored straight into y (row r's
// kC sums at y + r * row_stride).
template <int kR, int kC>
RL_AVX512_INLINE void StoreSums(const __m512* acc, float* y, int64_t row_stride) {
  alignas(64) float sums[(kR * kC + 15) / 16 * 16];
  ReduceAddEach<kR * kC>(acc, sums);
  StoreRows<kR, kC>(sums, y, row_stride);
}

#undef RL_AVX512_INLINE

}  // namespace rl::kernels::cpu::avx512

#endif  // x86-64 GCC/Clang
