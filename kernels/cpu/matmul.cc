#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <atomic>
#include <numeric>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "kernels/cpu/matmul_bf16.h"
#include "kernels/cpu/reduce_avx512.h"
#include "kernels/cpu/tiles_avx512.h"

// foreach_target first, then highway.h, then the per-target headers (not sorted):
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/matmul.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/cache_control.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace rl::kernels::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using model_io::DType;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Loads lanes(DF) weights starting at element `i` of row `w`, widened to float32.
template <DType kW>
HWY_INLINE VF LoadW(DF d, const void* w, int64_t i) {
  if constexpr (kW == DType::kF32) {
    return hn::LoadU(d, static_cast<const float*>(w) + i);
  } else if constexpr (kW == DType::kBF16) {
    const hn::Rebind<uint16_t, DF> du16;
    const hn::Rebind<uint32_t, DF> du32;
    const auto raw = hn::LoadU(du16, static_cast<const uint16_t*>(w) + i);
    return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du32, raw)));
  } else {
    const hn::Rebind<hwy::float16_t, DF> df16;
    return hn::PromoteTo(d, hn::LoadU(df16, static_cast<const hwy::float16_t*>(w) + i));
  }
}

template <DType kW>
HWY_INLINE float ScalarW(const void* w, int64_t i) {
  if constexpr (kW == DType::kF32) {
    return static_cast<const float*>(w)[i];
  } else if constexpr (kW == DType::kBF16) {
    return model_io::Bf16ToF32(static_cast<const uint16_t*>(w)[i]);
  } else {
    return model_io::F16ToF32(static_cast<const uint16_t*>(w)[i]);
  }
}

// BF16 weights are read 2 · lanes at a time as lanes pairs of (even, odd) elements, each pair
// one 32-bit lane: the even elements widen with one shift and the odd ones with one AND, where
// widening each vector alone takes a zero-extension and a shift. On AVX-512 those operations
// share ports 0 and 5 with the FMAs, so this takes a 6 × 4 tile from 32 to 28 issue slots per
// 24 FMAs. x is read in the same order, from a copy with each block of 2 · lanes elements
// split into its even then its odd elements (PackPairs). Little-endian lanes (every Highway
// target this builds). The scalar target reads one element at a time as before.
#if HWY_TARGET == HWY_SCALAR
constexpr bool kPairedBf16 = false;
#else
constexpr bool kPairedBf16 = true;
#endif

template <DType kW>
constexpr bool Paired() {
  return kW == DType::kBF16 && kPairedBf16;
}

// Elements of k per step of the vector loop: the part of k before the scalar tail is a
// multiple of it.
template <DType kW>
HWY_INLINE int64_t StepElems(DF d) {
  return static_cast<int64_t>(hn::Lanes(d)) * (Paired<kW>() ? 2 : 1);
}

#if HWY_TARGET != HWY_SCALAR
// The even (kOdd false) or odd elements of the 2 · lanes bf16 weights at element `i` of `w`,
// widened to float32.
template <bool kOdd>
HWY_INLINE VF LoadBf16Half(DF d, const void* w, int64_t i) {
  const hn::Repartition<uint16_t, DF> du16;
  const hn::Repartition<uint32_t, DF> du32;
  const auto pairs = hn::BitCast(du32, hn::LoadU(du16, static_cast<const uint16_t*>(w) + i));
  if constexpr (kOdd) {
    return hn::BitCast(d, hn::And(pairs, hn::Set(du32, 0xFFFF0000u)));
  } else {
    return hn::BitCast(d, hn::ShiftLeft<16>(pairs));
  }
}
#endif

// x rows as paired BF16 tiles read them: within each block of 2 · lanes elements before the
// scalar tail, the even elements then the odd ones; the tail as it is. Rows [r0, r1).
void PackPairsImpl(const float* x, int64_t k, int64_t r0, int64_t r1, float* out) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t step = 2 * lanes;
  const int64_t kvec = k - k % step;
  for (int64_t r = r0; r < r1; ++r) {
    const float* src = x + r * k;
    float* dst = out + r * k;
    int64_t i = 0;
#if HWY_TARGET != HWY_SCALAR
    for (; i < kvec; i += step) {
      const VF lo = hn::LoadU(d, src + i);
      const VF hi = hn::LoadU(d, src + i + lanes);
      hn::StoreU(hn::ConcatEven(d, hi, lo), d, dst + i);
      hn::StoreU(hn::ConcatOdd(d, hi, lo), d, dst + i + lanes);
    }
#endif
    for (; i < k; ++i) dst[i] = src[i];
  }
  (void)kvec;
}

// Fully unrolls the loops over a tile's rows and columns, so its accumulators live in registers
// (GCC keeps arrays indexed in a rolled loop in memory).
#define RL_UNROLL _Pragma("GCC unroll 16")

// sums[j] = GetLane(SumOfLanes(v[j])) for j < kN. On AVX3 (whose SumOfLanes is
// _mm512_reduce_add_ps) 16 at a time by one tree of the same additions (reduce_avx512.h): the
// same bits for a quarter of the instructions, which at k = 1024 were a tenth of a tile's.
template <int kN>
HWY_INLINE void SumEach(DF d, const VF* v, float* sums) {
#if HWY_TARGET == HWY_AVX3
  (void)d;
  __m512 raw[kN];
  RL_UNROLL for (int j = 0; j < kN; ++j) raw[j] = v[j].raw;
  avx512::ReduceAddEach<kN>(raw, sums);
#else
  RL_UNROLL for (int j = 0; j < kN; ++j) sums[j] = hn::GetLane(hn::SumOfLanes(d, v[j]));
#endif
}

// Columns (rows of W) per pass of a single row of x: one accumulator and one weight vector
// each, so 8 on the 32-register targets and 4 on AVX2 (16 registers).
constexpr int kGemvCols = HWY_TARGET == HWY_AVX2 ? 4 : 8;
// Columns (rows of W) per tile of a lone row of x (batch-1 decode): 4, whose prefetch of the
// next tile runs 8-24 KiB ahead (k = 1024-3072) over 4 row streams. With 8 (the 2-row tiles'
// width) it ran 16-48 KiB ahead over 8 streams, and at k = 3072 a tile's lines were prefetched
// one L1's worth ahead of their use: Zen 5, 1 thread, weights in 2 MiB pages, the m = 1 matmuls
// of a layer at 79-80% of the read-only stream with 8, 86-87% with 4, 75-77% with 2 (prefetching
// two tiles ahead instead: 77-78%). Which tile computes an element changes none of its bits.
constexpr int kGemv1Cols = 4;
// The many-row tiles: kGemmRows × kGemmCols accumulators, 6 × 4 on the 32-register targets
// (24 accumulators + 4 weight vectors + x; measured 1.3-1.6x faster than 8 × 3, whose x
// loads the compiler folds into every FMA) and 4 × 3 on AVX2.
constexpr int kGemmRows = HWY_TARGET == HWY_AVX2 ? 4 : 6;
constexpr int kGemmCols = HWY_TARGET == HWY_AVX2 ? 3 : 4;

// Computes the kR × kC block y[r0.., c0..] of dot products (no bias). The per-element order
// is the same for every (kR, kC): one accumulator per element over full vectors, the
// horizontal sum, then the tail in index order.
// With kPrefetch, each pass over a whole k also prefetches
// the block of W rows one tile ahead (rows are contiguous, so that is the next tile's data), one
// cache line per row per line consumed (a span of a long k prefetches its own rows instead): decode
// at small batches is a stream of W and the hardware prefetchers alone leave the memory system idle
// between tiles (measured: batch 1 at ~55% of the read-only stream without, ~100% with; batch
// 4-8 1.4-1.7x faster). The part of k one Tile call covers: vector steps [i0, i1) (i1 ≤ the vector
// part of k), starting from zero (first) or from the accumulators in `carry`, and ending with the
// sums written to y (last) or the accumulators stored in `carry` (kR × kC vectors). Splitting k
// this way only pauses the accumulators: each element's additions stay in the same order.
struct KSpan {
  int64_t i0 = 0;
  int64_t i1 = 0;
  bool first = true;
  bool last = true;
};

template <DType kW, int kR, int kC, bool kPrefetch = false>
HWY_INLINE void Tile(const float* x, const void* w, float* y, int64_t r0, int64_t c0, int64_t n,
                     int64_t k, const KSpan& span, float* carry) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  constexpr int64_t kWSize = kW == DType::kF32 ? 4 : 2;
  const uint8_t* wrow[kC];
  RL_UNROLL for (int c = 0; c < kC; ++c) {
    wrow[c] = static_cast<const uint8_t*>(w) + (c0 + c) * k * kWSize;
  }
  const int64_t ahead = kC * k * kWSize;  // bytes from a row to the same row one tile on
  const float* xrow[kR];
  RL_UNROLL for (int r = 0; r < kR; ++r) xrow[r] = x + (r0 + r) * k;
#if HWY_TARGET == HWY_AVX3 && RL_HAVE_ASM_TILES
  // BF16 weights on AVX-512: the same operations from the asm loops of tiles_avx512.h.
  if constexpr (kW == DType::kBF16 && kPrefetch && ((kR == 6 && kC == 4) || (kR == 2 && kC == 8))) {
    if (kR > 2 || (span.first && span.last)) {
      HWY_ALIGN float mem[kR * kC * HWY_LANES(float)];
      avx512::TileLoopArgs a;
      a.x0 = xrow[0] + span.i0;
      a.xs = k * static_cast<int64_t>(sizeof(float));
      a.w0 = reinterpret_cast<const uint16_t*>(wrow[0]) + span.i0;
      a.ws = 2 * k;
      a.pf = reinterpret_cast<const char*>(wrow[0] + ahead);  // the next tile
      if (span.first && span.last) {                          // its lines in address order
        a.pf += (span.i0 / 32) * kC * 64;
        a.ps = 64;
        a.pa = kC * 64;
      } else {
        // A span of a long k: the tile's own rows two lines ahead. Its weights come from L2
        // (the slab is cached after its first row block) and its x chunk must stay in L1 while
        // the slab's tiles pass over it; prefetching the next tile's rows (a whole tile ahead,
        // as over a whole k) kept 8 KiB of lines waiting in L1 through every tile and evicted
        // x: Zen 5, 1 thread, prefill 512, k = 2048 / 3072 at 172 / 177 GFLOP/s with it, 202 /
        // 197 with this (k = 1024, not split: 230).
        a.pf = reinterpret_cast<const char*>(a.w0) + 2 * 64;
        a.ps = 2 * k;
        a.pa = 64;
      }
      a.steps = (span.i1 - span.i0) / 32;
      a.acc_in = span.first ? nullptr : carry;
      a.acc_out = span.last ? mem : carry;
      const int64_t kvec = k - k % 32;
      a.reduce = span.last && kvec == k;  // no tail: the asm sums the accumulators
      if constexpr (kR == 6) {
        avx512::Exact6x4(a);
      } else {
        avx512::Exact2x8(a);
      }
      if (!span.last) return;
      if (a.reduce) {
        avx512::StoreRows<kR, kC>(mem, y + r0 * n + c0, n);
        return;
      }
      float sums[(kR * kC + 15) / 16 * 16];
      avx512::ReduceAddEach<kR * kC>(reinterpret_cast<const __m512*>(mem), sums);
      RL_UNROLL for (int r = 0; r < kR; ++r) {
        RL_UNROLL for (int c = 0; c < kC; ++c) {
          float sum = sums[r * kC + c];
          for (int64_t i = kvec; i < k; ++i) sum += xrow[r][i] * ScalarW<kW>(wrow[c], i);
          y[(r0 + r) * n + c0 + c] = sum;
        }
      }
      return;
    }
  }
#endif
  VF acc[kR][kC];
  RL_UNROLL for (int r = 0; r < kR; ++r) {
    RL_UNROLL for (int c = 0; c < kC; ++c) {
      acc[r][c] = span.first ? hn::Zero(d) : hn::Load(d, carry + (r * kC + c) * lanes);
    }
  }
  const int64_t step = StepElems<kW>(d);
  const int64_t kvec = k - k % step;
  constexpr int64_t kLineElems = 64 / kWSize;
  // The next tile's rows are contiguous: over a whole k, its lines are prefetched in address
  // order (kC consecutive lines per line of each row consumed), which the hardware prefetchers
  // and DRAM pages follow better than kC interleaved row streams (Zen 5, 1 thread: batch-1
  // decode from 75-76% to 78-80% of the read-only stream). A span of k (a chunk of a long k)
  // prefetches the same part of each next row instead.
  const bool whole_k = span.first && span.last;
  const uint8_t* next_tile = wrow[0] + ahead;
  for (int64_t i = span.i0; i < span.i1; i += step) {
    if constexpr (kPrefetch) {
      if (i % kLineElems == 0) {
        if (whole_k) {
          const uint8_t* lines = next_tile + (i / kLineElems) * kC * 64;
          RL_UNROLL for (int c = 0; c < kC; ++c) hwy::Prefetch(lines + c * 64);
        } else {
          RL_UNROLL for (int c = 0; c < kC; ++c) hwy::Prefetch(wrow[c] + ahead + i * kWSize);
        }
      }
    }
    VF wv[kC];
#if HWY_TARGET != HWY_SCALAR
    if constexpr (Paired<kW>()) {  // x holds the even elements at i, the odd at i + lanes
      RL_UNROLL for (int c = 0; c < kC; ++c) wv[c] = LoadBf16Half<false>(d, wrow[c], i);
      RL_UNROLL for (int r = 0; r < kR; ++r) {
        const VF xv = hn::LoadU(d, xrow[r] + i);
        RL_UNROLL for (int c = 0; c < kC; ++c) acc[r][c] = hn::MulAdd(xv, wv[c], acc[r][c]);
      }
      RL_UNROLL for (int c = 0; c < kC; ++c) wv[c] = LoadBf16Half<true>(d, wrow[c], i);
      RL_UNROLL for (int r = 0; r < kR; ++r) {
        const VF xv = hn::LoadU(d, xrow[r] + i + lanes);
        RL_UNROLL for (int c = 0; c < kC; ++c) acc[r][c] = hn::MulAdd(xv, wv[c], acc[r][c]);
      }
      continue;
    }
#endif
    RL_UNROLL for (int c = 0; c < kC; ++c) wv[c] = LoadW<kW>(d, wrow[c], i);
    RL_UNROLL for (int r = 0; r < kR; ++r) {
      const VF xv = hn::LoadU(d, xrow[r] + i);
      RL_UNROLL for (int c = 0; c < kC; ++c) acc[r][c] = hn::MulAdd(xv, wv[c], acc[r][c]);
    }
  }
  if (!span.last) {
    RL_UNROLL for (int r = 0; r < kR; ++r) {
      RL_UNROLL for (int c = 0; c < kC; ++c) hn::Store(acc[r][c], d, carry + (r * kC + c) * lanes);
    }
    return;
  }
#if HWY_TARGET == HWY_AVX3
  if (kvec == k) {  // no tail: the sums go straight to y
    __m512 raw[kR * kC];
    RL_UNROLL for (int r = 0; r < kR; ++r) {
      RL_UNROLL for (int c = 0; c < kC; ++c) raw[r * kC + c] = acc[r][c].raw;
    }
    avx512::StoreSums<kR, kC>(raw, y + r0 * n + c0, n);
    return;
  }
#endif
  float sums[(kR * kC + 15) / 16 * 16];
  SumEach<kR * kC>(d, &acc[0][0], sums);
  RL_UNROLL for (int r = 0; r < kR; ++r) {
    RL_UNROLL for (int c = 0; c < kC; ++c) {
      float sum = sums[r * kC + c];
      for (int64_t i = kvec; i < k; ++i) sum += xrow[r][i] * ScalarW<kW>(wrow[c], i);
      y[(r0 + r) * n + c0 + c] = sum;
    }
  }
}

// Above this many bytes of x rows per block, a block of rows runs over k in chunks of
// kChunkElems (all of the slab's tiles per chunk) so its x stays in L1 (48 KiB on Sapphire Rapids,
// 32 on Zen 4) while the tiles pass over it, instead of streaming from L2 once per tile.
constexpr int64_t kChunkedXBytes = 24 << 10;
constexpr int64_t kChunkElems = 1024;  // a multiple of every step (16 and 32 floats)
// The widest slab when chunking: its tiles' accumulators wait in a stack buffer between chunks.
constexpr int64_t kMaxChunkedSlab = 64;

// One block of kR rows from r against columns [s0, s1): tiles of kC columns (prefetching the
// next), then single columns.
template <DType kW, int kR, int kC>
HWY_INLINE void RowBlock(const float* x, const void* w, float* y, int64_t r, int64_t n, int64_t k,
                         int64_t s0, int64_t s1, float* carry) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t kvec = k - k % StepElems<kW>(d);
  const bool chunked = kR >= 4 && kR * kvec * static_cast<int64_t>(sizeof(float)) > kChunkedXBytes;
  const int64_t chunk = chunked ? kChunkElems : std::max<int64_t>(kvec, 1);
  for (int64_t i0 = 0;; i0 += chunk) {
    KSpan span;
    span.i0 = i0;
    span.i1 = std::min(kvec, i0 + chunk);
    span.first = i0 == 0;
    span.last = span.i1 == kvec;
    int64_t c = s0;
    for (; c + kC <= s1; c += kC) {
      Tile<kW, kR, kC, /*kPrefetch=*/true>(x, w, y, r, c, n, k, span,
                                           carry + (c - s0) * kR * lanes);
    }
    for (; c < s1; ++c) Tile<kW, kR, 1>(x, w, y, r, c, n, k, span, carry + (c - s0) * kR * lanes);
    if (span.last) return;
  }
}

// Rows of x in blocks of kGemmRows, then 4, 2 and 1, against columns [s0, s1) of `w`
// (at most kMaxChunkedSlab columns when k is chunked).
template <DType kW>
void MatmulSlab(const float* x, const void* w, float* y, int64_t m, int64_t n, int64_t k,
                int64_t s0, int64_t s1) {
  HWY_ALIGN float carry[kMaxChunkedSlab * kGemmRows * HWY_LANES(float)];
  int64_t r = 0;
  for (; r + kGemmRows <= m; r += kGemmRows) {
    RowBlock<kW, kGemmRows, kGemmCols>(x, w, y, r, n, k, s0, s1, carry);
  }
  for (; r + 4 <= m; r += 4) RowBlock<kW, 4, kGemmCols>(x, w, y, r, n, k, s0, s1, carry);
  // Two rows at once (decode of a few sequences), streaming W once for both.
  for (; r + 2 <= m; r += 2) RowBlock<kW, 2, kGemvCols>(x, w, y, r, n, k, s0, s1, carry);
  for (; r < m; ++r) RowBlock<kW, 1, kGemv1Cols>(x, w, y, r, n, k, s0, s1, carry);
}

// Columns [c_begin, c_end) of all m rows. Column slabs keep a slice of W hot in cache while all
// row blocks pass over it; the tiles widen W in registers (converting a slab to float32 in
// memory first was slower: the float32 copy then streams from L2 at twice the bytes).
template <DType kW>
void MatmulColumns(const float* x, const void* w, float* y, int64_t m, int64_t n, int64_t k,
                   int64_t c_begin, int64_t c_end) {
  const int64_t col_bytes = k * model_io::DTypeSize(kW);
  // A whole number of tiles of both widths (8 on AVX-512, 12 on AVX2): a slab's leftover
  // columns would run as single-column tiles, at a fraction of the speed.
  constexpr int64_t kSlabQuantum = std::lcm(kGemmCols, kGemvCols);
  int64_t slab = (int64_t{256} << 10) / std::max<int64_t>(1, col_bytes);
  slab = std::max(kSlabQuantum, slab - slab % kSlabQuantum);
  if (kGemmRows * k * static_cast<int64_t>(sizeof(float)) > kChunkedXBytes) {
    slab = std::min(slab, kMaxChunkedSlab);  // RowBlock may chunk k: carry room for the slab
  }
  for (int64_t s0 = c_begin; s0 < c_end; s0 += slab) {
    MatmulSlab<kW>(x, w, y, m, n, k, s0, std::min(c_end, s0 + slab));
  }
}

void MatmulColumnsImpl(const float* x, const void* w, int dtype, float* y, int64_t m, int64_t n,
                       int64_t k, int64_t c_begin, int64_t c_end) {
  switch (static_cast<DType>(dtype)) {
    case DType::kF32:
      return MatmulColumns<DType::kF32>(x, w, y, m, n, k, c_begin, c_end);
    case DType::kBF16:
      return MatmulColumns<DType::kBF16>(x, w, y, m, n, k, c_begin, c_end);
    case DType::kF16:
      return MatmulColumns<DType::kF16>(x, w, y, m, n, k, c_begin, c_end);
    default:
      return;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace rl::kernels::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace rl::kernels::cpu {

HWY_EXPORT(MatmulColumnsImpl);
HWY_EXPORT(PackPairsImpl);

namespace {

// Row groups of a long prefill (RunGroup): bytes of float32 x per group (half the 1 MiB L2 of
// Zen 4 / Zen 5, a quarter of Sapphire Rapids').
constexpr int64_t kRowGroupXBytes = int64_t{512} << 10;
constexpr int64_t kRowGroupMultiple = 12;  // whole 6-row (AVX-512) and 4-row (AVX2) tiles

// Columns [c0, c1) of rows [r0, r1) of one matmul, bias included; with `xb`, in bf16-products
// mode from x rounded to bf16 (all rows: r0 and r1 are ignored).
void RunColumns(const MatmulParams& p, const uint16_t* xb, int64_t c0, int64_t c1, int64_t r0,
                int64_t r1, const KernelPlan& plan) {
  if (xb != nullptr) {
    MatmulColumnsBf16(xb, static_cast<const uint16_t*>(p.w), p.y, p.m, p.n, p.k, c0, c1, plan);
    r0 = 0;
    r1 = p.m;
  } else {
    HWY_DYNAMIC_DISPATCH(MatmulColumnsImpl)
    (p.x + r0 * p.k, p.w, static_cast<int>(p.w_dtype), p.y + r0 * p.n, r1 - r0, p.n, p.k, c0, c1);
  }
  if (p.bias == nullptr) return;
  // Bias elements widened one at a time: no allocation on the step path.
  const int64_t bsize = model_io::DTypeSize(p.bias_dtype);
  const auto* bias = static_cast<const uint8_t*>(p.bias);
  for (int64_t c = c0; c < c1; ++c) {
    float b = 0;
    model_io::ConvertToF32(p.bias_dtype, bias + c * bsize, 1, &b);
    for (int64_t r = r0; r < r1; ++r) p.y[r * p.n + c] += b;
  }
}

}  // namespace

void Matmul(const MatmulParams& p, ThreadPool* pool, const KernelPlan& plan) {
  MatmulGroup(absl::MakeConstSpan(&p, 1), pool, plan);
}

namespace {

// x as the tiles read it, one copy per distinct (x, k) of a group's BF16 matmuls, made by all
// threads before the matmuls start: for the float32 path with each block split into even and
// odd elements (PackPairsImpl), in bf16-products mode rounded to bf16. The copies are the
// calling thread's, grown to the largest m × k it has seen and then reused (no allocation per
// step).
template <typename T>
void PackSources(absl::Span<const std::pair<const float*, int64_t>> sources, int64_t m,
                 std::vector<std::vector<T>>& packed, ThreadPool* pool) {
  if (packed.size() < sources.size()) packed.resize(sources.size());
  for (size_t j = 0; j < sources.size(); ++j) {
    const size_t need = static_cast<size_t>(m * sources[j].second);
    if (packed[j].size() < need) packed[j].resize(need);
  }
  auto pack = [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end;) {  // rows of source t / m, up to the next source
      const size_t j = static_cast<size_t>(t / m);
      const int64_t r1 = std::min(end, static_cast<int64_t>(j + 1) * m);
      const int64_t row = t % m;
      if constexpr (std::is_same_v<T, float>) {
        HWY_DYNAMIC_DISPATCH(PackPairsImpl)
        (sources[j].first, sources[j].second, row, row + (r1 - t), packed[j].data());
      } else {
        PackRowsBf16(sources[j].first, sources[j].second, row, row + (r1 - t), packed[j].data());
      }
      t = r1;
    }
  };
  const int64_t rows = m * static_cast<int64_t>(sources.size());
  int64_t elems = 0;
  for (const auto& source : sources) elems += m * source.second;
  // Decode's few rows are packed by the caller: a parallel region costs more than the copy.
  constexpr int64_t kParallelPackElems = int64_t{1} << 16;
  if (pool == nullptr || elems < kParallelPackElems) {
    pack(0, rows, 0);
  } else {
    pool->ParallelFor(rows, pack);
  }
}

void RunGroup(absl::Span<const MatmulParams> group, ThreadPool* pool, bool bf16_products,
              const KernelPlan& plan) {
  if (group.empty() || group[0].m == 0) return;
  const int64_t m = group[0].m;
  thread_local std::vector<std::vector<float>> paired_of_thread;
  thread_local std::vector<std::vector<uint16_t>> bf16_of_thread;
  absl::InlinedVector<MatmulParams, 4> runs(group.begin(), group.end());
  absl::InlinedVector<const uint16_t*, 4> xb(runs.size(), nullptr);
  absl::InlinedVector<std::pair<const float*, int64_t>, 4> sources;  // distinct (x, k)
  absl::InlinedVector<size_t, 4> source_of(runs.size(), 0);
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].w_dtype != model_io::DType::kBF16) continue;
    const std::pair<const float*, int64_t> key(runs[i].x, runs[i].k);
    auto it = std::find(sources.begin(), sources.end(), key);
    source_of[i] = static_cast<size_t>(it - sources.begin());
    if (it == sources.end()) sources.push_back(key);
  }
  if (!sources.empty() && bf16_products) {
    std::vector<std::vector<uint16_t>>& packed = bf16_of_thread;  // the pool's threads write it
    PackSources<uint16_t>(sources, m, packed, pool);
    for (size_t i = 0; i < runs.size(); ++i) {
      if (runs[i].w_dtype == model_io::DType::kBF16) xb[i] = packed[source_of[i]].data();
    }
  } else if (!sources.empty()) {
    std::vector<std::vector<float>>& packed = paired_of_thread;
    PackSources<float>(sources, m, packed, pool);
    for (size_t i = 0; i < runs.size(); ++i) {
      if (runs[i].w_dtype == model_io::DType::kBF16) runs[i].x = packed[source_of[i]].data();
    }
  }
  // Chunks of `quantum` columns, numbered across the group's matmuls in order; the pool splits
  // the chunk range, so by column only. A multiple of every tile width the rows use (3 or 4 and
  // 1 for blocks of rows, 8 or 4 and 1 for one or two rows); 8 for decode so that a
  // 1024-column matmul splits evenly over 2 threads (with 24 one thread had 6% more columns).
  const int64_t quantum = m >= 4 ? 24 : 8;
  int64_t num_chunks = 0;
  for (const MatmulParams& p : runs) num_chunks += (p.n + quantum - 1) / quantum;
  // A long prefill's rows in groups of about kRowGroupXBytes of x (whole tiles of rows), each
  // group a separate unit of work per run of columns: x of a group stays in L2
  // while its runs pass over it, and the units at the end of a parallel region are small, so a
  // thread waits less for the other at the barrier (a run over all 512 rows of a prefill was
  // up to 0.45 ms of work). Exact mode only (the bf16-products tiles take all rows).
  int64_t max_k = 1;
  for (const MatmulParams& p : runs) max_k = std::max(max_k, p.k);
  int64_t group_rows = m;
  if (!bf16_products) {
    const int64_t rows = std::max<int64_t>(
        kRowGroupMultiple, kRowGroupXBytes / (max_k * 4) / kRowGroupMultiple * kRowGroupMultiple);
    if (2 * rows <= m) group_rows = rows;
  }
  const int64_t num_groups = (m + group_rows - 1) / group_rows;
  auto run = [&](int64_t chunk_begin, int64_t chunk_end, int64_t group) {
    const int64_t r0 = group * group_rows;
    const int64_t r1 = std::min(m, r0 + group_rows);
    int64_t first = 0;  // the first chunk of runs[i]
    for (size_t i = 0; i < runs.size(); ++i) {
      const MatmulParams& p = runs[i];
      const int64_t chunks = (p.n + quantum - 1) / quantum;
      const int64_t b = std::max(chunk_begin, first);
      const int64_t e = std::min(chunk_end, first + chunks);
      if (b < e) {
        RunColumns(p, xb[i], (b - first) * quantum, std::min(p.n, (e - first) * quantum), r0, r1,
                   plan);
      }
      first += chunks;
    }
  };
  if (pool == nullptr || pool->num_threads() == 1) {
    for (int64_t g = 0; g < num_groups; ++g) run(0, num_chunks, g);
    return;
  }
  // Threads take units (a run of `grain` chunks of one row group) from a shared counter until
  // none is left, rather than a fixed share each: a thread slowed down (another process on its
  // core, a page of W still in DRAM) leaves its work to the others instead of holding up the
  // whole region. A run is a contiguous stretch of columns (weights streamed in order); about
  // 8 runs per thread, at most a slab's worth of weights. Which thread computes an element
  // changes none of its bits.
  const int64_t threads = pool->num_threads();
  const int64_t chunk_bytes = quantum * runs[0].k * model_io::DTypeSize(runs[0].w_dtype);
  const int64_t grain = std::clamp<int64_t>(num_chunks / (8 * threads), 1,
                                            std::max<int64_t>(1, (256 << 10) / chunk_bytes));
  const int64_t runs_per_group = (num_chunks + grain - 1) / grain;
  const int64_t units = runs_per_group * num_groups;
  std::atomic<int64_t> next{0};
  pool->ParallelFor(threads, [&](int64_t, int64_t, int) {
    for (;;) {
      const int64_t u = next.fetch_add(1, std::memory_order_relaxed);
      if (u >= units) return;
      const int64_t b = (u % runs_per_group) * grain;
      run(b, std::min(num_chunks, b + grain), u / runs_per_group);
    }
  });
}

}  // namespace

void MatmulGroup(absl::Span<const MatmulParams> group, ThreadPool* pool, const KernelPlan& plan) {
  RunGroup(group, pool, /*bf16_products=*/false, plan);
}

absl::Status ValidateMatmulGroupBf16Products(absl::Span<const MatmulParams> group) {
  if (absl::Status s = ValidateMatmulGroup(group); !s.ok()) return s;
  for (const MatmulParams& p : group) {
    if (p.w_dtype != model_io::DType::kBF16) {
      return absl::InvalidArgumentError("matmul: bf16 products need BF16 weights");
    }
  }
  if (!Bf16ProductsSupported()) {
    return absl::FailedPreconditionError("matmul: bf16 products need a CPU with AVX512-BF16");
  }
  return absl::OkStatus();
}

void MatmulGroupBf16Products(absl::Span<const MatmulParams> group, ThreadPool* pool,
                             const KernelPlan& plan) {
  RunGroup(group, pool, /*bf16_products=*/true, plan);
}

}  // namespace rl::kernels::cpu
#endif  // HWY_ONCE
