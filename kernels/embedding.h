// Embedding: gathers rows of the token-embedding table and widens them to float32; the params
// every backend's kernel takes (CPU: kernels/cpu/embedding.h; CUDA: kernels/cuda/ops.h).
// Token ids must be validated by the caller against num_rows (Validate() checks them too,
// O(num_tokens); host memory only).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "common/model_io/dtype.h"

namespace rl::kernels {

struct EmbeddingParams {
  const void* table = nullptr;  // [num_rows, dim] in table_dtype
  model_io::DType table_dtype = model_io::DType::kF32;
  const int32_t* ids = nullptr;  // [num_tokens], each in [0, num_rows)
  float* out = nullptr;          // [num_tokens, dim]
  int64_t num_tokens = 0;
  int64_t num_rows = 0;
  int64_t dim = 0;

  // Pointers, sizes and dtype only (does not read the buffers: usable on device memory).
  absl::Status ValidateShapes() const;
  // ValidateShapes, then every id (reads `ids`: host memory only).
  absl::Status Validate() const;
};

}  // namespace rl::kernels
