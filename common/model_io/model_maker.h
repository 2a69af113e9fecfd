// Test-model maker: writes a complete Hugging Face model folder (config.json,
// generation_config.json, safetensors weights, tokenizer.json, tokenizer_config.json) with
// seeded random weights for Llama / Qwen2 / Qwen3 / Qwen3-MoE at a few sizes.
//
// Determinism: the weights are a pure function of (arch, size, seed, dtype): every tensor draws
// from its own counter-based stream keyed by the seed and the tensor's name, using integer
// arithmetic only, so the bytes are the same on every machine and thread count. Tests rely on
// this to re-create the checkpoints Hugging Face fixtures were computed from.
//
// Scale: linear layers ~ N(0, 1/fan_in), embeddings and an untied LM head ~ N(0, 4/hidden),
// RMSNorm weights 1 + N(0, 0.01), biases N(0, 0.01): activations stay O(1) and logits have a
// spread of a few units, so greedy decoding has clear margins.
// Cost: tiny ≈ 150K params (milliseconds); 0.5b ≈ 0.47B params (~1 GB bf16, tens of seconds);
// 8b is only for benchmarks that ask for it (16 GB); qwen3_moe 1b ≈ 0.97B params, ~0.23B active
// per token (32 experts, top-4).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model_io/model_config.h"

namespace rl::model_io {

struct MakeModelOptions {
  std::string arch = "qwen3";  // llama | qwen2 | qwen3 | qwen3_moe
  std::string size = "tiny";   // tiny | 0.5b | 1b | 8b (qwen3_moe: tiny | 1b)
  uint64_t seed = 0;
  // "float32" | "bfloat16" | "float16"; empty: float32 for tiny, bfloat16 otherwise.
  std::string dtype;
  std::string out_dir;
  // Checkpoints larger than this are written as shards with model.safetensors.index.json
  // (0: never shard).
  int64_t max_shard_bytes = int64_t{2} << 30;
  // Worker threads used to generate weights (0: hardware concurrency). Does not change bytes.
  int num_threads = 0;
};

// The config.json the maker writes for `arch` and `size` (dtype as given, or the default).
absl::StatusOr<ModelConfig> MakeModelConfig(const std::string& arch, const std::string& size,
                                            const std::string& dtype = "");

// Writes the model folder; creates `out_dir` when needed and overwrites files in it.
absl::Status MakeModel(const MakeModelOptions& options);

}  // namespace rl::model_io
