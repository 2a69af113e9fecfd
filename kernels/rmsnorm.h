// RMSNorm: y = x / sqrt(mean(x²) + eps) · w, row by row (Llama/Qwen; also Qwen3's per-head
// q/k norm with rows = tokens × heads); the params every backend's kernel takes (CPU:
// kernels/cpu/rmsnorm.h; CUDA: kernels/cuda/ops.h). float32 compute; w read in its stored
// dtype. Batch invariance: each row's sum of squares has an order fixed by dim alone.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "common/model_io/dtype.h"

namespace rl::kernels {

struct RmsNormParams {
  const float* x = nullptr;  // [rows, dim]
  const void* w = nullptr;   // [dim] in w_dtype
  model_io::DType w_dtype = model_io::DType::kF32;
  float* y = nullptr;  // [rows, dim]; may equal x (in place)
  int64_t rows = 0;
  int64_t dim = 0;
  float eps = 1e-6f;

  // Pointers, sizes and dtype (does not read the buffers: usable on device memory).
  absl::Status Validate() const;
};

}  // namespace rl::kernels
