// Matmul: y = x · Wᵀ (+ bias), the Linear layer in Hugging Face layout. Weights are read in
// their stored dtype (F32, BF16, F16) and widened to float32 in SIMD registers; activations and
// accumulation are float32.
//
// Batch invariance: every y[i][j] is one dot product over k with a fixed order (SIMD lanes in
// index order, fixed horizontal sum, scalar tail, then + bias), whatever m, the tiling or the
// thread count. Work is split over output columns only; the k reduction is never split.
// Cost: m·n·k FMAs. Register tiles of 6 × 4 (rows of x × rows of W; 4 × 3 on AVX2), then
// 4-, 2- and 1-row tiles for the rest (a 1- or 2-row tile takes 8 rows of W, 4 on AVX2), over
// column slabs of W kept in L2; W is widened in registers and prefetched one tile ahead, so
// decode at batch 1-2 streams it once at about the read-only stream rate.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/model_io/dtype.h"
#include "kernels/cpu/thread_pool.h"

namespace rl::kernels::cpu {

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

  absl::Status Validate() const;
};

void Matmul(const MatmulParams& p, ThreadPool* pool);

// Several matmuls with the same m run as one (fused QKV, gate/up): one parallel region splits
// all their output columns by a fixed partition, and every element is computed exactly as
// Matmul computes it (bit-identical). Each must pass Validate(); the outputs must not overlap.
absl::Status ValidateMatmulGroup(absl::Span<const MatmulParams> group);
void MatmulGroup(absl::Span<const MatmulParams> group, ThreadPool* pool);

}  // namespace rl::kernels::cpu
