// CPU mixture of experts over the params of kernels/moe.h (Qwen3MoeSparseMoeBlock semantics).
//
// MoeRoute: the top-k is selected exactly as torch.topk does on the CPU (same algorithm, so
// equal weights come out in torch's order and NaN counts as the largest value).
//
// MoeExperts: grouped per expert: the rows routed to expert e are gathered and run through the
// matmul kernel together (m = rows routed to e), so each expert's weights are streamed once per
// step. Batch invariance: every matmul row is computed as if alone (kernels/cpu/matmul.h) and a
// token's sum order depends only on its own expert ids, so a token's output is bit-identical
// whatever else is in the batch.
// Cost: 3 · k · hidden · moe_intermediate FMAs per token; weights read: the experts touched.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/moe.h"

namespace rl::kernels::cpu {

// Run after p.Validate().
void MoeRoute(const MoeRouteParams& p);

// Reusable host buffers of MoeExperts (grown to the largest step seen).
struct MoeScratch {
  std::vector<float> x, gate, up, out;
  std::vector<int32_t> rows, slots;  // per expert: token rows and their top-k slot
  std::vector<int64_t> begin;
};

// Run after p.Validate(). InvalidArgument when an expert id is out of range (nothing written
// then).
absl::Status MoeExperts(const MoeExpertsParams& p, ThreadPool* pool, MoeScratch* scratch);

}  // namespace rl::kernels::cpu
