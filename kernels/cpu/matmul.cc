#include "kernels/cpu/matmul.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/matmul.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/cache_control.h"
#include "hwy/highway.h"

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

// Fully unrolls the loops over a tile's rows and columns, so its accumulators live in registers
// (GCC keeps arrays indexed in a rolled loop in memory).
#define RL_UNROLL _Pragma("GCC unroll 16")

// Columns (rows of W) per pass of a single row of x: one accumulator and one weight vector
// each, so 8 on the 32-register targets and 4 on AVX2 (16 registers).
constexpr int kGemvCols = HWY_TARGET == HWY_AVX2 ? 4 : 8;
// The many-row tiles: kGemmRows × kGemmCols accumulators, 6 × 4 on the 32-register targets
// (24 accumulators + 4 weight vectors + x; measured 1.3-1.6x faster than 8 × 3, whose x
// loads the compiler folds into every FMA) and 4 × 3 on AVX2.
constexpr int kGemmRows = HWY_TARGET == HWY_AVX2 ? 4 : 6;
constexpr int kGemmCols = HWY_TARGET == HWY_AVX2 ? 3 : 4;

// Computes the kR × kC block y[r0.., c0..] of dot products (no bias). The per-element order
// is the same for every (kR, kC): one accumulator per element over full vectors, the
// horizontal sum, then the tail in index order.
// With kPrefetch, each pass also prefetches the block
// of W rows one tile ahead (rows are contiguous, so that is the next tile's data), one cache
// line per row per line consumed: decode at small batches is a stream of W and the hardware
// prefetchers alone leave the memory system idle between tiles (measured: batch 1 at ~55% of
// the read-only stream without, ~100% with; batch 4-8 1.4-1.7x faster).
template <DType kW, int kR, int kC, bool kPrefetch = false>
HWY_INLINE void Tile(const float* x, const void* w, float* y, int64_t r0, int64_t c0, int64_t n,
                     int64_t k) {
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
  VF acc[kR][kC];
  RL_UNROLL for (int r = 0; r < kR; ++r) {
    RL_UNROLL for (int c = 0; c < kC; ++c) acc[r][c] = hn::Zero(d);
  }
  const int64_t kvec = k - k % lanes;
  constexpr int64_t kLineElems = 64 / kWSize;
  for (int64_t i = 0; i < kvec; i += lanes) {
    if constexpr (kPrefetch) {
      if (i % kLineElems == 0) {
        RL_UNROLL for (int c = 0; c < kC; ++c) hwy::Prefetch(wrow[c] + ahead + i * kWSize);
      }
    }
    VF wv[kC];
    RL_UNROLL for (int c = 0; c < kC; ++c) wv[c] = LoadW<kW>(d, wrow[c], i);
    RL_UNROLL for (int r = 0; r < kR; ++r) {
      const VF xv = hn::LoadU(d, xrow[r] + i);
      RL_UNROLL for (int c = 0; c < kC; ++c) acc[r][c] = hn::MulAdd(xv, wv[c], acc[r][c]);
    }
  }
  RL_UNROLL for (int r = 0; r < kR; ++r) {
    RL_UNROLL for (int c = 0; c < kC; ++c) {
      float sum = hn::GetLane(hn::SumOfLanes(d, acc[r][c]));
      for (int64_t i = kvec; i < k; ++i) sum += xrow[r][i] * ScalarW<kW>(wrow[c], i);
      y[(r0 + r) * n + c0 + c] = sum;
    }
  }
}

// Rows of x in blocks of kGemmRows, then 4, 2 and 1, against columns [s0, s1) of `w`.
template <DType kW>
void MatmulSlab(const float* x, const void* w, float* y, int64_t m, int64_t n, int64_t k,
                int64_t s0, int64_t s1) {
  int64_t r = 0;
  for (; r + kGemmRows <= m; r += kGemmRows) {
    int64_t c = s0;
    for (; c + kGemmCols <= s1; c += kGemmCols) {
      Tile<kW, kGemmRows, kGemmCols, /*kPrefetch=*/true>(x, w, y, r, c, n, k);
    }
    for (; c < s1; ++c) Tile<kW, kGemmRows, 1>(x, w, y, r, c, n, k);
  }
  for (; r + 4 <= m; r += 4) {
    int64_t c = s0;
    for (; c + kGemmCols <= s1; c += kGemmCols) {
      Tile<kW, 4, kGemmCols, /*kPrefetch=*/true>(x, w, y, r, c, n, k);
    }
    for (; c < s1; ++c) Tile<kW, 4, 1>(x, w, y, r, c, n, k);
  }
  // Two rows at once (decode of a few sequences), streaming W once for both.
  for (; r + 2 <= m; r += 2) {
    int64_t c = s0;
    for (; c + kGemvCols <= s1; c += kGemvCols) {
      Tile<kW, 2, kGemvCols, /*kPrefetch=*/true>(x, w, y, r, c, n, k);
    }
    for (; c < s1; ++c) Tile<kW, 2, 1>(x, w, y, r, c, n, k);
  }
  for (; r < m; ++r) {
    int64_t c = s0;
    for (; c + kGemvCols <= s1; c += kGemvCols) {
      Tile<kW, 1, kGemvCols, /*kPrefetch=*/true>(x, w, y, r, c, n, k);
    }
    for (; c < s1; ++c) Tile<kW, 1, 1>(x, w, y, r, c, n, k);
  }
}

// Columns [c_begin, c_end) of all m rows. Column slabs keep a slice of W hot in cache while all
// row blocks pass over it; the tiles widen W in registers (converting a slab to float32 in
// memory first was slower: the float32 copy then streams from L2 at twice the bytes).
template <DType kW>
void MatmulColumns(const float* x, const void* w, float* y, int64_t m, int64_t n, int64_t k,
                   int64_t c_begin, int64_t c_end) {
  const int64_t col_bytes = k * model_io::DTypeSize(kW);
  const int64_t slab = std::max<int64_t>(8, (int64_t{256} << 10) / std::max<int64_t>(1, col_bytes));
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

absl::Status MatmulParams::Validate() const {
  if (x == nullptr || w == nullptr || y == nullptr) {
    return absl::InvalidArgumentError("matmul: null x, w or y");
  }
  if (m < 0 || n <= 0 || k <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("matmul: bad sizes m=", m, " n=", n, " k=", k));
  }
  if (!model_io::IsFloatWeightDType(w_dtype) ||
      (bias != nullptr && !model_io::IsFloatWeightDType(bias_dtype))) {
    return absl::InvalidArgumentError("matmul: weights must be F32, BF16 or F16");
  }
  return absl::OkStatus();
}

namespace {

// Columns [c0, c1) of one matmul, bias included.
void RunColumns(const MatmulParams& p, int64_t c0, int64_t c1) {
  HWY_DYNAMIC_DISPATCH(MatmulColumnsImpl)(p.x, p.w, static_cast<int>(p.w_dtype), p.y, p.m, p.n,
                                          p.k, c0, c1);
  if (p.bias == nullptr) return;
  // Bias elements widened one at a time: no allocation on the step path.
  const int64_t bsize = model_io::DTypeSize(p.bias_dtype);
  const auto* bias = static_cast<const uint8_t*>(p.bias);
  for (int64_t c = c0; c < c1; ++c) {
    float b = 0;
    model_io::ConvertToF32(p.bias_dtype, bias + c * bsize, 1, &b);
    for (int64_t r = 0; r < p.m; ++r) p.y[r * p.n + c] += b;
  }
}

}  // namespace

void Matmul(const MatmulParams& p, ThreadPool* pool) {
  MatmulGroup(absl::MakeConstSpan(&p, 1), pool);
}

absl::Status ValidateMatmulGroup(absl::Span<const MatmulParams> group) {
  if (group.empty()) return absl::InvalidArgumentError("matmul group: empty");
  for (const MatmulParams& p : group) {
    if (absl::Status s = p.Validate(); !s.ok()) return s;
    if (p.m != group[0].m) {
      return absl::InvalidArgumentError(
          absl::StrCat("matmul group: m=", p.m, " differs from the first's m=", group[0].m));
    }
  }
  return absl::OkStatus();
}

void MatmulGroup(absl::Span<const MatmulParams> group, ThreadPool* pool) {
  if (group.empty() || group[0].m == 0) return;
  // Chunks of kQuantum columns (a multiple of every tile width: 1, 3, 4, 8), numbered across
  // the group's matmuls in order; the pool splits the chunk range, so by column only.
  constexpr int64_t kQuantum = 24;
  int64_t num_chunks = 0;
  for (const MatmulParams& p : group) num_chunks += (p.n + kQuantum - 1) / kQuantum;
  auto run = [&](int64_t chunk_begin, int64_t chunk_end, int) {
    int64_t first = 0;  // the first chunk of group[i]
    for (const MatmulParams& p : group) {
      const int64_t chunks = (p.n + kQuantum - 1) / kQuantum;
      const int64_t b = std::max(chunk_begin, first);
      const int64_t e = std::min(chunk_end, first + chunks);
      if (b < e) RunColumns(p, (b - first) * kQuantum, std::min(p.n, (e - first) * kQuantum));
      first += chunks;
    }
  };
  if (pool == nullptr) {
    run(0, num_chunks, 0);
  } else {
    pool->ParallelFor(num_chunks, run);
  }
}

}  // namespace rl::kernels::cpu
#endif  // HWY_ONCE
