// SiluMul: the SwiGLU gate, out = silu(gate) · up with silu(x) = x / (1 + e^-x), elementwise in
// float32. Cost: O(n), parallel over contiguous ranges (elementwise, so trivially invariant).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/thread_pool.h"

namespace rl::kernels::cpu {

struct SiluMulParams {
  const float* gate = nullptr;  // [num_tokens, intermediate]
  const float* up = nullptr;    // [num_tokens, intermediate]
  float* out = nullptr;         // [num_tokens, intermediate]; may equal gate or up
  int64_t n = 0;                // num_tokens · intermediate

  absl::Status Validate() const;
};

void SiluMul(const SiluMulParams& p, ThreadPool* pool);

}  // namespace rl::kernels::cpu
