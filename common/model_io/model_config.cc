#include "common/model_io/model_config.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/model_io/file_read.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace rl::model_io {

namespace {

using Json = nlohmann::json;

absl::Status FieldError(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: field '", field, "' ", what));
}

absl::StatusOr<int64_t> GetInt(const Json& j, absl::string_view field, bool required,
                               int64_t fallback, int64_t min_value) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) {
    if (required) return FieldError(field, "is missing");
    return fallback;
  }
  if (!it->is_number_integer()) {
    // Some configs store integral values as floats (e.g. 8192.0).
    if (it->is_number_float()) {
      double v = it->get<double>();
      if (v == static_cast<double>(static_cast<int64_t>(v)) &&
          v >= static_cast<double>(min_value)) {
        return static_cast<int64_t>(v);
      }
    }
    return FieldError(field, "must be an integer");
  }
  int64_t v = it->get<int64_t>();
  if (v < min_value) return FieldError(field, absl::StrCat("must be >= ", min_value));
  return v;
}

absl::StatusOr<double> GetDouble(const Json& j, absl::string_view field, double fallback,
                                 bool positive) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number()) return FieldError(field, "must be a number");
  double v = it->get<double>();
  if (positive && !(v > 0)) return FieldError(field, "must be positive");
  return v;
}

absl::StatusOr<bool> GetBool(const Json& j, absl::string_view field, bool fallback) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return FieldError(field, "must be true or false");
  return it->get<bool>();
}

// eos_token_id: an int or a list of ints. Appends to `out` without duplicates.
absl::Status AppendEosIds(const Json& j, absl::string_view field, std::vector<int32_t>* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  auto add = [&](const Json& v) -> absl::Status {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX) {
      return FieldError(field, "must be a non-negative integer or a list of them");
    }
    int32_t id = static_cast<int32_t>(v.get<int64_t>());
    for (int32_t e : *out) {
      if (e == id) return absl::OkStatus();
    }
    out->push_back(id);
    return absl::OkStatus();
  };
  if (it->is_array()) {
    for (const Json& v : *it) RETURN_IF_ERROR(add(v));
    return absl::OkStatus();
  }
  return add(*it);
}

absl::StatusOr<RopeScaling> ParseRopeScaling(const Json& j, int64_t max_pos) {
  RopeScaling rs;
  auto it = j.find("rope_scaling");
  if (it == j.end() || it->is_null()) return rs;
  if (!it->is_object()) return FieldError("rope_scaling", "must be an object or null");
  const Json& r = *it;
  std::string type;
  for (const char* key : {"rope_type", "type"}) {
    auto t = r.find(key);
    if (t != r.end() && t->is_string()) {
      type = t->get<std::string>();
      break;
    }
  }
  if (type.empty()) return FieldError("rope_scaling.rope_type", "is missing");
  if (type == "default") return rs;
  if (type == "linear") {
    rs.type = RopeScaling::Type::kLinear;
  } else if (type == "dynamic") {
    rs.type = RopeScaling::Type::kDynamic;
  } else if (type == "llama3") {
    rs.type = RopeScaling::Type::kLlama3;
  } else {
    return FieldError(
        "rope_scaling.rope_type",
        absl::StrCat("has unsupported value '", type, "' (supported: linear, dynamic, llama3)"));
  }
  auto f = r.find("factor");
  if (f == r.end() || !f->is_number() || !(f->get<double>() > 0)) {
    return FieldError("rope_scaling.factor", "must be a positive number");
  }
  rs.factor = f->get<double>();
  if (rs.type == RopeScaling::Type::kLlama3) {
    for (auto [key, dst] : {std::pair<const char*, double*>{"low_freq_factor", &rs.low_freq_factor},
                            {"high_freq_factor", &rs.high_freq_factor}}) {
      auto v = r.find(key);
      if (v == r.end() || !v->is_number() || !(v->get<double>() > 0)) {
        return FieldError(absl::StrCat("rope_scaling.", key), "must be a positive number");
      }
      *dst = v->get<double>();
    }
    if (rs.high_freq_factor <= rs.low_freq_factor) {
      return FieldError("rope_scaling.high_freq_factor", "must exceed low_freq_factor");
    }
  }
  auto o = r.find("original_max_position_embeddings");
  if (o != r.end() && !o->is_null()) {
    if (!o->is_number_integer() || o->get<int64_t>() <= 0) {
      return FieldError("rope_scaling.original_max_position_embeddings",
                        "must be a positive integer");
    }
    rs.original_max_position_embeddings = o->get<int64_t>();
  } else if (rs.type == RopeScaling::Type::kLlama3) {
    return FieldError("rope_scaling.original_max_position_embeddings", "is missing");
  } else {
    rs.original_max_position_embeddings = max_pos;
  }
  return rs;
}

// Qwen3-MoE's fields, with Hugging Face's Qwen3MoeConfig defaults for the optional ones.
absl::Status ParseMoe(const Json& j, ModelConfig* c) {
  ASSIGN_OR_RETURN(c->num_experts, GetInt(j, "num_experts", true, 0, 1));
  if (c->num_experts > kMaxExperts) {
    return FieldError("num_experts", absl::StrCat("must be <= ", kMaxExperts));
  }
  ASSIGN_OR_RETURN(c->num_experts_per_tok, GetInt(j, "num_experts_per_tok", true, 0, 1));
  if (c->num_experts_per_tok > c->num_experts) {
    return FieldError("num_experts_per_tok", "must not exceed num_experts");
  }
  ASSIGN_OR_RETURN(c->moe_intermediate_size, GetInt(j, "moe_intermediate_size", true, 0, 1));
  ASSIGN_OR_RETURN(c->norm_topk_prob, GetBool(j, "norm_topk_prob", false));
  ASSIGN_OR_RETURN(c->decoder_sparse_step, GetInt(j, "decoder_sparse_step", false, 1, 1));
  c->mlp_only_layers.clear();
  if (auto it = j.find("mlp_only_layers"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || it->size() > static_cast<size_t>(c->num_hidden_layers)) {
      return FieldError("mlp_only_layers", "must be a list of at most num_hidden_layers indices");
    }
    for (const Json& v : *it) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
          v.get<int64_t>() >= c->num_hidden_layers) {
        return FieldError("mlp_only_layers", "must hold layer indices in [0, num_hidden_layers)");
      }
      c->mlp_only_layers.push_back(v.get<int64_t>());
    }
  }
  if (auto s = j.find("shared_expert_intermediate_size");
      s != j.end() && s->is_number_integer() && s->get<int64_t>() > 0) {
    return FieldError("shared_expert_intermediate_size", "> 0 is not supported (no shared expert)");
  }
  return absl::OkStatus();
}

// Bounded read of a regular file (a FIFO or a folder is an error, never a hang), JSON depth
// checked before the parser sees it.
absl::StatusOr<std::string> ReadFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path));
  RETURN_IF_ERROR(CheckJsonDepth(text, kMaxJsonDepth, path));
  return text;
}

}  // namespace

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text) {
  RETURN_IF_ERROR(CheckJsonDepth(json_text, kMaxJsonDepth, "config.json"));
  Json j = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError("config.json: not valid JSON");
  if (!j.is_object()) return absl::InvalidArgumentError("config.json: not a JSON object");
  ModelConfig c;
  auto archs = j.find("architectures");
  if (archs == j.end() || !archs->is_array() || archs->empty() || !(*archs)[0].is_string()) {
    return FieldError("architectures", "must be a non-empty list of names");
  }
  c.architecture_name = (*archs)[0].get<std::string>();
  if (c.architecture_name == "LlamaForCausalLM") {
    c.arch = Arch::kLlama;
  } else if (c.architecture_name == "Qwen2ForCausalLM") {
    c.arch = Arch::kQwen2;
  } else if (c.architecture_name == "Qwen3ForCausalLM") {
    c.arch = Arch::kQwen3;
  } else if (c.architecture_name == "Qwen3MoeForCausalLM") {
    c.arch = Arch::kQwen3Moe;
  } else {
    return FieldError("architectures",
                      absl::StrCat("has unsupported value '", c.architecture_name,
                                   "' (supported: LlamaForCausalLM, Qwen2ForCausalLM, "
                                   "Qwen3ForCausalLM, Qwen3MoeForCausalLM)"));
  }
  if (auto mt = j.find("model_type"); mt != j.end() && mt->is_string()) {
    c.model_type = mt->get<std::string>();
  }
  ASSIGN_OR_RETURN(c.vocab_size, GetInt(j, "vocab_size", true, 0, 1));
  ASSIGN_OR_RETURN(c.hidden_size, GetInt(j, "hidden_size", true, 0, 1));
  ASSIGN_OR_RETURN(c.intermediate_size, GetInt(j, "intermediate_size", true, 0, 1));
  ASSIGN_OR_RETURN(c.num_hidden_layers, GetInt(j, "num_hidden_layers", true, 0, 1));
  ASSIGN_OR_RETURN(c.num_attention_heads, GetInt(j, "num_attention_heads", true, 0, 1));
  ASSIGN_OR_RETURN(c.num_key_value_heads,
                   GetInt(j, "num_key_value_heads", false, c.num_attention_heads, 1));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return FieldError("num_key_value_heads", "must divide num_attention_heads");
  }
  int64_t default_head_dim = c.hidden_size / c.num_attention_heads;
  ASSIGN_OR_RETURN(c.head_dim, GetInt(j, "head_dim", false, default_head_dim, 1));
  if (c.head_dim % 2 != 0) return FieldError("head_dim", "must be even (RoPE pairs)");
  if (j.find("head_dim") == j.end() && c.hidden_size % c.num_attention_heads != 0) {
    return FieldError("hidden_size", "must be divisible by num_attention_heads");
  }
  ASSIGN_OR_RETURN(c.max_position_embeddings, GetInt(j, "max_position_embeddings", true, 0, 1));
  ASSIGN_OR_RETURN(c.rms_norm_eps, GetDouble(j, "rms_norm_eps", 1e-6, true));
  ASSIGN_OR_RETURN(c.rope_theta, GetDouble(j, "rope_theta", 10000.0, true));
  ASSIGN_OR_RETURN(c.rope_scaling, ParseRopeScaling(j, c.max_position_embeddings));
  ASSIGN_OR_RETURN(c.tie_word_embeddings, GetBool(j, "tie_word_embeddings", false));
  ASSIGN_OR_RETURN(c.attention_bias, GetBool(j, "attention_bias", c.arch == Arch::kQwen2));
  if (c.arch == Arch::kQwen2) c.attention_bias = true;  // Qwen2 always has q/k/v bias
  c.qk_norm = c.arch == Arch::kQwen3 || c.arch == Arch::kQwen3Moe;
  if (c.arch == Arch::kQwen3Moe) RETURN_IF_ERROR(ParseMoe(j, &c));
  if (auto act = j.find("hidden_act"); act != j.end() && !act->is_null()) {
    if (!act->is_string() || act->get<std::string>() != "silu") {
      return FieldError("hidden_act", "must be \"silu\"");
    }
  }
  if (auto mb = j.find("mlp_bias"); mb != j.end() && mb->is_boolean() && mb->get<bool>()) {
    return FieldError("mlp_bias", "true is not supported");
  }
  if (auto td = j.find("torch_dtype"); td != j.end() && td->is_string()) {
    c.torch_dtype = td->get<std::string>();
  } else if (auto dt = j.find("dtype"); dt != j.end() && dt->is_string()) {
    c.torch_dtype = dt->get<std::string>();
  }
  RETURN_IF_ERROR(AppendEosIds(j, "eos_token_id", &c.eos_token_ids));
  if (auto b = j.find("bos_token_id"); b != j.end() && !b->is_null()) {
    if (!b->is_number_integer() || b->get<int64_t>() < 0 || b->get<int64_t>() > INT32_MAX) {
      return FieldError("bos_token_id", "must be a non-negative integer");
    }
    c.bos_token_id = static_cast<int32_t>(b->get<int64_t>());
  }
  return c;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  namespace fs = std::filesystem;
  ASSIGN_OR_RETURN(std::string text, ReadFile((fs::path(model_dir) / "config.json").string()));
  absl::StatusOr<ModelConfig> config = ParseModelConfig(text);
  if (!config.ok()) return Annotate(config.status(), model_dir);
  const fs::path gen = fs::path(model_dir) / "generation_config.json";
  std::error_code ec;
  if (fs::exists(gen, ec)) {
    ASSIGN_OR_RETURN(std::string gen_text, ReadFile(gen.string()));
    Json g = Json::parse(gen_text, nullptr, /*allow_exceptions=*/false);
    if (g.is_discarded() || !g.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(gen.string(), ": not a JSON object"));
    }
    absl::Status s = AppendEosIds(g, "eos_token_id", &config->eos_token_ids);
    if (!s.ok()) return Annotate(s, gen.string());
  }
  return config;
}

std::string ModelConfigToJson(const ModelConfig& c) {
  Json j = Json::object();
  j["architectures"] = {c.architecture_name};
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  const RopeScaling& rs = c.rope_scaling;
  switch (rs.type) {
    case RopeScaling::Type::kNone:
      j["rope_scaling"] = nullptr;
      break;
    case RopeScaling::Type::kLinear:
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", rs.factor}};
      break;
    case RopeScaling::Type::kDynamic:
      j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", rs.factor}};
      if (rs.original_max_position_embeddings > 0) {
        j["rope_scaling"]["original_max_position_embeddings"] = rs.original_max_position_embeddings;
      }
      break;
    case RopeScaling::Type::kLlama3:
      j["rope_scaling"] = {
          {"rope_type", "llama3"},
          {"factor", rs.factor},
          {"low_freq_factor", rs.low_freq_factor},
          {"high_freq_factor", rs.high_freq_factor},
          {"original_max_position_embeddings", rs.original_max_position_embeddings}};
      break;
  }
  if (c.arch == Arch::kQwen3Moe) {
    j["num_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["decoder_sparse_step"] = c.decoder_sparse_step;
    j["mlp_only_layers"] = c.mlp_only_layers;
    j["output_router_logits"] = false;
    j["router_aux_loss_coef"] = 0.001;
  }
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.arch != Arch::kQwen2) j["attention_bias"] = c.attention_bias;
  j["attention_dropout"] = 0.0;
  if (c.arch == Arch::kLlama) j["mlp_bias"] = false;
  if (!c.torch_dtype.empty()) j["torch_dtype"] = c.torch_dtype;
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_ids.size() == 1) {
    j["eos_token_id"] = c.eos_token_ids[0];
  } else if (!c.eos_token_ids.empty()) {
    j["eos_token_id"] = c.eos_token_ids;
  }
  j["use_cache"] = true;
  return j.dump(2) + "\n";
}

}  // namespace rl::model_io
