// Hugging Face transformers as the reference: tiny random Llama-3 (llama3 RoPE scaling), Qwen2
// (q/k/v bias), Qwen3 (q/k norm, head_dim ≠ hidden/heads) and Qwen3-MoE (16 experts, top-4,
// normalized top-k, one dense layer via mlp_only_layers) checkpoints, re-created here with the
// deterministic maker from the parameters in tests/golden/model/hf_<arch>.json (written by
// make_hf_fixtures.py). Prompt logits must match within 1e-4 and greedy tokens exactly; for
// MoE, the routed experts (R3) of every token equal the router's top-k in transformers and their
// weights match within 1e-5. Each case runs on every SIMD target the CPU kernels can take here.
#include <cmath>
#include <filesystem>
#include <tuple>

#include "common/model_io/model_maker.h"
#include "common/model_io/safetensors.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/worker/model/cpu_model_runner.h"
#include "tests/testing/simd_targets.h"
#include "tests/worker/model/test_util.h"

namespace rl::model {
namespace {

class HfGoldenTest : public ::testing::TestWithParam<std::tuple<std::string, int64_t>> {};

// The whole greedy sequence in one prefill with routing export: every token's expert ids per
// MoE layer equal transformers' top-k (same order), weights within 1e-5.
void ExpectRoutingMatches(ModelRunner* runner, const nlohmann::json& fx) {
  const auto ids = fx["routed_ids"].get<std::vector<int32_t>>();
  const auto want = fx["routed_experts"].get<std::vector<std::vector<std::vector<int32_t>>>>();
  const auto want_w = fx["routed_weights"].get<std::vector<std::vector<std::vector<double>>>>();
  ASSERT_EQ(want.size(), ids.size());
  SequenceInput seq;
  seq.token_ids = ids;
  for (size_t i = 0; i < ids.size(); ++i) seq.kv_slots.push_back(static_cast<int32_t>(i));
  seq.logits = LogitsMode::kNone;
  ForwardInput fin;
  fin.seqs = {seq};
  fin.return_routing = true;
  ForwardOutput out;
  ASSERT_TRUE(runner->Forward(fin, &out).ok());
  const size_t layers = want[0].size();
  const size_t k = want[0][0].size();
  ASSERT_EQ(layers, runner->config().MoeLayers().size());
  ASSERT_EQ(k, static_cast<size_t>(runner->config().num_experts_per_tok));
  ASSERT_EQ(out.routed_experts.size(), ids.size() * layers * k);
  ASSERT_EQ(out.routed_weights.size(), out.routed_experts.size());
  int mismatches = 0;
  double max_diff = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    for (size_t l = 0; l < layers; ++l) {
      for (size_t j = 0; j < k; ++j) {
        const size_t at = (t * layers + l) * k + j;
        mismatches += out.routed_experts[at] != want[t][l][j];
        max_diff = std::max(max_diff, std::abs(out.routed_weights[at] - want_w[t][l][j]));
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_LE(max_diff, 1e-5);
  std::printf("routing: %zu tokens x %zu layers x top-%zu equal, max |weight diff| = %.3g\n",
              ids.size(), layers, k, max_diff);
}

TEST_P(HfGoldenTest, MatchesTransformers) {
  const std::string arch = std::get<0>(GetParam());
  ::rl::testing::ScopedSimdTarget target(std::get<1>(GetParam()));
  const std::string path = std::string(RL_HF_FIXTURE_DIR) + "/hf_" + arch + ".json";
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  const nlohmann::json fx = testing::ReadJson(path);

  const std::string dir = testing::FreshTempDir("hf_" + arch);
  ASSERT_TRUE(model_io::MakeModel(testing::MakerOptions(fx["maker"], dir)).ok());

  // The maker reproduced the checkpoint the reference ran on.
  auto ckpt = model_io::OpenCheckpoint(dir);
  ASSERT_TRUE(ckpt.ok());
  const model_io::TensorView* embed = ckpt->Find("model.embed_tokens.weight");
  ASSERT_NE(embed, nullptr);
  double sum = 0;
  const float* e = reinterpret_cast<const float*>(embed->data.data());
  for (int64_t i = 0; i < embed->NumElements(); ++i) sum += e[i];
  EXPECT_NEAR(sum, fx["embed_sum"].get<double>(), 1e-9 * (1 + std::abs(sum)));

  RunnerOptions ro;
  ro.model_dir = dir;
  ro.num_kv_slots = 64;
  auto runner = CpuModelRunner::Create(ro);
  ASSERT_TRUE(runner.ok()) << runner.status();
  const auto prompt = fx["prompt_ids"].get<std::vector<int32_t>>();
  SequenceInput seq;
  seq.token_ids = prompt;
  for (size_t i = 0; i < prompt.size(); ++i) seq.kv_slots.push_back(static_cast<int32_t>(i));
  seq.logits = LogitsMode::kAll;
  ForwardInput fin;
  fin.seqs = {seq};
  ForwardOutput out;
  ASSERT_TRUE((*runner)->Forward(fin, &out).ok());
  const auto ref = fx["prompt_logits"].get<std::vector<std::vector<double>>>();
  ASSERT_EQ(out.logits.size(), ref.size() * static_cast<size_t>(out.vocab_size));
  double max_diff = 0;
  for (size_t r = 0; r < ref.size(); ++r) {
    for (int64_t v = 0; v < out.vocab_size; ++v) {
      max_diff = std::max(max_diff, std::abs(out.logits[r * out.vocab_size + v] - ref[r][v]));
    }
  }
  EXPECT_LE(max_diff, 1e-4);
  std::printf("%s: max |logit diff| vs transformers = %.3g\n", arch.c_str(), max_diff);

  auto greedy = testing::Greedy(runner->get(), prompt, static_cast<int>(fx["generated_ids"].size()),
                                /*slot_base=*/32);
  EXPECT_EQ(greedy.tokens, fx["generated_ids"].get<std::vector<int32_t>>());
  // The MoE fixture must carry the routing (a regenerated one without it would skip the check).
  ASSERT_EQ(fx.contains("routed_experts"), arch == "qwen3_moe");
  if (fx.contains("routed_experts")) ExpectRoutingMatches(runner->get(), fx);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Archs, HfGoldenTest,
                         ::testing::Combine(::testing::Values("llama", "qwen2", "qwen3",
                                                              "qwen3_moe"),
                                            ::testing::ValuesIn(::rl::testing::SimdTargets())),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" +
                                  ::rl::testing::SimdTargetName(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace rl::model
