// Transformer: the decoder-only model definition shared by every backend — embedding,
// per layer RMSNorm → q/k/v projections (+ Qwen2 bias) → Qwen3 per-head q/k RMSNorm → RoPE →
// paged grouped-query attention → o projection → residual → RMSNorm → SwiGLU MLP → residual;
// then the final norm and the LM head (tied or not) on the rows whose logits are asked for.
//
// It owns the paged KV cache (per layer K and V of [num_kv_slots, num_kv_heads, head_dim]
// float32) and the activation buffers, which grow to the largest batch seen. All ops run
// through a Backend; the host only builds the step plan (positions, slot tables, RoPE rows).
// Forward validates its whole input before touching the cache.
// Thread safety: one caller at a time.
#pragma once

#include <cstdint>
#include <memory>
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
  static absl::StatusOr<std::unique_ptr<Transformer>> Create(const model_io::ModelConfig& config,
                                                             Backend* backend,
                                                             int64_t num_kv_slots);

  // Checks `in` against the config and the cache (InvalidArgument naming the sequence and the
  // field), then runs it. `out` is overwritten.
  absl::Status Forward(const Weights& weights, const ForwardInput& in, ForwardOutput* out);
  absl::Status Validate(const ForwardInput& in) const;

  int64_t num_kv_slots() const { return num_kv_slots_; }
  // Bytes of KV cache per token slot over all layers.
  static int64_t KvBytesPerSlot(const model_io::ModelConfig& config);

 private:
  Transformer(const model_io::ModelConfig& config, Backend* backend, int64_t num_kv_slots)
      : config_(config), backend_(backend), rope_(config), num_kv_slots_(num_kv_slots) {}

  absl::Status Reserve(DeviceBuffer* buffer, int64_t bytes);
  absl::Status RunLayers(const Weights& w, int64_t num_tokens);

  model_io::ModelConfig config_;
  Backend* backend_;
  RopeTable rope_;
  int64_t num_kv_slots_;
  std::vector<DeviceBuffer> k_cache_;
  std::vector<DeviceBuffer> v_cache_;

  // Step plan on the host.
  std::vector<int32_t> h_ids_, h_write_slots_, h_context_len_, h_slot_begin_, h_slots_,
      h_logit_rows_;
  std::vector<float> h_cos_, h_sin_;
  // Backend buffers (grown on demand).
  DeviceBuffer ids_, write_slots_, context_len_, slot_begin_, slots_, logit_rows_, cos_, sin_;
  DeviceBuffer x_, h_, q_, k_, v_, attn_, gate_, up_, final_, logits_, workspace_;
};

}  // namespace rl::model
