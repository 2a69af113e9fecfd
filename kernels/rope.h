// RoPE: rotates q and k in place with the Hugging Face "rotate_half" pairing (element i with
// i + head_dim/2); the params every backend's kernel takes (CPU: kernels/cpu/rope.h; CUDA:
// kernels/cuda/ops.h). The caller supplies cos/sin per token, so every scaling variant
// (linear, dynamic NTK, Llama-3) is a property of the table, not of the kernel.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace rl::kernels {

struct RopeParams {
  float* q = nullptr;          // [num_tokens, num_heads, head_dim], row stride q_stride
  float* k = nullptr;          // [num_tokens, num_kv_heads, head_dim], row stride k_stride
  const float* cos = nullptr;  // [num_tokens, head_dim / 2]
  const float* sin = nullptr;  // [num_tokens, head_dim / 2]
  int64_t num_tokens = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;  // even
  int64_t q_stride = 0;  // floats between tokens in q (≥ num_heads · head_dim)
  int64_t k_stride = 0;  // floats between tokens in k (≥ num_kv_heads · head_dim)

  // Pointers and sizes (does not read the buffers: usable on device memory).
  absl::Status Validate() const;
};

}  // namespace rl::kernels
