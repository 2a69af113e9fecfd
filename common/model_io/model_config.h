// ModelConfig: the architecture of a decoder-only transformer in Hugging Face layout, parsed
// from config.json (Llama 1/2/3, Qwen2, Qwen3, Qwen3-MoE). Every field the runner needs is explicit
// and validated at parse time; unknown architectures are an error naming the value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace rl::model_io {

// Bounds checked at parse time (the largest public MoE models have 256 experts, top-8).
inline constexpr int64_t kMaxExperts = 4096;

enum class Arch { kLlama, kQwen2, kQwen3, kQwen3Moe };

// RoPE scaling from config.json's "rope_scaling" (absent → kNone).
struct RopeScaling {
  enum class Type { kNone, kLinear, kDynamic, kLlama3 };
  Type type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;                  // llama3
  double high_freq_factor = 4.0;                 // llama3
  int64_t original_max_position_embeddings = 0;  // llama3 / dynamic
};

struct ModelConfig {
  Arch arch = Arch::kLlama;
  std::string architecture_name;  // e.g. "LlamaForCausalLM"
  std::string model_type;         // e.g. "llama"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // hidden_size / num_attention_heads unless given
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v bias (Qwen2: true)
  bool qk_norm = false;         // per-head q/k RMSNorm (Qwen3, Qwen3-MoE: true)
  // Mixture of experts (Qwen3-MoE; num_experts == 0 for dense models). Layer l is sparse when
  // IsMoeLayer(l): not in mlp_only_layers and (l + 1) % decoder_sparse_step == 0, as in
  // Hugging Face's Qwen3MoeDecoderLayer; the other layers keep the dense MLP of
  // intermediate_size. No shared expert.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;  // top-k
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;  // renormalize the top-k routing weights to sum to 1
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;

  bool IsMoe() const { return num_experts > 0; }
  bool IsMoeLayer(int64_t layer) const {
    if (num_experts <= 0 || decoder_sparse_step <= 0) return false;
    for (int64_t d : mlp_only_layers) {
      if (d == layer) return false;
    }
    return (layer + 1) % decoder_sparse_step == 0;
  }
  // The sparse layers in order (the `layers` axis of routed-experts exports).
  std::vector<int64_t> MoeLayers() const {
    std::vector<int64_t> out;
    for (int64_t l = 0; l < num_hidden_layers; ++l) {
      if (IsMoeLayer(l)) out.push_back(l);
    }
    return out;
  }
  std::string torch_dtype;  // "float32", "bfloat16", "float16" as stored
  std::vector<int32_t> eos_token_ids;
  int32_t bos_token_id = -1;  // -1: none
};

// Parses the text of a config.json. Errors name the missing or invalid field.
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text);
// Reads DIR/config.json (and DIR/generation_config.json for extra eos ids when present).
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir);
// Serializes back to Hugging Face config.json text.
std::string ModelConfigToJson(const ModelConfig& config);

}  // namespace rl::model_io
