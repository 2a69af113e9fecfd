// Transformer: the decoder-only model definition shared by every backend — embedding,
// per layer RMSNorm → q/k/v projections (+ Qwen2 bias) → Qwen3 per-head q/k RMSNorm → RoPE →
// paged grouped-query attention → o projection → residual → RMSNorm → SwiGLU MLP (or, in the
// sparse layers of an MoE model, router → softmax top-k → grouped experts) → residual; then the
// final norm and the LM head (tied or not) on the rows whose logits are asked for. The sparse
// layers live in transformer_moe.cc.
//
// It owns the paged KV cache (per layer K and V of [num_kv_slots, num_kv_heads, head_dim] in
// the KV dtype: float32 on the CPU, bf16 by default on CUDA) and the activation buffers, which grow
// to the largest batch seen. All ops run through a Backend; the host only builds the step plan
// (positions, slot tables, RoPE rows). Forward validates its whole input before touching the cache.
//
// CUDA graphs (backends that support them, `use_graphs`): a decode-only step (every sequence one
// token, last-row logits, at most kGraphBatchSizes.back() sequences) is padded to the next batch
// bucket — padding tokens write a scratch slot past num_kv_slots and attend to it alone — and
// its attention grid to a power-of-two number of splits; the compute of each (bucket, splits) is
// captured once (after one eager run that sizes every buffer) and replayed from then on. Only
// the plan upload and the logits copy run outside the graph. A buffer that has to grow, or new
// weights, drop the graphs. Prefill and mixed steps run eagerly, and so does every step of an
// MoE model (the expert grouping is decided on the host).
// Thread safety: one caller at a time.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model_io/model_config.h"
#include "services/worker/model/backend.h"
#include "services/worker/model/model_runner.h"
#include "services/worker/model/rope_table.h"
#include "services/worker/model/weights.h"

namespace rl::model {

class Transformer {
 public:
  // Allocates the KV cache for `num_kv_slots` token slots.
  static absl::StatusOr<std::unique_ptr<Transformer>> Create(
      const model_io::ModelConfig& config, Backend* backend, int64_t num_kv_slots,
      bool use_graphs = false, model_io::DType kv_dtype = model_io::DType::kF32);

  // Checks `in` against the config and the cache (InvalidArgument naming the sequence and the
  // field), then runs it. `out` is overwritten.
  absl::Status Forward(const Weights& weights, const ForwardInput& in, ForwardOutput* out);
  absl::Status Validate(const ForwardInput& in) const;

  int64_t num_kv_slots() const { return num_kv_slots_; }
  bool uses_graphs() const { return use_graphs_; }
  int num_graphs() const { return static_cast<int>(graphs_.size()); }

  static constexpr std::array<int64_t, 15> kGraphBatchSizes = {1,  2,  4,   8,   16,  24,  32, 48,
                                                               64, 96, 128, 160, 192, 224, 256};
  static constexpr int64_t kGraphContextQuantum = 256;  // = the CUDA attention split
  // Bytes of KV cache per token slot over all layers.
  static int64_t KvBytesPerSlot(const model_io::ModelConfig& config,
                                model_io::DType kv_dtype = model_io::DType::kF32);
  model_io::DType kv_dtype() const { return kv_dtype_; }
  // The KV cache's buffers: every layer's K, then every layer's V (tests check where they live).
  std::vector<absl::Span<const uint8_t>> KvCacheBytes() const;

 private:
  Transformer(const model_io::ModelConfig& config, Backend* backend, int64_t num_kv_slots)
      : config_(config), backend_(backend), rope_(config), num_kv_slots_(num_kv_slots) {}

  using GraphKey = std::pair<int64_t, int64_t>;  // (padded batch, attention splits)

  absl::Status Reserve(DeviceBuffer* buffer, int64_t bytes);
  absl::Status ReserveAll(int64_t num_tokens, int64_t num_rows);
  bool GraphEligible(const ForwardInput& in) const;
  // Embedding, layers, final norm and LM head over the uploaded plan.
  absl::Status Compute(const Weights& w, int64_t num_tokens, int64_t num_rows,
                       int64_t batch_max_context);
  absl::Status RunGraph(const Weights& w, GraphKey key, int64_t batch_max_context);
  absl::Status RunLayers(const Weights& w, int64_t num_tokens, int64_t batch_max_context);
  // The sparse MLP of layer `l` (the `moe_index`-th MoE layer) on h_, into moe_out_.
  absl::Status RunMoe(const LayerWeights& lw, int64_t moe_index, int64_t num_tokens);
  // Copies the step's routing into out (transposed to [tokens, moe layers, top_k]).
  absl::Status CopyRouting(int64_t num_tokens, ForwardOutput* out);

  model_io::ModelConfig config_;
  Backend* backend_;
  RopeTable rope_;
  int64_t num_kv_slots_;
  bool use_graphs_ = false;
  model_io::DType kv_dtype_ = model_io::DType::kF32;
  std::map<GraphKey, int> graphs_;  // backend graph handles
  const Weights* graph_weights_ = nullptr;
  std::vector<DeviceBuffer> k_cache_;
  std::vector<DeviceBuffer> v_cache_;

  // Step plan on the host.
  std::vector<int32_t> h_ids_, h_write_slots_, h_context_len_, h_slot_begin_, h_slots_,
      h_logit_rows_;
  std::vector<float> h_cos_, h_sin_;
  // Backend buffers (grown on demand).
  DeviceBuffer ids_, write_slots_, context_len_, slot_begin_, slots_, logit_rows_, cos_, sin_;
  DeviceBuffer x_, h_, q_, k_, v_, attn_, gate_, up_, final_, logits_, workspace_;
  // MoE: router logits [tokens, experts], routing [moe layers, tokens, top_k], expert output.
  DeviceBuffer router_logits_, route_ids_, route_weights_, moe_out_;
  int64_t num_moe_layers_ = 0;
  std::vector<const void*> expert_ptrs_;  // gate, up, down pointer arrays of one layer
};

}  // namespace rl::model
