// Paged attention for a mixed batch of prefill chunks and decode tokens, plus the KV write: the
// params every backend's kernels take (CPU: kernels/cpu/attention.h; CUDA: kernels/cuda/ops.h).
//
// KV cache: per layer two buffers [num_slots, num_kv_heads, head_dim] in kv_dtype (float32 on
// the CPU; device backends: F32 or BF16); a sequence's position j lives in slot
// slots[seq_slot_begin + j] (any slots, not necessarily contiguous).
// Token t attends causally to positions [0, context_len[t]) of its own sequence, which must
// already hold K/V (write the step's K/V with WriteKv first).
// Grouped-query attention: query head h reads KV head h / (num_heads / num_kv_heads).
// Numerics: float32 scores, softmax and weighted V sum; every (token, head) row is computed in
// an order that depends only on that row, so its result does not depend on the rest of the
// batch (batch invariance).
//
// Validation: ValidateShapes() checks pointers and sizes only (reads no buffer: usable on device
// memory); Validate() also reads the slot and context arrays (host memory only). Checks that
// belong to one backend (the CPU's float32 KV cache and workspace) live with its kernel.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "common/model_io/dtype.h"

namespace rl::kernels {

struct WriteKvParams {
  const float* k = nullptr;        // [num_tokens, kv_dim], row stride k_stride
  const float* v = nullptr;        // [num_tokens, kv_dim], row stride v_stride
  const int32_t* slots = nullptr;  // [num_tokens] destination slot of each token
  void* k_cache = nullptr;         // [num_slots, kv_dim] in kv_dtype
  void* v_cache = nullptr;         // [num_slots, kv_dim] in kv_dtype
  int64_t num_tokens = 0;
  int64_t kv_dim = 0;  // num_kv_heads · head_dim
  int64_t k_stride = 0;
  int64_t v_stride = 0;
  int64_t num_slots = 0;
  model_io::DType kv_dtype = model_io::DType::kF32;  // F32 on the CPU; device backends: F32/BF16

  // Pointers and sizes only (does not read the buffers: usable on device memory).
  absl::Status ValidateShapes() const;
  // ValidateShapes, then every slot is in range (O(num_tokens); host memory only).
  absl::Status Validate() const;
};

struct AttentionParams {
  const float* q = nullptr;       // [num_tokens, num_heads, head_dim], row stride q_stride
  const void* k_cache = nullptr;  // [num_slots, num_kv_heads, head_dim] in kv_dtype
  const void* v_cache = nullptr;  // [num_slots, num_kv_heads, head_dim] in kv_dtype
  model_io::DType kv_dtype = model_io::DType::kF32;
  float* out = nullptr;                  // [num_tokens, num_heads, head_dim] (contiguous)
  const int32_t* context_len = nullptr;  // [num_tokens] positions attended (position + 1)
  const int32_t* slot_begin = nullptr;   // [num_tokens] offset of its sequence in `slots`
  const int32_t* slots = nullptr;        // [num_slot_entries] concatenated per sequence
  // The CPU kernel's scores: [num_workspaces, max_context] caller-owned, num_workspaces ≥ the
  // pool's thread count (device backends own their workspace and ignore these two).
  float* workspace = nullptr;
  int64_t num_workspaces = 0;
  int64_t num_tokens = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t q_stride = 0;
  int64_t num_slots = 0;
  int64_t num_slot_entries = 0;
  int64_t max_context = 0;        // ≥ every context_len
  int64_t batch_max_context = 0;  // the largest context_len of this batch (0: use max_context);
                                  // device kernels size their grid by it
  float scale = 1.0f;             // usually 1 / sqrt(head_dim)

  // Pointers and sizes only (does not read the buffers: usable on device memory; the
  // workspace is not required since device backends own theirs).
  absl::Status ValidateShapes() const;
  // ValidateShapes, then every context range and slot (O(Σ context_len); host memory only).
  absl::Status Validate() const;
};

}  // namespace rl::kernels
