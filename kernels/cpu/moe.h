// Mixture of experts, as Hugging Face's Qwen3MoeSparseMoeBlock computes it (no shared expert):
//
// MoeRoute: routing weights = softmax(router logits) in float32, the top-k experts by weight
// descending, selected exactly as torch.topk does on the CPU (same algorithm, so equal weights
// come out in torch's order and NaN counts as the largest value), and with norm_topk_prob the k
// weights divided by their sum.
//
// MoeExperts: y[t] = Σ over t's k experts, in ascending expert id, of
// weight · down(silu(gate(x[t])) · up(x[t])). Grouped per expert: the rows routed to expert e are
// gathered and run through the matmul kernel together (m = rows routed to e), so each expert's
// weights are streamed once per step. Batch invariance: every matmul row is computed as if alone
// (kernels/cpu/matmul.h) and a token's sum order depends only on its own expert ids, so a
// token's output is bit-identical whatever else is in the batch.
// Cost: 3 · k · hidden · moe_intermediate FMAs per token; weights read: the experts touched.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/model_io/dtype.h"
#include "kernels/cpu/thread_pool.h"

namespace rl::kernels::cpu {

struct MoeRouteParams {
  const float* logits = nullptr;  // [num_tokens, num_experts] router logits
  int32_t* ids = nullptr;         // [num_tokens, top_k] chosen experts, by weight descending
  float* weights = nullptr;       // [num_tokens, top_k] their routing weights
  int64_t num_tokens = 0;
  int64_t num_experts = 0;
  int64_t top_k = 0;
  bool norm_topk_prob = false;

  absl::Status Validate() const;
};

void MoeRoute(const MoeRouteParams& p);

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

  // Checks sizes and pointers; the ids are checked by MoeExperts itself (host memory).
  absl::Status Validate() const;
};

// Reusable host buffers of MoeExperts (grown to the largest step seen).
struct MoeScratch {
  std::vector<float> x, gate, up, out;
  std::vector<int32_t> rows, slots;  // per expert: token rows and their top-k slot
  std::vector<int64_t> begin;
};

// InvalidArgument when an expert id is out of range (nothing written then).
absl::Status MoeExperts(const MoeExpertsParams& p, ThreadPool* pool, MoeScratch* scratch);

}  // namespace rl::kernels::cpu
