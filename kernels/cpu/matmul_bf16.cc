// The bf16-products matmul (matmul_bf16.h): the support check, x rounded to bf16, and the
// AVX512-BF16 tiles. The kernels are compiled for AVX512-BF16 by a target pragma around this
// file's internal functions only, so nothing outside them is built with instructions the CPU may
// lack; callers check Bf16ProductsSupported() first.
#include "kernels/cpu/matmul_bf16.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#include "kernels/cpu/reduce_avx512.h"
#include "kernels/cpu/tiles_avx512.h"
#define RL_HAVE_BF16_PRODUCTS 1
#else
#define RL_HAVE_BF16_PRODUCTS 0
#endif

namespace rl::kernels::cpu {

bool Bf16ProductsSupported() {
  return GetCpuInfo().avx512_bf16;  // CPUID once per process (asked on every matmul)
}

#if RL_HAVE_BF16_PRODUCTS

namespace {

constexpr int64_t kStep = 32;  // bf16 elements of k per step (16 lanes of pairs)
constexpr int kLanes = 16;
// Rows of x per register tile (kCols columns each), and columns of the 1- and 2-row tiles.
constexpr int kRows = 8;
constexpr int kCols = 3;
constexpr int kGemvCols = 8;
// The widest slab when k is chunked: its tiles' accumulators wait in a stack buffer (36 KiB).
constexpr int64_t kMaxChunkedSlab = 72;

// Fully unrolls the loops over a tile's rows and columns, so its accumulators live in registers.
#define RL_UNROLL _Pragma("GCC unroll 16")

// The part of k one tile call covers: steps [i0, i1), from zero (first) or the carried
// accumulators, ending with the sums written to y (last) or the accumulators carried. Splitting
// k only pauses the accumulators: each element's additions stay in the same order.
struct Span {
  int64_t i0 = 0;
  int64_t i1 = 0;
  bool first = true;
  bool last = true;
};

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

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")

// Keeps `v` in a register from here on (GCC otherwise folds a vector's load into each use).
#define RL_IN_REGISTER(v) __asm__("" : "+v"(v))

// prefetcht0 of the line at p, as volatile asm: GCC 12 drops _mm_prefetch / __builtin_prefetch
// in these kernels (seen in the disassembly).
inline void PrefetchLine(const void* p) {
  __asm__ volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
}

// The next tile's lines for step i: in address order over a whole k (its rows are contiguous:
// kC lines per step, all of it by the end of the tile), else the same part of each next row.
template <int kC>
inline void PrefetchNext(const uint16_t* const* wrow, int64_t k, int64_t i, bool whole_k) {
  if (whole_k) {
    const char* lines = reinterpret_cast<const char*>(wrow[0] + kC * k) + (i / kStep) * kC * 64;
    RL_UNROLL for (int c = 0; c < kC; ++c) PrefetchLine(lines + 64 * c);
  } else {
    RL_UNROLL for (int c = 0; c < kC; ++c) PrefetchLine(wrow[c] + kC * k + i);
  }
}

// The asm loop's arguments for a tile of rows xrow, weight rows wrow, over `span`.
template <int kC>
avx512::TileLoopArgs ArgsFor(const uint16_t* x0, const uint16_t* const* wrow, int64_t k,
                             const Span& span, float* carry, float* out) {
  avx512::TileLoopArgs a;
  a.x0 = x0 + span.i0;
  a.xs = 2 * k;
  a.w0 = wrow[0] + span.i0;
  a.ws = 2 * k;
  a.pf = reinterpret_cast<const char*>(wrow[0] + kC * k);  // the next tile
  if (span.first && span.last) {                           // its lines in address order
    a.pf += (span.i0 / kStep) * kC * 64;
    a.ps = 64;
    a.pa = kC * 64;
  } else {  // the same part of each next row
    a.pf += 2 * span.i0;
    a.ps = 2 * k;
    a.pa = 64;
  }
  a.steps = (span.i1 - span.i0) / kStep;
  a.acc_in = span.first ? nullptr : carry;
  a.acc_out = out;
  return a;
}

// The horizontal sums of a finished tile's accumulators (row-major), then the tail of k's
// products in index order, into y.
template <int kR, int kC>
void FinishTile(const __m512* acc, const uint16_t* const* xrow, const uint16_t* const* wrow,
                float* y, int64_t r0, int64_t c0, int64_t n, int64_t k) {
  const int64_t kvec = k - k % kStep;
  if (kvec == k) {  // no tail: the sums go straight to y
    avx512::StoreSums<kR, kC>(acc, y + r0 * n + c0, n);
    return;
  }
  float sums[(kR * kC + 15) / 16 * 16];
  avx512::ReduceAddEach<kR * kC>(acc, sums);
  RL_UNROLL for (int r = 0; r < kR; ++r) {
    RL_UNROLL for (int c = 0; c < kC; ++c) {
      float sum = sums[r * kC + c];
      for (int64_t i = kvec; i < k; ++i) sum += Bf16ToFloat(xrow[r][i]) * Bf16ToFloat(wrow[c][i]);
      y[(r0 + r) * n + c0 + c] = sum;
    }
  }
}

// The bf16-products tile: vdpbf16ps adds each lane's pair of bf16 products of x and w.
template <int kR, int kC, bool kPrefetch>
void TileProducts(const void* xv, const uint16_t* w, float* y, int64_t r0, int64_t c0, int64_t n,
                  int64_t k, const Span& span, float* carry) {
  const auto* xb = static_cast<const uint16_t*>(xv);
  const uint16_t* wrow[kC];
  RL_UNROLL for (int c = 0; c < kC; ++c) wrow[c] = w + (c0 + c) * k;
  const uint16_t* xrow[kR];
  RL_UNROLL for (int r = 0; r < kR; ++r) xrow[r] = xb + (r0 + r) * k;
  if constexpr (kR == 8 && kC == 3 && kPrefetch) {
    alignas(64) float mem[kR * kC * kLanes];
    avx512::TileLoopArgs a = ArgsFor<kC>(xrow[0], wrow, k, span, carry, span.last ? mem : carry);
    a.reduce = span.last && k % kStep == 0;  // no tail: the asm sums the accumulators
    avx512::Products8x3(a);
    if (a.reduce) {
      avx512::StoreRows<kR, kC>(mem, y + r0 * n + c0, n);
    } else if (span.last) {
      FinishTile<kR, kC>(reinterpret_cast<const __m512*>(mem), xrow, wrow, y, r0, c0, n, k);
    }
    return;
  }
  __m512 acc[kR][kC];
  RL_UNROLL for (int r = 0; r < kR; ++r) {
    RL_UNROLL for (int c = 0; c < kC; ++c) {
      acc[r][c] = span.first ? _mm512_setzero_ps() : _mm512_load_ps(carry + (r * kC + c) * kLanes);
    }
  }
  const bool whole_k = span.first && span.last;
  for (int64_t i = span.i0; i < span.i1; i += kStep) {
    if constexpr (kPrefetch) PrefetchNext<kC>(wrow, k, i, whole_k);
    __m512i wv[kC];
    RL_UNROLL for (int c = 0; c < kC; ++c) {
      wv[c] = _mm512_loadu_si512(wrow[c] + i);
      RL_IN_REGISTER(wv[c]);
    }
    RL_UNROLL for (int r = 0; r < kR; ++r) {
      __m512i xr = _mm512_loadu_si512(xrow[r] + i);
      RL_IN_REGISTER(xr);
      RL_UNROLL for (int c = 0; c < kC; ++c) {
        acc[r][c] = _mm512_dpbf16_ps(acc[r][c], reinterpret_cast<__m512bh>(xr),
                                     reinterpret_cast<__m512bh>(wv[c]));
      }
    }
  }
  if (!span.last) {
    RL_UNROLL for (int r = 0; r < kR; ++r) {
      RL_UNROLL for (int c = 0; c < kC; ++c) {
        _mm512_store_ps(carry + (r * kC + c) * kLanes, acc[r][c]);
      }
    }
    return;
  }
  FinishTile<kR, kC>(&acc[0][0], xrow, wrow, y, r0, c0, n, k);
}

// One block of kR rows from r against columns [s0, s1): over k in chunks of `chunk` elements
// (all of k when chunk covers it), each chunk through every tile of kC columns (prefetching the
// next), then single columns.
template <int kR, int kC>
void RowBlock(const uint16_t* xb, const uint16_t* w, float* y, int64_t r, int64_t n, int64_t k,
              int64_t s0, int64_t s1, int64_t chunk, float* carry) {
  const int64_t kvec = k - k % kStep;
  for (int64_t i0 = 0;; i0 += chunk) {
    Span span;
    span.i0 = i0;
    span.i1 = std::min(kvec, i0 + chunk);
    span.first = i0 == 0;
    span.last = span.i1 == kvec;
    int64_t c = s0;
    for (; c + kC <= s1; c += kC) {
      TileProducts<kR, kC, true>(xb, w, y, r, c, n, k, span, carry + (c - s0) * kR * kLanes);
    }
    for (; c < s1; ++c) {
      TileProducts<kR, 1, false>(xb, w, y, r, c, n, k, span, carry + (c - s0) * kR * kLanes);
    }
    if (span.last) return;
  }
}

#pragma GCC pop_options

}  // namespace

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")

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
                       int64_t k, int64_t c_begin, int64_t c_end, const KernelPlan& plan) {
  const int64_t kvec = k - k % kStep;
  // Slabs of W kept in L2 while every block of rows passes over them (whole tiles of both
  // widths); k in chunks when a block's x rows would not stay in L1.
  int64_t slab = plan.slab_bytes / (2 * k);
  slab = std::max<int64_t>(24, slab - slab % 24);
  const int64_t whole = kvec + kStep;  // a chunk covering all of k
  int64_t chunk = whole;
  int64_t chunk4 = whole;
  if (kRows * kvec * 2 > plan.x_block_bytes) {
    chunk = std::max(kStep, plan.x_block_bytes / (kRows * 2) / kStep * kStep);
    slab = std::min(slab, kMaxChunkedSlab);
    if (4 * kvec * 2 > plan.x_block_bytes) chunk4 = chunk;
  }
  alignas(64) float carry[kMaxChunkedSlab * kRows * kLanes];
  for (int64_t s0 = c_begin; s0 < c_end; s0 += slab) {
    const int64_t s1 = std::min(c_end, s0 + slab);
    int64_t r = 0;
    for (; r + kRows <= m; r += kRows) {
      RowBlock<kRows, kCols>(xb, w, y, r, n, k, s0, s1, chunk, carry);
    }
    for (; r + 4 <= m; r += 4) RowBlock<4, kCols>(xb, w, y, r, n, k, s0, s1, chunk4, carry);
    // One or two rows (decode): weights streamed once for both, k never chunked.
    for (; r + 2 <= m; r += 2) RowBlock<2, kGemvCols>(xb, w, y, r, n, k, s0, s1, whole, carry);
    for (; r < m; ++r) RowBlock<1, kGemvCols>(xb, w, y, r, n, k, s0, s1, whole, carry);
  }
}

#pragma GCC pop_options

#else

void PackRowsBf16(const float*, int64_t, int64_t, int64_t, uint16_t*) {}
void MatmulColumnsBf16(const uint16_t*, const uint16_t*, float*, int64_t, int64_t, int64_t, int64_t,
                       int64_t, const KernelPlan&) {}

#endif  // RL_HAVE_BF16_PRODUCTS

}  // namespace rl::kernels::cpu
