#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace rl::kernels::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

#define RL_UNROLL _Pragma("GCC unroll 16")

// Attends kR query rows that share a KV head and a slot list: row r attends positions
// [0, len[r]). Each row is computed exactly as one row alone would be (and as Dot, Axpy and
// Scale in vec_ops compute it): a score is one SIMD accumulator over the head dim in index
// order, the fixed horizontal sum, the scalar tail, times `scale`; then the max, exp and sum in
// position order; the output is Σ_j p_j · v_j in position order per lane, then times 1 / sum.
// Sharing only saves memory traffic: each K and V row is loaded once for all kR rows.
// `scores` holds kR × max(len) floats.
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
  float max_score[kR];
  RL_UNROLL for (int r = 0; r < kR; ++r) {
    s[r] = scores + r * max_len;
    max_score[r] = -INFINITY;
  }
  for (int64_t j = 0; j < max_len; ++j) {
    const float* kj = k + static_cast<int64_t>(slots[j]) * kv_dim;
    VF acc[kR];
    RL_UNROLL for (int r = 0; r < kR; ++r) acc[r] = hn::Zero(d);
    for (int64_t i = 0; i < dvec; i += lanes) {
      const VF kv = hn::LoadU(d, kj + i);
      RL_UNROLL for (int r = 0; r < kR; ++r) acc[r] =
          hn::MulAdd(hn::LoadU(d, q[r] + i), kv, acc[r]);
    }
    RL_UNROLL for (int r = 0; r < kR; ++r) {
      if (j >= len[r]) continue;
      float dot = hn::GetLane(hn::SumOfLanes(d, acc[r]));
      for (int64_t i = dvec; i < hd; ++i) dot += q[r][i] * kj[i];
      s[r][j] = dot * scale;
      max_score[r] = std::max(max_score[r], s[r][j]);
    }
  }
  float inv[kR];
  RL_UNROLL for (int r = 0; r < kR; ++r) {
    float sum = 0.0f;
    for (int64_t j = 0; j < len[r]; ++j) {
      s[r][j] = std::exp(s[r][j] - max_score[r]);
      sum += s[r][j];
    }
    inv[r] = 1.0f / sum;
  }
  for (int64_t i = 0; i < dvec; i += lanes) {
    VF acc[kR];
    RL_UNROLL for (int r = 0; r < kR; ++r) acc[r] = hn::Zero(d);
    int64_t j = 0;
    for (; j < min_len; ++j) {
      const VF vv = hn::LoadU(d, v + static_cast<int64_t>(slots[j]) * kv_dim + i);
      RL_UNROLL for (int r = 0; r < kR; ++r) acc[r] = hn::MulAdd(hn::Set(d, s[r][j]), vv, acc[r]);
    }
    for (; j < max_len; ++j) {
      const VF vv = hn::LoadU(d, v + static_cast<int64_t>(slots[j]) * kv_dim + i);
      RL_UNROLL for (int r = 0; r < kR; ++r) {
        if (j < len[r]) acc[r] = hn::MulAdd(hn::Set(d, s[r][j]), vv, acc[r]);
      }
    }
    RL_UNROLL for (int r = 0; r < kR; ++r)
        hn::StoreU(hn::Mul(hn::Set(d, inv[r]), acc[r]), d, out[r] + i);
  }
  for (int64_t i = dvec; i < hd; ++i) {
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

absl::Status WriteKvParams::ValidateShapes() const {
  if (k == nullptr || v == nullptr || slots == nullptr || k_cache == nullptr ||
      v_cache == nullptr) {
    return absl::InvalidArgumentError("write_kv: null buffer");
  }
  if (num_tokens < 0 || kv_dim <= 0 || k_stride < kv_dim || v_stride < kv_dim || num_slots <= 0) {
    return absl::InvalidArgumentError("write_kv: bad sizes");
  }
  return absl::OkStatus();
}

absl::Status WriteKvParams::Validate() const {
  if (absl::Status s = ValidateShapes(); !s.ok()) return s;
  if (kv_dtype != model_io::DType::kF32) {
    return absl::InvalidArgumentError("write_kv: the CPU KV cache is float32");
  }
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (slots[t] < 0 || slots[t] >= num_slots) {
      return absl::InvalidArgumentError(
          absl::StrCat("write_kv: slot ", slots[t], " out of range [0, ", num_slots, ")"));
    }
  }
  return absl::OkStatus();
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

absl::Status AttentionParams::ValidateShapes() const {
  if (q == nullptr || k_cache == nullptr || v_cache == nullptr || out == nullptr ||
      context_len == nullptr || slot_begin == nullptr || slots == nullptr) {
    return absl::InvalidArgumentError("attention: null buffer");
  }
  if (num_tokens < 0 || num_heads <= 0 || num_kv_heads <= 0 || num_heads % num_kv_heads != 0 ||
      head_dim <= 0 || q_stride < num_heads * head_dim || num_slots <= 0 || max_context <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("attention: bad sizes heads=", num_heads,
                                                   " kv_heads=", num_kv_heads,
                                                   " head_dim=", head_dim));
  }
  return absl::OkStatus();
}

absl::Status AttentionParams::Validate() const {
  if (absl::Status s = ValidateShapes(); !s.ok()) return s;
  if (workspace == nullptr || num_workspaces <= 0) {
    return absl::InvalidArgumentError("attention: no workspace");
  }
  if (kv_dtype != model_io::DType::kF32) {
    return absl::InvalidArgumentError("attention: the CPU KV cache is float32");
  }
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t len = context_len[t];
    const int64_t begin = slot_begin[t];
    if (len <= 0 || len > max_context || begin < 0 || begin + len > num_slot_entries) {
      return absl::InvalidArgumentError(absl::StrCat("attention: token ", t, " context ", len,
                                                     " at slot entry ", begin, " out of range"));
    }
    for (int64_t j = 0; j < len; ++j) {
      const int32_t s = slots[begin + j];
      if (s < 0 || s >= num_slots) {
        return absl::InvalidArgumentError(
            absl::StrCat("attention: slot ", s, " out of range [0, ", num_slots, ")"));
      }
    }
  }
  return absl::OkStatus();
}

namespace {

// Query rows (token, head) that share a KV head and a sequence are attended together, so each
// K/V row is read from memory once per tile instead of once per row. Decode: the heads of a
// GQA group; prefill: also several tokens of one chunk.
constexpr int kMaxTileRows = 8;

struct Tile {
  int rows = 0;
  const float* q[kMaxTileRows];
  float* out[kMaxTileRows];
  int64_t len[kMaxTileRows];
};

}  // namespace

void Attention(const AttentionParams& p, ThreadPool* pool) {
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t kv_dim = p.num_kv_heads * p.head_dim;
  // A task: a block of tokens × one KV head × a chunk of that head's query heads.
  const int64_t heads_per_tile = std::min<int64_t>(group, kMaxTileRows);
  const int64_t head_chunks = (group + heads_per_tile - 1) / heads_per_tile;
  const int64_t tokens_per_task = std::max<int64_t>(1, kMaxTileRows / heads_per_tile);
  const int64_t token_blocks = (p.num_tokens + tokens_per_task - 1) / tokens_per_task;
  const auto* k_cache = static_cast<const float*>(p.k_cache);
  const auto* v_cache = static_cast<const float*>(p.v_cache);
  auto run = [&](int64_t begin, int64_t end, int thread) {
    float* scores = p.workspace + static_cast<int64_t>(thread) * p.max_context;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t hc = task % head_chunks;
      const int64_t kvh = (task / head_chunks) % p.num_kv_heads;
      const int64_t block = task / (head_chunks * p.num_kv_heads);
      const int64_t h0 = kvh * group + hc * heads_per_tile;
      const int64_t h1 = std::min(h0 + heads_per_tile, (kvh + 1) * group);
      const int64_t t_end = std::min(p.num_tokens, (block + 1) * tokens_per_task);
      // Runs of tokens of one sequence (same slot list), each attended as one or more tiles
      // of rows whose scores fit the thread's workspace.
      for (int64_t t0 = block * tokens_per_task; t0 < t_end;) {
        int64_t t1 = t0 + 1;
        while (t1 < t_end && p.slot_begin[t1] == p.slot_begin[t0]) ++t1;
        Tile tile;
        int64_t tile_max_len = 0;
        auto flush = [&] {
          if (tile.rows == 0) return;
          HWY_DYNAMIC_DISPATCH(AttendTileImpl)
          (tile.rows, tile.q, tile.out, tile.len, k_cache + kvh * p.head_dim,
           v_cache + kvh * p.head_dim, p.slots + p.slot_begin[t0], kv_dim, p.head_dim, p.scale,
           scores);
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
