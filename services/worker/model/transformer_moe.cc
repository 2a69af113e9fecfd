// Transformer's sparse (MoE) layers: the router GEMM, softmax top-k routing and the grouped
// experts, and the routing copy that R3 requests return (transformer.h has the design).
#include <cstdint>
#include <vector>

#include "common/status.h"
#include "services/worker/model/transformer.h"

namespace rl::model {

absl::Status Transformer::RunMoe(const LayerWeights& lw, int64_t moe_index, int64_t num_tokens) {
  const model_io::ModelConfig& c = config_;
  const int64_t k = c.num_experts_per_tok;
  kernels::MatmulParams gate;
  gate.x = h_.f32();
  gate.w = lw.router->data;
  gate.w_dtype = lw.router->dtype;
  gate.y = router_logits_.f32();
  gate.m = num_tokens;
  gate.n = c.num_experts;
  gate.k = c.hidden_size;
  RETURN_IF_ERROR(backend_->Matmul(gate));

  const int64_t offset = moe_index * num_tokens * k;
  kernels::MoeRouteParams route;
  route.logits = router_logits_.f32();
  route.ids = route_ids_.i32() + offset;
  route.weights = route_weights_.f32() + offset;
  route.num_tokens = num_tokens;
  route.num_experts = c.num_experts;
  route.top_k = k;
  route.norm_topk_prob = c.norm_topk_prob;
  RETURN_IF_ERROR(backend_->MoeRoute(route));

  const size_t e = static_cast<size_t>(c.num_experts);
  expert_ptrs_.resize(3 * e);
  for (size_t i = 0; i < e; ++i) {
    expert_ptrs_[i] = lw.expert_gate[i]->data;
    expert_ptrs_[e + i] = lw.expert_up[i]->data;
    expert_ptrs_[2 * e + i] = lw.expert_down[i]->data;
  }
  kernels::MoeExpertsParams ex;
  ex.x = h_.f32();
  ex.ids = route.ids;
  ex.weights = route.weights;
  ex.gate = expert_ptrs_.data();
  ex.up = expert_ptrs_.data() + e;
  ex.down = expert_ptrs_.data() + 2 * e;
  ex.w_dtype = lw.expert_gate[0]->dtype;
  ex.y = moe_out_.f32();
  ex.num_tokens = num_tokens;
  ex.hidden = c.hidden_size;
  ex.intermediate = c.moe_intermediate_size;
  ex.num_experts = c.num_experts;
  ex.top_k = k;
  return backend_->MoeExperts(ex);
}

absl::Status Transformer::CopyRouting(int64_t num_tokens, ForwardOutput* out) {
  const int64_t k = config_.num_experts_per_tok;
  const int64_t layers = num_moe_layers_;
  const int64_t n = layers * num_tokens * k;
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::vector<float> weights(static_cast<size_t>(n));
  RETURN_IF_ERROR(backend_->CopyToHost(ids.data(), route_ids_.data(), n * sizeof(int32_t)));
  RETURN_IF_ERROR(backend_->CopyToHost(weights.data(), route_weights_.data(), n * sizeof(float)));
  out->routed_experts.resize(static_cast<size_t>(n));
  out->routed_weights.resize(static_cast<size_t>(n));
  // [layers, tokens, k] → [tokens, layers, k]
  for (int64_t l = 0; l < layers; ++l) {
    for (int64_t t = 0; t < num_tokens; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        const size_t src = static_cast<size_t>((l * num_tokens + t) * k + j);
        const size_t dst = static_cast<size_t>((t * layers + l) * k + j);
        out->routed_experts[dst] = ids[src];
        out->routed_weights[dst] = weights[src];
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace rl::model
