#include "common/model_io/model_maker.h"

#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/model_io/safetensors.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/test_data.h"

namespace rl::model_io {
namespace {

std::string TempDir(const std::string& name) {
  return rl::testing::ProcessTempDir("model_maker_test_" + name);
}

class MakeModelTest : public ::testing::TestWithParam<std::string> {};

TEST_P(MakeModelTest, TinyModelLoadsAndIsDeterministic) {
  const std::string arch = GetParam();
  const std::string dir = TempDir(arch);
  MakeModelOptions opts;
  opts.arch = arch;
  opts.size = "tiny";
  opts.seed = 7;
  opts.out_dir = dir;
  ASSERT_TRUE(MakeModel(opts).ok());

  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model_type, arch);
  EXPECT_EQ(config->qk_norm, arch == "qwen3");
  EXPECT_EQ(config->attention_bias, arch == "qwen2");
  if (arch == "llama") {
    EXPECT_EQ(config->rope_scaling.type, RopeScaling::Type::kLlama3);
    EXPECT_EQ(config->eos_token_ids.size(), 2u);  // config + generation_config
    EXPECT_GE(config->bos_token_id, 0);
  }
  auto ckpt = OpenCheckpoint(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const TensorView* embed = ckpt->Find("model.embed_tokens.weight");
  ASSERT_NE(embed, nullptr);
  EXPECT_EQ(embed->shape, (std::vector<int64_t>{config->vocab_size, config->hidden_size}));
  EXPECT_EQ(embed->dtype, DType::kF32);
  EXPECT_EQ(ckpt->Find("lm_head.weight") == nullptr, config->tie_word_embeddings);
  EXPECT_EQ(ckpt->Find("model.layers.0.self_attn.q_norm.weight") != nullptr, arch == "qwen3");
  EXPECT_EQ(ckpt->Find("model.layers.1.self_attn.k_proj.bias") != nullptr, arch == "qwen2");

  // Norm weights near 1, projections zero-mean with a non-degenerate spread.
  const TensorView* norm = ckpt->Find("model.norm.weight");
  const float* nw = reinterpret_cast<const float*>(norm->data.data());
  double mean = 0;
  for (int64_t i = 0; i < norm->NumElements(); ++i) mean += nw[i];
  mean /= static_cast<double>(norm->NumElements());
  EXPECT_NEAR(mean, 1.0, 0.1);
  const TensorView* q = ckpt->Find("model.layers.0.self_attn.q_proj.weight");
  const float* qw = reinterpret_cast<const float*>(q->data.data());
  double sq = 0;
  for (int64_t i = 0; i < q->NumElements(); ++i) sq += qw[i] * qw[i];
  const double std = std::sqrt(sq / static_cast<double>(q->NumElements()));
  EXPECT_NEAR(std, 1.0 / std::sqrt(static_cast<double>(config->hidden_size)), 0.02);

  // tokenizer.json: valid JSON, byte-level BPE within the model vocabulary.
  auto tok = nlohmann::json::parse(rl::testing::ReadFile(dir + "/tokenizer.json"), nullptr, false);
  ASSERT_FALSE(tok.is_discarded());
  EXPECT_EQ(tok["model"]["type"], "BPE");
  EXPECT_EQ(tok["pre_tokenizer"]["type"], "ByteLevel");
  const int64_t vocab = static_cast<int64_t>(tok["model"]["vocab"].size()) +
                        static_cast<int64_t>(tok["added_tokens"].size());
  EXPECT_GT(tok["model"]["vocab"].size(), 256u);
  EXPECT_GT(tok["model"]["merges"].size(), 50u);
  EXPECT_LE(vocab, config->vocab_size);
  for (const auto& added : tok["added_tokens"]) {
    EXPECT_LT(added["id"].get<int64_t>(), config->vocab_size);
  }

  // Same seed → same bytes; another seed → other bytes; thread count does not matter.
  const std::string dir2 = TempDir(arch + "_again");
  opts.out_dir = dir2;
  opts.num_threads = 1;
  ASSERT_TRUE(MakeModel(opts).ok());
  EXPECT_EQ(rl::testing::ReadFile(dir + "/model.safetensors"),
            rl::testing::ReadFile(dir2 + "/model.safetensors"));
  EXPECT_EQ(rl::testing::ReadFile(dir + "/tokenizer.json"),
            rl::testing::ReadFile(dir2 + "/tokenizer.json"));
  opts.seed = 8;
  ASSERT_TRUE(MakeModel(opts).ok());
  EXPECT_NE(rl::testing::ReadFile(dir + "/model.safetensors"),
            rl::testing::ReadFile(dir2 + "/model.safetensors"));
  std::filesystem::remove_all(dir);
  std::filesystem::remove_all(dir2);
}

INSTANTIATE_TEST_SUITE_P(Archs, MakeModelTest, ::testing::Values("llama", "qwen2", "qwen3"));

TEST(MakeModelOptionsTest, ShardsAndBf16) {
  const std::string dir = TempDir("sharded");
  MakeModelOptions opts;
  opts.arch = "qwen2";
  opts.dtype = "bfloat16";
  opts.out_dir = dir;
  opts.max_shard_bytes = 64 * 1024;
  ASSERT_TRUE(MakeModel(opts).ok());
  EXPECT_TRUE(std::filesystem::exists(dir + "/model.safetensors.index.json"));
  auto ckpt = OpenCheckpoint(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_GT(ckpt->files().size(), 1u);
  EXPECT_EQ(ckpt->Find("model.norm.weight")->dtype, DType::kBF16);
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->torch_dtype, "bfloat16");
  std::filesystem::remove_all(dir);
}

TEST(MakeModelOptionsTest, BadOptionsAreErrors) {
  MakeModelOptions opts;
  opts.out_dir = TempDir("bad");
  opts.arch = "gpt2";
  EXPECT_EQ(MakeModel(opts).code(), absl::StatusCode::kInvalidArgument);
  opts.arch = "llama";
  opts.size = "70b";
  EXPECT_EQ(MakeModel(opts).code(), absl::StatusCode::kInvalidArgument);
  opts.size = "tiny";
  opts.dtype = "int8";
  EXPECT_EQ(MakeModel(opts).code(), absl::StatusCode::kInvalidArgument);
  auto big = MakeModelConfig("qwen3", "0.5b");
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->hidden_size, 1024);
  EXPECT_EQ(big->num_hidden_layers, 28);
  EXPECT_EQ(big->torch_dtype, "bfloat16");
  std::filesystem::remove_all(opts.out_dir);
}

}  // namespace
}  // namespace rl::model_io
