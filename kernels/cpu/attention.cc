#include "kernels/cpu/attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

// foreach_target first, then highway.h, then the per-target headers (not sorted):
// clang-format off
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/cache_control.h"
#include "hwy/contrib/math/math-inl.h"
#include "kernels/cpu/lane_sums-inl.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace rl::kernels::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

#define RL_UNROLL _Pragma("GCC unroll 16")

// Accumulators a phase keeps in registers: 16 of the 32 vector registers of AVX-512 and NEON,
// 8 of AVX2's 16.
constexpr int kAccumulators = HWY_TARGET == HWY_AVX2 ? 8 : 16;

// exp(x - max) of `count` < Lanes(d) scores in place, returning them as a vector with zeros in
// the lanes past `count` (the same Exp as full vectors: lanes are independent).
HWY_INLINE VF ExpTail(DF d, float* x, int64_t count, VF max) {
  HWY_ALIGN float tmp[HWY_LANES(float)];
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t i = 0; i < lanes; ++i) tmp[i] = i < count ? x[i] : -INFINITY;
  const VF e = hn::Exp(d, hn::Sub(hn::Load(d, tmp), max));
  hn::Store(e, d, tmp);
  for (int64_t i = 0; i < count; ++i) x[i] = tmp[i];
  return e;
}

// Attends kR query rows that share a KV head and a slot list: row r attends positions
// [0, len[r]). Each row is computed exactly as one row alone would be, whatever kR and the
// other rows: its operations and their order depend only on its own length.
//  - Scores: one SIMD accumulator over the head dim in index order per (row, position); the
//    lane sums of Lanes(d) positions at a time by SumLanesOfEach's fixed tree; then the scalar
//    tail of the head dim in index order; times `scale`.
//  - Softmax: the max (exact in any order); exp(s - max) by Highway's vectorized Exp, lane-wise;
//    the sum as per-lane partial sums in position order, then SumOfLanes.
//  - Output: Σ_j p_j · v_j in position order per lane, then times 1 / sum.
// Sharing only saves memory traffic and instructions: each K and V row is loaded once for all
// kR rows, several positions' dot products share each query load, several head-dim blocks share
// each probability broadcast. `scores` holds kR × max(len) floats.
// K and V rows are prefetched this many positions ahead: a decode token's K/V come from
// memory, one head's slice of each slot, which the hardware prefetchers follow poorly.
constexpr int64_t kPrefetchPositions = 8;

#if HWY_TARGET == HWY_AVX3
// One level of SumLanesOfEach's tree on AVX3: Add(ConcatEven(hi, lo), ConcatOdd(hi, lo)) with
// lo = a, hi = b (lane i < 8: a[2i] + a[2i + 1]; lane 8 + i: b[2i] + b[2i + 1]).
HWY_INLINE __m512 PairLanes(__m512 a, __m512 b) {
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  return _mm512_add_ps(_mm512_permutex2var_ps(a, even, b), _mm512_permutex2var_ps(a, odd, b));
}

// Scores of two query rows against 8 positions (K rows kp[0..7]) over the head dim's whole
// vectors, reduced by the first three levels of SumLanesOfEach's tree over a block of 16
// positions (levels pair vectors within a half block): *r0 and *r1 hold each row's half. The
// 16 accumulators are named variables so that they stay in registers (in arrays, next to the
// rest of AttendRows, GCC spilled them in every step).
HWY_INLINE void ScoresPairHalf(const float* q0, const float* q1, const float* const* kp,
                               int64_t dvec, __m512* r0, __m512* r1) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  __m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0, b4 = a0, b5 = a0, b6 = a0, b7 = a0;
  const float *k0 = kp[0], *k1 = kp[1], *k2 = kp[2], *k3 = kp[3], *k4 = kp[4], *k5 = kp[5],
              *k6 = kp[6], *k7 = kp[7];
  // Each K vector is loaded once into a register for both rows: the empty asm keeps GCC from
  // folding the load into both FMAs (two loads of it, 18 loads per 16 FMAs: the loop was bound
  // by the load ports; a causal prefill of 512 tokens 10.6 -> 8.7 ms per layer on Zen 5).
  for (int64_t i = 0; i < dvec; i += 16) {
    const __m512 qa = _mm512_loadu_ps(q0 + i);
    const __m512 qb = _mm512_loadu_ps(q1 + i);
#define RL_SCORE_STEP(kj, a, b)          \
  {                                      \
    __m512 kv = _mm512_loadu_ps(kj + i); \
    __asm__("" : "+v"(kv));              \
    a = _mm512_fmadd_ps(qa, kv, a);      \
    b = _mm512_fmadd_ps(qb, kv, b);      \
  }
    RL_SCORE_STEP(k0, a0, b0)
    RL_SCORE_STEP(k1, a1, b1)
    RL_SCORE_STEP(k2, a2, b2)
    RL_SCORE_STEP(k3, a3, b3)
    RL_SCORE_STEP(k4, a4, b4)
    RL_SCORE_STEP(k5, a5, b5)
    RL_SCORE_STEP(k6, a6, b6)
    RL_SCORE_STEP(k7, a7, b7)
#undef RL_SCORE_STEP
  }
  *r0 = PairLanes(PairLanes(PairLanes(a0, a1), PairLanes(a2, a3)),
                  PairLanes(PairLanes(a4, a5), PairLanes(a6, a7)));
  *r1 = PairLanes(PairLanes(PairLanes(b0, b1), PairLanes(b2, b3)),
                  PairLanes(PairLanes(b4, b5), PairLanes(b6, b7)));
}
#endif

template <int kR>
void AttendRows(const float* const* q, float* const* out, const int64_t* len, const float* k,
                const float* v, const int32_t* slots, int64_t kv_dim, int64_t hd, float scale,
                float* scores) {
  const DF d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t dvec = hd - hd % lanes;
  int64_t max_len = 0;
  int64_t min_len = len[0];
  RL_UNROLL for (int r = 0; r < kR; ++r) {
    max_len = std::max(max_len, len[r]);
    min_len = std::min(min_len, len[r]);
  }
  float* s[kR];
  RL_UNROLL for (int r = 0; r < kR; ++r) s[r] = scores + r * max_len;

  // Scores, Lanes(d) positions per block (AVX3: ScoresPairHalf, in registers; other targets:
  // each (row, position) accumulator goes to `acc_out`, then each row's block is reduced to one
  // vector of sums).
  constexpr int kPositions = std::min(4, std::max(1, kAccumulators / kR));  // per pass over K
#if HWY_TARGET != HWY_AVX3
  HWY_ALIGN float acc_out[kR * HWY_LANES(float) * HWY_LANES(float)];
#endif
  HWY_ALIGN float sums[HWY_LANES(float)];
  const VF vscale = hn::Set(d, scale);
  for (int64_t j0 = 0; j0 < max_len; j0 += lanes) {
    const int64_t block = std::min(lanes, max_len - j0);
#if HWY_TARGET == HWY_AVX3
    // Two rows at a time, half a block per call, the tree in registers (ScoresPairHalf): the
    // same operations as below without an accumulator stored and reloaded per (row, position).
    // A row's sums depend only on its own accumulators, so positions read for the other row of
    // a pair, or repeated past the block's end, change none of its bits.
    // (Rows gathered into a contiguous buffer, kv_dim == hd, need none: the hardware follows.)
    const int64_t prefetch_end =
        kv_dim == hd ? 0 : std::min(max_len, j0 + block + kPrefetchPositions);
    for (int64_t j = j0 + kPrefetchPositions; j < prefetch_end; ++j) {
      const auto* row = reinterpret_cast<const char*>(k + static_cast<int64_t>(slots[j]) * kv_dim);
      for (int64_t b = 0; b < hd * static_cast<int64_t>(sizeof(float)); b += 64) {
        hwy::Prefetch(row + b);
      }
    }
    RL_UNROLL for (int r0 = 0; r0 < kR; r0 += 2) {
      const int r1 = r0 + 1 < kR ? r0 + 1 : r0;
      const int64_t needed = std::min(block, std::max(len[r0], len[r1]) - j0);
      if (needed <= 0) continue;
      __m512 half[2][2];  // [row of the pair][half block]
      for (int h = 0; h < 2; ++h) {
        const float* kp[8];
        for (int p = 0; p < 8; ++p) {
          const int64_t j = j0 + (8 * h + p < needed ? 8 * h + p : 0);
          kp[p] = k + static_cast<int64_t>(slots[j]) * kv_dim;
        }
        if (8 * h < needed) {
          ScoresPairHalf(q[r0], q[r1], kp, dvec, &half[0][h], &half[1][h]);
        } else {
          half[0][h] = half[1][h] = _mm512_setzero_ps();
        }
      }
      for (int rr = 0; rr < 2 && r0 + rr < kR; ++rr) {
        const int r = r0 + rr;
        const int64_t count = std::min(block, len[r] - j0);
        if (count <= 0) continue;
        const VF dots{PairLanes(half[rr][0], half[rr][1])};  // the tree's last level
        if (dvec == hd && count == lanes) {
          hn::StoreU(hn::Mul(dots, vscale), d, s[r] + j0);
          continue;
        }
        hn::Store(dots, d, sums);
        for (int64_t t = 0; t < count; ++t) {
          const float* kj = k + static_cast<int64_t>(slots[j0 + t]) * kv_dim;
          float dot = sums[t];
          for (int64_t i = dvec; i < hd; ++i) dot += q[r][i] * kj[i];
          s[r][j0 + t] = dot * scale;
        }
      }
    }
#else
    auto accumulate = [&](auto positions, int64_t jj) {
      constexpr int kP = decltype(positions)::value;
      const float* kj[kP];
      RL_UNROLL for (int p = 0; p < kP; ++p) {
        kj[p] = k + static_cast<int64_t>(slots[j0 + jj + p]) * kv_dim;
        const int64_t ahead = j0 + jj + p + kPrefetchPositions;
        if (ahead < max_len) {
          const auto* row = reinterpret_cast<const char*>(k + slots[ahead] * kv_dim);
          for (int64_t b = 0; b < hd * static_cast<int64_t>(sizeof(float)); b += 64) {
            hwy::Prefetch(row + b);
          }
        }
      }
      VF acc[kR][kP];
      RL_UNROLL for (int r = 0; r < kR; ++r) {
        RL_UNROLL for (int p = 0; p < kP; ++p) acc[r][p] = hn::Zero(d);
      }
      for (int64_t i = 0; i < dvec; i += lanes) {
        VF kv[kP];
        RL_UNROLL for (int p = 0; p < kP; ++p) kv[p] = hn::LoadU(d, kj[p] + i);
        RL_UNROLL for (int r = 0; r < kR; ++r) {
          const VF qv = hn::LoadU(d, q[r] + i);
          RL_UNROLL for (int p = 0; p < kP; ++p) acc[r][p] = hn::MulAdd(qv, kv[p], acc[r][p]);
        }
      }
      RL_UNROLL for (int r = 0; r < kR; ++r) {
        RL_UNROLL for (int p = 0; p < kP; ++p) {
          hn::Store(acc[r][p], d, acc_out + (r * lanes + jj + p) * lanes);
        }
      }
    };
    int64_t jj = 0;
    for (; jj + kPositions <= block; jj += kPositions) {
      accumulate(std::integral_constant<int, kPositions>(), jj);
    }
    for (; jj < block; ++jj) accumulate(std::integral_constant<int, 1>(), jj);
    for (; jj < lanes; ++jj) {  // a last block's missing positions: sums that are not stored
      RL_UNROLL for (int r = 0; r < kR; ++r) {
        hn::Store(hn::Zero(d), d, acc_out + (r * lanes + jj) * lanes);
      }
    }
    RL_UNROLL for (int r = 0; r < kR; ++r) {
      const int64_t count = std::min(block, len[r] - j0);  // positions of row r in the block
      if (count <= 0) continue;
      VF rows[HWY_LANES(float)];
      for (int64_t t = 0; t < lanes; ++t) rows[t] = hn::Load(d, acc_out + (r * lanes + t) * lanes);
      const VF dots = SumLanesOfEach(d, rows, static_cast<size_t>(lanes));
      if (dvec == hd && count == lanes) {
        hn::StoreU(hn::Mul(dots, vscale), d, s[r] + j0);
        continue;
      }
      hn::Store(dots, d, sums);
      for (int64_t t = 0; t < count; ++t) {
        const float* kj = k + static_cast<int64_t>(slots[j0 + t]) * kv_dim;
        float dot = sums[t];
        for (int64_t i = dvec; i < hd; ++i) dot += q[r][i] * kj[i];
        s[r][j0 + t] = dot * scale;
      }
    }
#endif
  }

  // Softmax numerators in place, and 1 / their sum.
  float inv[kR];
  RL_UNROLL for (int r = 0; r < kR; ++r) {
    const int64_t n = len[r];
    const int64_t nvec = n - n % lanes;
    VF vmax = hn::Set(d, -INFINITY);
    for (int64_t j = 0; j < nvec; j += lanes) vmax = hn::Max(vmax, hn::LoadU(d, s[r] + j));
    float max_score = hn::GetLane(hn::MaxOfLanes(d, vmax));
    for (int64_t j = nvec; j < n; ++j) max_score = std::max(max_score, s[r][j]);
    const VF vm = hn::Set(d, max_score);
    VF vsum = hn::Zero(d);
    for (int64_t j = 0; j < nvec; j += lanes) {
      const VF e = hn::Exp(d, hn::Sub(hn::LoadU(d, s[r] + j), vm));
      hn::StoreU(e, d, s[r] + j);
      vsum = hn::Add(vsum, e);
    }
    if (nvec < n) vsum = hn::Add(vsum, ExpTail(d, s[r] + nvec, n - nvec, vm));
    inv[r] = 1.0f / hn::GetLane(hn::SumOfLanes(d, vsum));
  }

  // Σ_j p_j · v_j, kBlocks head-dim vectors per pass over V (then passes of 4, 2 and 1). On the
  // 32-register targets up to 24 accumulators: 8 rows take 3 blocks, a head dim of 128 three
  // passes (3, 3, 2) instead of four, each position's probabilities broadcast once per pass.
  // One or two rows (a decode token's GQA group of 1 or 2) take 8 blocks (16 accumulators, 8 V
  // vectors and a broadcast): a head dim of 128 in one pass, so each V row is read once, whole.
  // Decode attention is a stream of one head's 512 bytes of each slot's row: in two passes over
  // their halves a decode step of 16 x 300 positions took 1.82-1.86 ms per layer, in one pass
  // 1.59-1.62 (attention_bench, Zen 5, 1 thread, KV in 2 MiB pages, 3 interleaved runs, quiet).
  constexpr int kPvAccumulators = HWY_TARGET == HWY_AVX2 ? 8 : 24;
  constexpr int kBlocks =
      kR <= 2 && HWY_TARGET != HWY_AVX2 ? 8 : std::min(4, std::max(1, kPvAccumulators / kR));
  auto weighted_sum = [&](auto blocks, int64_t i) {
    constexpr int kB = decltype(blocks)::value;
    VF acc[kR][kB];
    RL_UNROLL for (int r = 0; r < kR; ++r) {
      RL_UNROLL for (int b = 0; b < kB; ++b) acc[r][b] = hn::Zero(d);
    }
    auto add = [&](int64_t j, auto all_rows) {
      const float* vj = v + static_cast<int64_t>(slots[j]) * kv_dim + i;
      if (j + kPrefetchPositions < max_len) {
        const float* next = v + static_cast<int64_t>(slots[j + kPrefetchPositions]) * kv_dim + i;
        RL_UNROLL for (int b = 0; b < kB; ++b) hwy::Prefetch(next + b * lanes);
      }
      VF vv[kB];
      RL_UNROLL for (int b = 0; b < kB; ++b) vv[b] = hn::LoadU(d, vj + b * lanes);
      RL_UNROLL for (int r = 0; r < kR; ++r) {
        if (!decltype(all_rows)::value && j >= len[r]) continue;
        const VF pr = hn::Set(d, s[r][j]);
        RL_UNROLL for (int b = 0; b < kB; ++b) acc[r][b] = hn::MulAdd(pr, vv[b], acc[r][b]);
      }
    };
    int64_t j = 0;
    for (; j < min_len; ++j) add(j, std::true_type());
    for (; j < max_len; ++j) add(j, std::false_type());
    RL_UNROLL for (int r = 0; r < kR; ++r) {
      const VF vinv = hn::Set(d, inv[r]);
      RL_UNROLL for (int b = 0; b < kB; ++b) {
        hn::StoreU(hn::Mul(vinv, acc[r][b]), d, out[r] + i + b * lanes);
      }
    }
  };
  int64_t i = 0;
  for (; i + kBlocks * lanes <= dvec; i += kBlocks * lanes) {
    weighted_sum(std::integral_constant<int, kBlocks>(), i);
  }
  if constexpr (kBlocks > 4) {
    for (; i + 4 * lanes <= dvec; i += 4 * lanes) {
      weighted_sum(std::integral_constant<int, 4>(), i);
    }
  }
  if constexpr (kBlocks > 2) {
    for (; i + 2 * lanes <= dvec; i += 2 * lanes) {
      weighted_sum(std::integral_constant<int, 2>(), i);
    }
  }
  for (; i < dvec; i += lanes) weighted_sum(std::integral_constant<int, 1>(), i);
  for (i = dvec; i < hd; ++i) {
    RL_UNROLL for (int r = 0; r < kR; ++r) {
      float y = 0.0f;
      for (int64_t j = 0; j < len[r]; ++j)
        y += s[r][j] * v[static_cast<int64_t>(slots[j]) * kv_dim + i];
      out[r][i] = y * inv[r];
    }
  }
}

// AttendRows for 1 to 8 rows (kMaxTileRows below).
void AttendTileImpl(int rows, const float* const* q, float* const* out, const int64_t* len,
                    const float* k, const float* v, const int32_t* slots, int64_t kv_dim,
                    int64_t hd, float scale, float* scores) {
  using Fn = decltype(&AttendRows<1>);
  static constexpr Fn kByRows[] = {AttendRows<1>, AttendRows<2>, AttendRows<3>, AttendRows<4>,
                                   AttendRows<5>, AttendRows<6>, AttendRows<7>, AttendRows<8>};
  static_assert(sizeof(kByRows) / sizeof(kByRows[0]) == 8);
  kByRows[rows - 1](q, out, len, k, v, slots, kv_dim, hd, scale, scores);
}

}  // namespace HWY_NAMESPACE
}  // namespace rl::kernels::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace rl::kernels::cpu {

HWY_EXPORT(AttendTileImpl);

absl::Status ValidateWriteKv(const WriteKvParams& p) {
  if (absl::Status s = p.ValidateShapes(); !s.ok()) return s;
  if (p.kv_dtype != model_io::DType::kF32) {
    return absl::InvalidArgumentError("write_kv: the CPU KV cache is float32");
  }
  return p.Validate();
}

void WriteKv(const WriteKvParams& p) {
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int64_t s = p.slots[t];
    std::memcpy(static_cast<float*>(p.k_cache) + s * p.kv_dim, p.k + t * p.k_stride,
                p.kv_dim * sizeof(float));
    std::memcpy(static_cast<float*>(p.v_cache) + s * p.kv_dim, p.v + t * p.v_stride,
                p.kv_dim * sizeof(float));
  }
}

absl::Status ValidateAttention(const AttentionParams& p) {
  if (absl::Status s = p.ValidateShapes(); !s.ok()) return s;
  if (p.workspace == nullptr || p.num_workspaces <= 0) {
    return absl::InvalidArgumentError("attention: no workspace");
  }
  if (p.kv_dtype != model_io::DType::kF32) {
    return absl::InvalidArgumentError("attention: the CPU KV cache is float32");
  }
  return p.Validate();
}

namespace {

// Query rows (token, head) that share a KV head and a sequence are attended together, so each
// K/V row is read from memory once per tile instead of once per row. Decode: the heads of a
// GQA group; prefill: also several tokens of one chunk.
constexpr int kMaxTileRows = 8;
// Query rows per task: a block of tokens × the heads of one KV head (chunk).
constexpr int64_t kTaskRows = 32;
// A run of at least kGatherMinRows rows on one sequence first copies the KV head's K and V rows of
// the run's context into contiguous per-thread buffers: in the cache a head's row is a
// 1/num_kv_heads slice of each slot, so its K and V land in a fraction of the L2's sets and evict
// each other (measured: the tiles then wait on L3 for their K/V loads); contiguous, they stay in L2
// for all the run's tiles. Up to kMaxGathered positions (8 MiB of buffers per thread at head dim
// 256).
constexpr int64_t kGatherMinRows = 2 * kMaxTileRows;  // two tiles read each gathered row
constexpr int64_t kMaxGathered = 4096;

struct Tile {
  int rows = 0;
  const float* q[kMaxTileRows];
  float* out[kMaxTileRows];
  int64_t len[kMaxTileRows];
};

// One KV head's K and V rows [0, len) of a sequence, contiguous (row stride = head_dim), and
// the slot list 0, 1, ... that addresses them; grown once per thread. Within one Attention call
// a thread's consecutive tasks mostly gather the same KV head of the same sequence for longer
// and longer runs (a causal prefill's token blocks), so the rows already gathered in this call
// are kept and only the new ones copied: a 512-token prefill copied each head's K/V 16 times
// over (67 MB per layer, a quarter of the attention time) and now copies it once.
struct Gathered {
  std::vector<float> k, v;
  std::vector<int32_t> iota;
  // What the rows [0, filled) hold: the call, cache, slot list and head they came from.
  uint64_t call = 0;
  const float* k_cache = nullptr;
  const float* v_cache = nullptr;
  const int32_t* slots = nullptr;
  int64_t filled = 0;

  void Fill(uint64_t this_call, const float* k_head, const float* v_head, const int32_t* slot_list,
            int64_t len, int64_t kv_dim, int64_t hd) {
    if (call != this_call || k_cache != k_head || v_cache != v_head || slots != slot_list) {
      call = this_call;
      k_cache = k_head;
      v_cache = v_head;
      slots = slot_list;
      filled = 0;
    }
    if (k.size() < static_cast<size_t>(len * hd)) {
      const size_t grown = static_cast<size_t>(std::max<int64_t>(len, 2 * filled) * hd);
      k.resize(grown);  // keeps the rows already gathered
      v.resize(grown);
    }
    while (iota.size() < static_cast<size_t>(len)) {
      iota.push_back(static_cast<int32_t>(iota.size()));
    }
    for (int64_t j = filled; j < len; ++j) {
      const int64_t from = static_cast<int64_t>(slot_list[j]) * kv_dim;
      std::memcpy(k.data() + j * hd, k_head + from, static_cast<size_t>(hd) * sizeof(float));
      std::memcpy(v.data() + j * hd, v_head + from, static_cast<size_t>(hd) * sizeof(float));
    }
    filled = std::max(filled, len);
  }
};

// Numbers Attention calls, so a thread's gathered rows are never reused across calls (the cache
// and slot tables change between them at the same addresses).
std::atomic<uint64_t> g_attention_calls{0};

}  // namespace

void Attention(const AttentionParams& p, ThreadPool* pool) {
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t kv_dim = p.num_kv_heads * p.head_dim;
  // A task: a block of tokens × one KV head × a chunk of that head's query heads.
  const int64_t heads_per_tile = std::min<int64_t>(group, kMaxTileRows);
  const int64_t head_chunks = (group + heads_per_tile - 1) / heads_per_tile;
  const int64_t tokens_per_task = std::max<int64_t>(1, kTaskRows / heads_per_tile);
  const int64_t token_blocks = (p.num_tokens + tokens_per_task - 1) / tokens_per_task;
  const auto* k_cache = static_cast<const float*>(p.k_cache);
  const auto* v_cache = static_cast<const float*>(p.v_cache);
  const uint64_t call = g_attention_calls.fetch_add(1, std::memory_order_relaxed) + 1;
  auto run = [&](int64_t begin, int64_t end, int thread) {
    thread_local Gathered gathered;  // the running thread's
    float* scores = p.workspace + static_cast<int64_t>(thread) * p.max_context;
    for (int64_t task = begin; task < end; ++task) {
      // KV head outermost: consecutive tasks of a thread read the same head's K/V instead of
      // cycling through all heads.
      const int64_t hc = task % head_chunks;
      const int64_t block = (task / head_chunks) % token_blocks;
      const int64_t kvh = task / (head_chunks * token_blocks);
      const int64_t h0 = kvh * group + hc * heads_per_tile;
      const int64_t h1 = std::min(h0 + heads_per_tile, (kvh + 1) * group);
      const int64_t t_end = std::min(p.num_tokens, (block + 1) * tokens_per_task);
      // Runs of tokens of one sequence (same slot list), each attended as one or more tiles
      // of rows whose scores fit the thread's workspace.
      for (int64_t t0 = block * tokens_per_task; t0 < t_end;) {
        int64_t t1 = t0 + 1;
        int64_t run_len = p.context_len[t0];
        while (t1 < t_end && p.slot_begin[t1] == p.slot_begin[t0]) {
          run_len = std::max<int64_t>(run_len, p.context_len[t1]);
          ++t1;
        }
        const float* k = k_cache + kvh * p.head_dim;
        const float* v = v_cache + kvh * p.head_dim;
        const int32_t* slots = p.slots + p.slot_begin[t0];
        int64_t stride = kv_dim;
        if ((t1 - t0) * (h1 - h0) >= kGatherMinRows && run_len <= kMaxGathered) {
          gathered.Fill(call, k, v, slots, run_len, kv_dim, p.head_dim);
          k = gathered.k.data();
          v = gathered.v.data();
          slots = gathered.iota.data();
          stride = p.head_dim;
        }
        Tile tile;
        int64_t tile_max_len = 0;
        auto flush = [&] {
          if (tile.rows == 0) return;
          HWY_DYNAMIC_DISPATCH(AttendTileImpl)
          (tile.rows, tile.q, tile.out, tile.len, k, v, slots, stride, p.head_dim, p.scale, scores);
          tile.rows = 0;
          tile_max_len = 0;
        };
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t len = p.context_len[t];
          for (int64_t h = h0; h < h1; ++h) {
            const int64_t max_len = std::max(tile_max_len, len);
            if (tile.rows == kMaxTileRows || (tile.rows + 1) * max_len > p.max_context) flush();
            tile.q[tile.rows] = p.q + t * p.q_stride + h * p.head_dim;
            tile.out[tile.rows] = p.out + (t * p.num_heads + h) * p.head_dim;
            tile.len[tile.rows] = len;
            ++tile.rows;
            tile_max_len = std::max(tile_max_len, len);
          }
        }
        flush();
        t0 = t1;
      }
    }
  };
  const int64_t tasks = token_blocks * p.num_kv_heads * head_chunks;
  if (pool == nullptr || tasks < 2) {
    run(0, tasks, 0);
  } else {
    pool->ParallelFor(tasks, run);
  }
}

}  // namespace rl::kernels::cpu
#endif  // HWY_ONCE
