#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/vec_ops.h"

namespace rl::kernels::cpu {

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

void Attention(const AttentionParams& p, ThreadPool* pool) {
  const int64_t group = p.num_heads / p.num_kv_heads;
  const int64_t kv_dim = p.num_kv_heads * p.head_dim;
  auto run = [&](int64_t begin, int64_t end, int thread) {
    float* scores = p.workspace + static_cast<int64_t>(thread) * p.max_context;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t t = task / p.num_heads;
      const int64_t h = task % p.num_heads;
      const int64_t kvh = h / group;
      const float* q = p.q + t * p.q_stride + h * p.head_dim;
      const int32_t* slots = p.slots + p.slot_begin[t];
      const int64_t len = p.context_len[t];
      float max_score = -INFINITY;
      for (int64_t j = 0; j < len; ++j) {
        const float* k = static_cast<const float*>(p.k_cache) +
                         static_cast<int64_t>(slots[j]) * kv_dim + kvh * p.head_dim;
        scores[j] = Dot(q, k, p.head_dim) * p.scale;
        max_score = std::max(max_score, scores[j]);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < len; ++j) {
        scores[j] = std::exp(scores[j] - max_score);
        sum += scores[j];
      }
      float* out = p.out + (t * p.num_heads + h) * p.head_dim;
      std::fill(out, out + p.head_dim, 0.0f);
      for (int64_t j = 0; j < len; ++j) {
        const float* v = static_cast<const float*>(p.v_cache) +
                         static_cast<int64_t>(slots[j]) * kv_dim + kvh * p.head_dim;
        Axpy(scores[j], v, out, p.head_dim);
      }
      Scale(1.0f / sum, out, p.head_dim);
    }
  };
  const int64_t tasks = p.num_tokens * p.num_heads;
  if (pool == nullptr || tasks < 2) {
    run(0, tasks, 0);
  } else {
    pool->ParallelFor(tasks, run);
  }
}

}  // namespace rl::kernels::cpu
