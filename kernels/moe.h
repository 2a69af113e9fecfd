// Mixture of experts, as Hugging Face's Qwen3MoeSparseMoeBlock computes it (no shared expert);
// the params every backend's kernels take (CPU: kernels/cpu/moe.h; CUDA: kernels/cuda/ops.h).
//
// MoeRoute: routing weights = softmax(router logits) in float32, the top-k experts by weight
// descending, and with norm_topk_prob the k weights divided by their sum (each kernel's header
// says how it orders equal weights).
//
// MoeExperts: y[t] = Σ over t's k experts, in ascending expert id, of
// weight · down(silu(gate(x[t])) · up(x[t])).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "common/model_io/dtype.h"

namespace rl::kernels {

struct MoeRouteParams {
  const float* logits = nullptr;  // [num_tokens, num_experts] router logits
  int32_t* ids = nullptr;         // [num_tokens, top_k] chosen experts, by weight descending
  float* weights = nullptr;       // [num_tokens, top_k] their routing weights
  int64_t num_tokens = 0;
  int64_t num_experts = 0;
  int64_t top_k = 0;
  bool norm_topk_prob = false;

  // Pointers and sizes (does not read the buffers: usable on device memory).
  absl::Status Validate() const;
};

struct MoeExpertsParams {
  const float* x = nullptr;        // [num_tokens, hidden]
  const int32_t* ids = nullptr;    // [num_tokens, top_k] from MoeRoute
  const float* weights = nullptr;  // [num_tokens, top_k]
  // num_experts pointers each (backend memory), all in w_dtype: gate and up are
  // [intermediate, hidden], down is [hidden, intermediate] (Hugging Face Linear layout).
  const void* const* gate = nullptr;
  const void* const* up = nullptr;
  const void* const* down = nullptr;
  model_io::DType w_dtype = model_io::DType::kF32;
  float* y = nullptr;  // [num_tokens, hidden], overwritten; must not alias x
  int64_t num_tokens = 0;
  int64_t hidden = 0;
  int64_t intermediate = 0;
  int64_t num_experts = 0;
  int64_t top_k = 0;

  // Checks sizes and pointers (reads the host arrays gate/up/down, not the buffers they point
  // to); the ids are checked by the kernel itself.
  absl::Status Validate() const;
};

}  // namespace rl::kernels
