#include "common/model_io/model_config.h"

#include <cstdlib>
#include <string>
#include <tuple>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_data.h"

namespace rl::model_io {
namespace {

using ::testing::HasSubstr;

const char kQwen3[] = R"({
  "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
  "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
  "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
  "max_position_embeddings": 40960, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
  "rope_scaling": null, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "attention_bias": false, "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu"
})";

TEST(ModelConfigTest, ParsesStories260K) {
  auto c = LoadModelConfig(rl::testing::Stories());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, Arch::kLlama);
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->intermediate_size, 172);
  EXPECT_EQ(c->num_hidden_layers, 5);
  EXPECT_EQ(c->num_attention_heads, 8);
  EXPECT_EQ(c->num_key_value_heads, 4);
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_EQ(c->vocab_size, 512);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{2}));
  EXPECT_EQ(c->torch_dtype, "float32");
}

TEST(ModelConfigTest, ParsesQwen3AndRoundTrips) {
  auto c = ParseModelConfig(kQwen3);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, Arch::kQwen3);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->head_dim, 128);
  auto again = ParseModelConfig(ModelConfigToJson(*c));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->head_dim, 128);
  EXPECT_EQ(again->eos_token_ids, c->eos_token_ids);
  EXPECT_EQ(again->bos_token_id, c->bos_token_id);
  EXPECT_EQ(again->vocab_size, c->vocab_size);
}

// Qwen3-30B-A3B's config.json (MoE fields as published).
const char kQwen3Moe[] = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 151936,
  "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48,
  "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
  "max_position_embeddings": 40960, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
  "rope_scaling": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "attention_bias": false, "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu",
  "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
  "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [],
  "output_router_logits": false, "router_aux_loss_coef": 0.001
})";

TEST(ModelConfigTest, ParsesQwen3MoeAndRoundTrips) {
  auto c = ParseModelConfig(kQwen3Moe);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, Arch::kQwen3Moe);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_TRUE(c->IsMoe());
  EXPECT_EQ(c->num_experts, 128);
  EXPECT_EQ(c->num_experts_per_tok, 8);
  EXPECT_EQ(c->moe_intermediate_size, 768);
  EXPECT_TRUE(c->norm_topk_prob);
  EXPECT_EQ(c->MoeLayers().size(), 48u);
  auto again = ParseModelConfig(ModelConfigToJson(*c));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->MoeLayers(), c->MoeLayers());
  EXPECT_EQ(again->num_experts_per_tok, 8);

  // decoder_sparse_step and mlp_only_layers pick the sparse layers as Hugging Face does.
  std::string j = kQwen3Moe;
  j.replace(j.find("\"decoder_sparse_step\": 1"), 24, "\"decoder_sparse_step\": 2");
  j.replace(j.find("\"mlp_only_layers\": []"), 21, "\"mlp_only_layers\": [3]");
  auto sparse = ParseModelConfig(j);
  ASSERT_TRUE(sparse.ok()) << sparse.status();
  EXPECT_FALSE(sparse->IsMoeLayer(0));
  EXPECT_TRUE(sparse->IsMoeLayer(1));
  EXPECT_FALSE(sparse->IsMoeLayer(3));
  EXPECT_TRUE(sparse->IsMoeLayer(5));
  EXPECT_EQ(sparse->MoeLayers().size(), 23u);
}

TEST(ModelConfigTest, Qwen3MoeFieldsAreBounded) {
  for (auto [from, to, field] :
       {std::tuple{"\"num_experts_per_tok\": 8", "\"num_experts_per_tok\": 129",
                   "num_experts_per_tok"},
        {"\"num_experts\": 128", "\"num_experts\": 100000", "num_experts"},
        {"\"num_experts\": 128", "\"num_experts\": 0", "num_experts"},
        {"\"mlp_only_layers\": []", "\"mlp_only_layers\": [48]", "mlp_only_layers"},
        {"\"decoder_sparse_step\": 1", "\"decoder_sparse_step\": 0", "decoder_sparse_step"},
        {"\"moe_intermediate_size\": 768,", "", "moe_intermediate_size"}}) {
    std::string j = kQwen3Moe;
    j.replace(j.find(from), std::string(from).size(), to);
    auto c = ParseModelConfig(j);
    ASSERT_FALSE(c.ok()) << field;
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(field));
  }
}

TEST(ModelConfigTest, Qwen2HasBiasAndDefaultHeadDim) {
  auto c = ParseModelConfig(R"({"architectures": ["Qwen2ForCausalLM"], "vocab_size": 100,
      "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
      "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 32768,
      "eos_token_id": [151643, 151645]})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->attention_bias);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{151643, 151645}));
}

TEST(ModelConfigTest, RopeScalingTypes) {
  const std::string base = R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 10,
      "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
      "num_attention_heads": 2, "max_position_embeddings": 128, "rope_scaling": )";
  auto llama3 = ParseModelConfig(base + R"({"rope_type": "llama3", "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}})");
  ASSERT_TRUE(llama3.ok()) << llama3.status();
  EXPECT_EQ(llama3->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(llama3->rope_scaling.original_max_position_embeddings, 8192);
  auto linear = ParseModelConfig(base + R"({"type": "linear", "factor": 2.0}})");
  ASSERT_TRUE(linear.ok()) << linear.status();
  EXPECT_EQ(linear->rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_DOUBLE_EQ(linear->rope_scaling.factor, 2.0);
  auto dynamic = ParseModelConfig(base + R"({"rope_type": "dynamic", "factor": 4.0}})");
  ASSERT_TRUE(dynamic.ok()) << dynamic.status();
  EXPECT_EQ(dynamic->rope_scaling.type, RopeScaling::Type::kDynamic);
  EXPECT_EQ(dynamic->rope_scaling.original_max_position_embeddings, 128);

  auto yarn = ParseModelConfig(base + R"({"rope_type": "yarn", "factor": 4.0}})");
  ASSERT_FALSE(yarn.ok());
  EXPECT_THAT(std::string(yarn.status().message()), HasSubstr("rope_scaling.rope_type"));
  auto no_factor = ParseModelConfig(base + R"({"rope_type": "linear"}})");
  ASSERT_FALSE(no_factor.ok());
  EXPECT_THAT(std::string(no_factor.status().message()), HasSubstr("rope_scaling.factor"));
  auto llama3_missing = ParseModelConfig(base + R"({"rope_type": "llama3", "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0}})");
  ASSERT_FALSE(llama3_missing.ok());
  EXPECT_THAT(std::string(llama3_missing.status().message()),
              HasSubstr("original_max_position_embeddings"));
}

TEST(ModelConfigTest, ErrorsNameTheField) {
  struct Case {
    const char* json;
    const char* field;
  };
  const Case cases[] = {
      {"{", "valid JSON"},
      {"[]", "JSON object"},
      {R"({"vocab_size": 1})", "architectures"},
      {R"({"architectures": ["GPT2LMHeadModel"]})", "GPT2LMHeadModel"},
      {R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 8})", "vocab_size"},
      {R"({"architectures": ["LlamaForCausalLM"], "vocab_size": "x"})", "vocab_size"},
      {R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 10, "hidden_size": 8,
           "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 3,
           "num_key_value_heads": 2, "max_position_embeddings": 16})",
       "num_key_value_heads"},
      {R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 10, "hidden_size": 8,
           "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
           "max_position_embeddings": 16, "eos_token_id": "x"})",
       "eos_token_id"},
      {R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 10, "hidden_size": 8,
           "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
           "max_position_embeddings": 16, "rms_norm_eps": -1})",
       "rms_norm_eps"},
      {R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 10, "hidden_size": 8,
           "intermediate_size": 16, "num_hidden_layers": 0, "num_attention_heads": 2,
           "max_position_embeddings": 16})",
       "num_hidden_layers"},
  };
  for (const Case& c : cases) {
    auto parsed = ParseModelConfig(c.json);
    ASSERT_FALSE(parsed.ok()) << c.json;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(c.field)) << c.json;
  }
}

}  // namespace
}  // namespace rl::model_io
