// RMSNorm: y = x / sqrt(mean(x²) + eps) · w, row by row (Llama/Qwen; also Qwen3's per-head
// q/k norm with rows = tokens × heads). float32 compute; w read in its stored dtype.
// Batch invariance: each row's sum of squares has a fixed order (see vec_ops.h).
// Cost: 2·rows·dim flops, parallel over rows.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "common/model_io/dtype.h"
#include "kernels/cpu/thread_pool.h"

namespace rl::kernels::cpu {

struct RmsNormParams {
  const float* x = nullptr;  // [rows, dim]
  const void* w = nullptr;   // [dim] in w_dtype
  model_io::DType w_dtype = model_io::DType::kF32;
  float* y = nullptr;  // [rows, dim]; may equal x (in place)
  int64_t rows = 0;
  int64_t dim = 0;
  float eps = 1e-6f;

  absl::Status Validate() const;
};

void RmsNorm(const RmsNormParams& p, ThreadPool* pool);

}  // namespace rl::kernels::cpu
