// Matmul: y = x · Wᵀ (+ bias), the Linear layer in Hugging Face layout; the params every
// backend's kernel takes (CPU: kernels/cpu/matmul.h; CUDA: kernels/cuda/ops.h and cuBLAS).
// Weights are read in their stored dtype (F32, BF16, F16) and widened to float32; activations
// and accumulation are float32. A batch-invariant kernel computes every y[i][j] as one dot
// product over k in an order fixed by k alone, whatever m (each kernel's header says whether
// it is one).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/model_io/dtype.h"

namespace rl::kernels {

struct MatmulParams {
  const float* x = nullptr;  // [m, k] row-major
  const void* w = nullptr;   // [n, k] row-major, in w_dtype
  model_io::DType w_dtype = model_io::DType::kF32;
  const void* bias = nullptr;  // [n] in bias_dtype, or null
  model_io::DType bias_dtype = model_io::DType::kF32;
  float* y = nullptr;  // [m, n] row-major; must not alias x
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;

  // Pointers, sizes and dtypes (does not read the buffers: usable on device memory).
  absl::Status Validate() const;
};

// Several matmuls with the same m run as one (fused QKV, gate/up): the group is not empty,
// each passes Validate() and all have the first's m. The outputs must not overlap (not
// checked).
absl::Status ValidateMatmulGroup(absl::Span<const MatmulParams> group);

}  // namespace rl::kernels
