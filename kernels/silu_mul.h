// SiluMul: the SwiGLU gate, out = silu(gate) · up with silu(x) = x / (1 + e^-x), elementwise in
// float32 (so trivially batch-invariant); the params every backend's kernel takes (CPU:
// kernels/cpu/silu_mul.h; CUDA: kernels/cuda/ops.h).
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace rl::kernels {

struct SiluMulParams {
  const float* gate = nullptr;  // [num_tokens, intermediate]
  const float* up = nullptr;    // [num_tokens, intermediate]
  float* out = nullptr;         // [num_tokens, intermediate]; may equal gate or up
  int64_t n = 0;                // num_tokens · intermediate

  // Pointers and size (does not read the buffers: usable on device memory).
  absl::Status Validate() const;
};

}  // namespace rl::kernels
