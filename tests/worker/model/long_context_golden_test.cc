// Long-context golden against transformers: the tiny Llama-3 checkpoint (llama3 RoPE scaling,
// original context 256) over 1,020 positions (an 8-token prompt extended greedily by
// transformers, tests/golden/model/hf_llama_long.json from make_long_golden.py). The log-prob of
// every next token must be within 1e-5 of transformers' float32 result at every position: RoPE
// angle errors grow linearly with the position, so inverse frequencies that differ by an ulp
// from transformers' show up here. Runs on every SIMD target the CPU kernels can take here; the
// scalar fallback sums each dot product in one sequential chain (rounding error growing with k,
// not log k as in the vector targets' lane trees) and gets 2e-5 (measured: 1.15e-5 there, against
// 9.4e-6 on AVX3 and 5.5e-6 on AVX2, all at the same position).
#include <cmath>
#include <filesystem>

#include "common/model_io/model_maker.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/worker/model/cpu_model_runner.h"
#include "tests/testing/simd_targets.h"
#include "tests/worker/model/test_util.h"

namespace rl::model {
namespace {

class LongContextGoldenTest : public ::testing::TestWithParam<int64_t> {};

TEST_P(LongContextGoldenTest, LogprobsMatchTransformersPast1000Positions) {
  ::rl::testing::ScopedSimdTarget target(GetParam());
  const double tolerance = GetParam() == HWY_SCALAR ? 2e-5 : 1e-5;
  const std::string path = std::string(RL_HF_FIXTURE_DIR) + "/hf_llama_long.json";
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  const nlohmann::json fx = testing::ReadJson(path);

  const std::string dir = testing::FreshTempDir("hf_llama_long");
  ASSERT_TRUE(model_io::MakeModel(testing::MakerOptions(fx["maker"], dir)).ok());

  const auto ids = fx["ids"].get<std::vector<int32_t>>();
  const auto ref = fx["next_token_logprobs"].get<std::vector<double>>();
  ASSERT_GT(ids.size(), 1000u);
  ASSERT_EQ(ref.size(), ids.size() - 1);
  RunnerOptions ro;
  ro.model_dir = dir;
  ro.num_kv_slots = static_cast<int64_t>(ids.size()) + 8;
  auto runner = CpuModelRunner::Create(ro);
  ASSERT_TRUE(runner.ok()) << runner.status();
  SequenceInput seq;
  seq.token_ids = ids;
  for (size_t i = 0; i < ids.size(); ++i) seq.kv_slots.push_back(static_cast<int32_t>(i));
  seq.logits = LogitsMode::kAll;
  ForwardInput fin;
  fin.seqs = {seq};
  ForwardOutput out;
  ASSERT_TRUE((*runner)->Forward(fin, &out).ok());
  const int64_t vocab = out.vocab_size;
  ASSERT_EQ(out.logits.size(), ids.size() * static_cast<size_t>(vocab));
  double max_diff = 0, max_diff_early = 0;
  size_t worst = 0;
  for (size_t p = 0; p + 1 < ids.size(); ++p) {
    const float* row = out.logits.data() + p * vocab;
    double mx = row[0];
    for (int64_t v = 1; v < vocab; ++v) mx = std::max(mx, static_cast<double>(row[v]));
    double sum = 0;
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
    const double logp = static_cast<double>(row[ids[p + 1]]) - mx - std::log(sum);
    const double diff = std::abs(logp - ref[p]);
    EXPECT_LE(diff, tolerance) << "position " << p;
    if (diff > max_diff) {
      max_diff = diff;
      worst = p;
    }
    if (p < 128) max_diff_early = std::max(max_diff_early, diff);
  }
  std::printf("max |logprob diff| vs transformers: %.3g (at position %zu); below 128: %.3g\n",
              max_diff, worst, max_diff_early);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Targets, LongContextGoldenTest,
                         ::testing::ValuesIn(::rl::testing::SimdTargets()), [](const auto& info) {
                           return ::rl::testing::SimdTargetName(info.param);
                         });

}  // namespace
}  // namespace rl::model
