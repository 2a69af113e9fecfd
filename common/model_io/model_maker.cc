#include "common/model_io/model_maker.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model_io/dtype.h"
#include "common/model_io/safetensors.h"
#include "common/model_io/tokenizer_maker.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace rl::model_io {

namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t HashName(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Approximately N(0, 1) from element index `i` of stream `key`: the Irwin–Hall sum of four
// 16-bit uniforms, centred and scaled to unit variance. Integer math up to one exact float
// conversion, so identical everywhere.
inline float NormalAt(uint64_t key, uint64_t i) {
  const uint64_t r = SplitMix64(key ^ (i * 0xd1342543de82ef95ull));
  const int32_t sum = static_cast<int32_t>(r & 0xffff) + static_cast<int32_t>((r >> 16) & 0xffff) +
                      static_cast<int32_t>((r >> 32) & 0xffff) + static_cast<int32_t>(r >> 48);
  // Sum of 4 U{0..65535}: mean 131070, variance 4 * (65536^2 - 1) / 12.
  constexpr float kInvStd = 1.0f / 37837.2269f;
  return static_cast<float>(sum - 131070) * kInvStd;
}

struct InitRule {
  float mean = 0.0f;
  float std = 0.0f;
};

struct SizeShape {
  int64_t vocab, hidden, intermediate, layers, heads, kv_heads, head_dim, max_pos;
};

absl::StatusOr<SizeShape> ShapeFor(const std::string& arch, const std::string& size) {
  if (arch == "qwen3_moe") {
    // Three layers with the middle one dense (mlp_only_layers) so both MLP kinds are covered.
    if (size == "tiny") return SizeShape{512, 64, 176, 3, 4, 2, 32, 1024};
    // ~0.97B parameters, ~0.23B active per token: a Qwen3-30B-A3B scaled down.
    if (size == "1b") return SizeShape{32768, 1024, 3072, 16, 16, 8, 128, 40960};
    return absl::InvalidArgumentError(
        absl::StrCat("make-model: unknown size '", size, "' for qwen3_moe (tiny, 1b)"));
  }
  if (size == "tiny") {
    // Qwen3's head_dim differs from hidden / heads on purpose (as in the real models).
    return SizeShape{512, 64, 176, 2, 4, 2, arch == "qwen3" ? 32 : 16, 1024};
  }
  if (size == "0.5b") return SizeShape{32768, 1024, 3072, 28, 16, 8, 128, 40960};  // Qwen3-0.6B
  if (size == "1b") return SizeShape{32768, 2048, 8192, 16, 32, 8, 64, 131072};    // Llama-3.2-1B
  if (size == "8b") return SizeShape{128256, 4096, 14336, 32, 32, 8, 128, 8192};   // Llama-3-8B
  return absl::InvalidArgumentError(
      absl::StrCat("make-model: unknown size '", size, "' (tiny, 0.5b, 1b, 8b)"));
}

absl::StatusOr<DType> DTypeFromTorch(const std::string& name) {
  if (name == "float32") return DType::kF32;
  if (name == "bfloat16") return DType::kBF16;
  if (name == "float16") return DType::kF16;
  return absl::InvalidArgumentError(
      absl::StrCat("make-model: unknown dtype '", name, "' (float32, bfloat16, float16)"));
}

// Chat templates in Hugging Face's jinja form (tokenizer_config.json `chat_template`): ChatML as
// Qwen's models use it (no default system message, like Qwen3 without its thinking parts), and
// Llama-3's header format. The Llama template leaves BOS out because the made tokenizer's
// post-processor prepends it when the text is encoded with special tokens.
constexpr const char kChatMlTemplate[] =
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}";
constexpr const char kLlama3Template[] =
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + "
    "message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}";

// Special tokens by arch: the first three are (Llama) BOS, EOS, end of turn / (Qwen) end of
// text, turn start, turn end; the rest are what the chat template needs.
TokenizerSpec TokenizerSpecFor(Arch arch, int64_t vocab_size) {
  TokenizerSpec spec;
  spec.vocab_size = static_cast<int32_t>(vocab_size);
  if (arch == Arch::kLlama) {
    spec.special_tokens = {"<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>",
                           "<|start_header_id|>", "<|end_header_id|>"};
    spec.bos_special_index = 0;
  } else {
    spec.special_tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  }
  return spec;
}

absl::Status WriteText(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path.string()));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> MakeModelConfig(const std::string& arch, const std::string& size,
                                            const std::string& dtype) {
  ASSIGN_OR_RETURN(SizeShape s, ShapeFor(arch, size));
  ModelConfig c;
  if (arch == "llama") {
    c.arch = Arch::kLlama;
    c.architecture_name = "LlamaForCausalLM";
    c.model_type = "llama";
    c.rope_theta = 500000.0;
    c.rope_scaling.type = RopeScaling::Type::kLlama3;
    c.rope_scaling.factor = 8.0;
    c.rope_scaling.low_freq_factor = 1.0;
    c.rope_scaling.high_freq_factor = 4.0;
    c.rope_scaling.original_max_position_embeddings = size == "tiny" ? 256 : 8192;
    c.rms_norm_eps = 1e-5;
    c.tie_word_embeddings = size == "1b";
  } else if (arch == "qwen2") {
    c.arch = Arch::kQwen2;
    c.architecture_name = "Qwen2ForCausalLM";
    c.model_type = "qwen2";
    c.rope_theta = 1000000.0;
    c.rms_norm_eps = 1e-6;
    c.attention_bias = true;
    c.tie_word_embeddings = true;
  } else if (arch == "qwen3") {
    c.arch = Arch::kQwen3;
    c.architecture_name = "Qwen3ForCausalLM";
    c.model_type = "qwen3";
    c.rope_theta = 1000000.0;
    c.rms_norm_eps = 1e-6;
    c.qk_norm = true;
    c.tie_word_embeddings = true;
  } else if (arch == "qwen3_moe") {
    c.arch = Arch::kQwen3Moe;
    c.architecture_name = "Qwen3MoeForCausalLM";
    c.model_type = "qwen3_moe";
    c.rope_theta = 1000000.0;
    c.rms_norm_eps = 1e-6;
    c.qk_norm = true;
    c.tie_word_embeddings = size == "tiny";
    c.norm_topk_prob = true;
    c.decoder_sparse_step = 1;
    if (size == "tiny") {
      c.num_experts = 16;
      c.num_experts_per_tok = 4;
      c.moe_intermediate_size = 48;
      c.mlp_only_layers = {1};
    } else {
      c.num_experts = 32;
      c.num_experts_per_tok = 4;
      c.moe_intermediate_size = 512;
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("make-model: unknown arch '", arch, "' (llama, qwen2, qwen3, qwen3_moe)"));
  }
  c.vocab_size = s.vocab;
  c.hidden_size = s.hidden;
  c.intermediate_size = s.intermediate;
  c.num_hidden_layers = s.layers;
  c.num_attention_heads = s.heads;
  c.num_key_value_heads = s.kv_heads;
  c.head_dim = s.head_dim;
  c.max_position_embeddings = s.max_pos;
  c.torch_dtype = dtype.empty() ? (size == "tiny" ? "float32" : "bfloat16") : dtype;
  RETURN_IF_ERROR(DTypeFromTorch(c.torch_dtype).status());
  ASSIGN_OR_RETURN(const MadeTokenizer tok,
                   MakeByteLevelBpeTokenizer(TokenizerSpecFor(c.arch, c.vocab_size)));
  if (c.arch == Arch::kLlama) {
    c.bos_token_id = tok.special_ids[0];
    c.eos_token_ids = {tok.special_ids[1]};
  } else {
    c.eos_token_ids = {tok.special_ids[0], tok.special_ids[2]};
  }
  return c;
}

absl::Status MakeModel(const MakeModelOptions& options) {
  namespace fs = std::filesystem;
  if (options.out_dir.empty()) return absl::InvalidArgumentError("make-model: empty out dir");
  ASSIGN_OR_RETURN(ModelConfig c, MakeModelConfig(options.arch, options.size, options.dtype));
  ASSIGN_OR_RETURN(DType dtype, DTypeFromTorch(c.torch_dtype));
  const TokenizerSpec spec = TokenizerSpecFor(c.arch, c.vocab_size);
  ASSIGN_OR_RETURN(const MadeTokenizer tok, MakeByteLevelBpeTokenizer(spec));
  if (tok.vocab_size() != c.vocab_size) {
    return absl::InternalError("make-model: the tokenizer does not cover the model vocabulary");
  }

  std::error_code ec;
  fs::create_directories(options.out_dir, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot create ", options.out_dir, ": ", ec.message()));
  }
  const fs::path dir(options.out_dir);

  // Tensor list in Hugging Face names and the init rule of each.
  std::vector<TensorToWrite> specs;
  std::vector<InitRule> rules;
  const float h = static_cast<float>(c.hidden_size);
  auto add = [&](std::string name, std::vector<int64_t> shape, InitRule rule) {
    TensorToWrite t;
    t.name = std::move(name);
    t.dtype = dtype;
    t.shape = std::move(shape);
    specs.push_back(std::move(t));
    rules.push_back(rule);
  };
  const InitRule norm{1.0f, 0.1f};
  const InitRule bias{0.0f, 0.1f};
  const InitRule embed{0.0f, 2.0f / std::sqrt(h)};
  auto linear = [](int64_t fan_in) {
    return InitRule{0.0f, 1.0f / std::sqrt(static_cast<float>(fan_in))};
  };
  const int64_t q_dim = c.num_attention_heads * c.head_dim;
  const int64_t kv_dim = c.num_key_value_heads * c.head_dim;
  add("model.embed_tokens.weight", {c.vocab_size, c.hidden_size}, embed);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    add(p + "input_layernorm.weight", {c.hidden_size}, norm);
    add(p + "self_attn.q_proj.weight", {q_dim, c.hidden_size}, linear(c.hidden_size));
    add(p + "self_attn.k_proj.weight", {kv_dim, c.hidden_size}, linear(c.hidden_size));
    add(p + "self_attn.v_proj.weight", {kv_dim, c.hidden_size}, linear(c.hidden_size));
    if (c.attention_bias) {
      add(p + "self_attn.q_proj.bias", {q_dim}, bias);
      add(p + "self_attn.k_proj.bias", {kv_dim}, bias);
      add(p + "self_attn.v_proj.bias", {kv_dim}, bias);
    }
    if (c.qk_norm) {
      add(p + "self_attn.q_norm.weight", {c.head_dim}, norm);
      add(p + "self_attn.k_norm.weight", {c.head_dim}, norm);
    }
    add(p + "self_attn.o_proj.weight", {c.hidden_size, q_dim}, linear(q_dim));
    add(p + "post_attention_layernorm.weight", {c.hidden_size}, norm);
    if (c.IsMoeLayer(l)) {
      add(p + "mlp.gate.weight", {c.num_experts, c.hidden_size}, linear(c.hidden_size));
      const int64_t inter = c.moe_intermediate_size;
      for (int64_t e = 0; e < c.num_experts; ++e) {
        const std::string ep = absl::StrCat(p, "mlp.experts.", e, ".");
        add(ep + "gate_proj.weight", {inter, c.hidden_size}, linear(c.hidden_size));
        add(ep + "up_proj.weight", {inter, c.hidden_size}, linear(c.hidden_size));
        add(ep + "down_proj.weight", {c.hidden_size, inter}, linear(inter));
      }
      continue;
    }
    add(p + "mlp.gate_proj.weight", {c.intermediate_size, c.hidden_size}, linear(c.hidden_size));
    add(p + "mlp.up_proj.weight", {c.intermediate_size, c.hidden_size}, linear(c.hidden_size));
    add(p + "mlp.down_proj.weight", {c.hidden_size, c.intermediate_size},
        linear(c.intermediate_size));
  }
  add("model.norm.weight", {c.hidden_size}, norm);
  if (!c.tie_word_embeddings) add("lm_head.weight", {c.vocab_size, c.hidden_size}, embed);

  int num_threads = options.num_threads > 0
                        ? options.num_threads
                        : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const uint64_t seed_key = SplitMix64(options.seed);
  auto fill = [&](size_t index, absl::Span<uint8_t> out) -> absl::Status {
    const int64_t n = static_cast<int64_t>(out.size()) / DTypeSize(dtype);
    const uint64_t key = SplitMix64(seed_key ^ HashName(specs[index].name));
    const InitRule rule = rules[index];
    auto work = [&](int64_t begin, int64_t end) {
      float buf[1024];
      for (int64_t i = begin; i < end; i += 1024) {
        const int64_t m = std::min<int64_t>(1024, end - i);
        for (int64_t j = 0; j < m; ++j) {
          buf[j] = rule.mean + rule.std * NormalAt(key, static_cast<uint64_t>(i + j));
        }
        ConvertFromF32(buf, m, dtype, out.data() + i * DTypeSize(dtype));
      }
    };
    const int64_t parts = n >= (int64_t{1} << 20) ? num_threads : 1;
    std::vector<std::thread> threads;
    for (int64_t t = 1; t < parts; ++t) {
      threads.emplace_back(work, n * t / parts, n * (t + 1) / parts);
    }
    work(0, n / parts);
    for (auto& th : threads) th.join();
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(WriteCheckpoint(options.out_dir, specs, fill, options.max_shard_bytes));

  RETURN_IF_ERROR(WriteText(dir / "config.json", ModelConfigToJson(c)));
  nlohmann::json gen = {{"_from_model_config", true}};
  if (c.bos_token_id >= 0) gen["bos_token_id"] = c.bos_token_id;
  if (c.arch == Arch::kLlama) {
    gen["eos_token_id"] = {tok.special_ids[1], tok.special_ids[2]};  // end_of_text, eot_id
  } else {
    gen["eos_token_id"] = c.eos_token_ids;
  }
  RETURN_IF_ERROR(WriteText(dir / "generation_config.json", gen.dump(2) + "\n"));
  RETURN_IF_ERROR(WriteText(dir / "tokenizer.json", tok.json));
  const bool llama = c.arch == Arch::kLlama;
  nlohmann::json tok_config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                               {"model_max_length", c.max_position_embeddings},
                               {"eos_token", spec.special_tokens[llama ? 1 : 0]},
                               {"chat_template", llama ? kLlama3Template : kChatMlTemplate}};
  if (spec.bos_special_index >= 0) {
    tok_config["bos_token"] = spec.special_tokens[spec.bos_special_index];
  }
  RETURN_IF_ERROR(WriteText(dir / "tokenizer_config.json", tok_config.dump(2) + "\n"));
  return absl::OkStatus();
}

}  // namespace rl::model_io
