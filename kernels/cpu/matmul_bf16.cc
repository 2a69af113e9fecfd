// The bf16-products matmul (matmul_bf16.h): AVX512-BF16 tiles. The kernels are compiled for
// AVX512-BF16 by a target pragma around this file's internal functions only, so nothing outside
// them (and no inline function from a header) is built with instructions the CPU may lack;
// callers check Bf16ProductsSupported() first.
#include "kernels/cpu/matmul_bf16.h"

#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define RL_HAVE_BF16_PRODUCTS 1
#else
#define RL_HAVE_BF16_PRODUCTS 0
#endif

namespace rl::kernels::cpu {

bool Bf16ProductsSupported() {
#if RL_HAVE_BF16_PRODUCTS
  static const bool supported = [] {  // asked on every bf16-products matmul: CPUID once
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
  }();
  return supported;
#else
  return false;
#endif
}

#if RL_HAVE_BF16_PRODUCTS
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")

namespace {

constexpr int64_t kStep = 32;  // bf16 elements per vector (16 pairs)

// Fully unrolls the loops over a tile's rows and columns, so its accumulators live in registers.
#define RL_UNROLL _Pragma("GCC unroll 16")

// float32 → bf16, rounding to nearest even (as vcvtne2ps2bf16; NaN stays NaN).
uint16_t RoundToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float Bf16ToFloat(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// The kR × kC block y[r0.., c0..]: per element, vdpbf16ps over whole blocks of 32 in index order
// (lane l adds the products of elements 2l and 2l + 1), the horizontal sum, then the tail's
// products in index order. The same for every (kR, kC). With kPrefetch, the next tile's rows of
// W are prefetched one line per line consumed (as the float32 path).
template <int kR, int kC, bool kPrefetch>
void Tile(const uint16_t* xb, const uint16_t* w, float* y, int64_t r0, int64_t c0, int64_t n,
          int64_t k) {
  const uint16_t* wrow[kC];
  RL_UNROLL for (int c = 0; c < kC; ++c) wrow[c] = w + (c0 + c) * k;
  const uint16_t* xrow[kR];
  RL_UNROLL for (int r = 0; r < kR; ++r) xrow[r] = xb + (r0 + r) * k;
  const int64_t ahead = kC * k;
  __m512 acc[kR][kC];
  RL_UNROLL for (int r = 0; r < kR; ++r) {
    RL_UNROLL for (int c = 0; c < kC; ++c) acc[r][c] = _mm512_setzero_ps();
  }
  const int64_t kvec = k - k % kStep;
  for (int64_t i = 0; i < kvec; i += kStep) {
    __m512bh wv[kC];
    RL_UNROLL for (int c = 0; c < kC; ++c) {
      if constexpr (kPrefetch)
        _mm_prefetch(reinterpret_cast<const char*>(wrow[c] + ahead + i), _MM_HINT_T0);
      wv[c] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(wrow[c] + i));
    }
    RL_UNROLL for (int r = 0; r < kR; ++r) {
      const __m512bh xv = reinterpret_cast<__m512bh>(_mm512_loadu_si512(xrow[r] + i));
      RL_UNROLL for (int c = 0; c < kC; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, wv[c]);
    }
  }
  RL_UNROLL for (int r = 0; r < kR; ++r) {
    RL_UNROLL for (int c = 0; c < kC; ++c) {
      float sum = _mm512_reduce_add_ps(acc[r][c]);
      for (int64_t i = kvec; i < k; ++i) sum += Bf16ToFloat(xrow[r][i]) * Bf16ToFloat(wrow[c][i]);
      y[(r0 + r) * n + c0 + c] = sum;
    }
  }
}

// One block of kR rows from r against columns [s0, s1): tiles of kC, then single columns.
template <int kR, int kC>
void RowBlock(const uint16_t* xb, const uint16_t* w, float* y, int64_t r, int64_t n, int64_t k,
              int64_t s0, int64_t s1) {
  int64_t c = s0;
  for (; c + kC <= s1; c += kC) Tile<kR, kC, true>(xb, w, y, r, c, n, k);
  for (; c < s1; ++c) Tile<kR, 1, false>(xb, w, y, r, c, n, k);
}

}  // namespace

void PackRowsBf16(const float* x, int64_t k, int64_t r0, int64_t r1, uint16_t* out) {
  const int64_t kvec = k - k % kStep;
  for (int64_t r = r0; r < r1; ++r) {
    const float* src = x + r * k;
    uint16_t* dst = out + r * k;
    for (int64_t i = 0; i < kvec; i += kStep) {
      const __m512bh packed =
          _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
      _mm512_storeu_si512(dst + i, reinterpret_cast<__m512i>(packed));
    }
    for (int64_t i = kvec; i < k; ++i) dst[i] = RoundToBf16(src[i]);
  }
}

void MatmulColumnsBf16(const uint16_t* xb, const uint16_t* w, float* y, int64_t m, int64_t n,
                       int64_t k, int64_t c_begin, int64_t c_end) {
  // Slabs of W kept in L2 while every block of rows passes over them (a multiple of 8 columns).
  int64_t slab = (int64_t{256} << 10) / (2 * k);
  slab = slab < 8 ? 8 : slab - slab % 8;
  for (int64_t s0 = c_begin; s0 < c_end; s0 += slab) {
    const int64_t s1 = s0 + slab < c_end ? s0 + slab : c_end;
    int64_t r = 0;
    for (; r + 6 <= m; r += 6) RowBlock<6, 4>(xb, w, y, r, n, k, s0, s1);
    for (; r + 2 <= m; r += 2) RowBlock<2, 8>(xb, w, y, r, n, k, s0, s1);
    for (; r < m; ++r) RowBlock<1, 8>(xb, w, y, r, n, k, s0, s1);
  }
}

#pragma GCC pop_options
#else

void PackRowsBf16(const float*, int64_t, int64_t, int64_t, uint16_t*) {}
void MatmulColumnsBf16(const uint16_t*, const uint16_t*, float*, int64_t, int64_t, int64_t, int64_t,
                       int64_t) {}

#endif  // RL_HAVE_BF16_PRODUCTS

}  // namespace rl::kernels::cpu
