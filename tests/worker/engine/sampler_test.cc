#include "services/worker/engine/sampler.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace rl::engine {
namespace {

SampleInput Input(const std::vector<float>& logits, const SamplingParams& p, uint64_t seed,
                  int64_t step) {
  SampleInput in;
  in.logits = logits.data();
  in.vocab = static_cast<int64_t>(logits.size());
  in.params = &p;
  in.seed = seed;
  in.step = step;
  return in;
}

std::vector<double> Softmax(const std::vector<float>& logits, double t) {
  double m = -1e300, s = 0;
  for (float x : logits) m = std::max(m, x / t);
  std::vector<double> p;
  for (float x : logits) s += std::exp(x / t - m);
  for (float x : logits) p.push_back(std::exp(x / t - m) / s);
  return p;
}

TEST(SamplerTest, GreedyTakesArgmaxWithTiesToLowestId) {
  Sampler s;
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(s.Sample(Input({0.f, 3.f, 1.f, 3.f}, p, 1, 0)), 1);
}

TEST(SamplerTest, LogprobIsTemperatureScaledLogSoftmax) {
  Sampler s;
  const std::vector<float> logits = {1.5f, -2.f, 0.25f, 4.f, 4.f};
  for (double t : {1.0, 0.7, 2.0}) {
    const std::vector<double> p = Softmax(logits, t);
    TokenLogprob lp = s.Logprob(logits.data(), 5, t, 2, /*top_n=*/3);
    EXPECT_NEAR(lp.logprob, std::log(p[2]), 1e-12);
    ASSERT_EQ(lp.top.size(), 3u);
    EXPECT_EQ(lp.top[0].token_id, 3);  // tie between 3 and 4 goes to the lower id
    EXPECT_EQ(lp.top[1].token_id, 4);
    EXPECT_EQ(lp.top[2].token_id, 0);
    EXPECT_NEAR(lp.top[2].logprob, std::log(p[0]), 1e-12);
  }
}

TEST(SamplerTest, SameSeedAndStepGiveTheSameToken) {
  Sampler s;
  SamplingParams p;
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[i] = static_cast<float>(std::sin(i));
  for (int64_t step = 0; step < 50; ++step) {
    EXPECT_EQ(s.Sample(Input(logits, p, 42, step)), s.Sample(Input(logits, p, 42, step)));
  }
  int differ = 0;
  for (int64_t step = 0; step < 50; ++step) {
    differ += s.Sample(Input(logits, p, 42, step)) != s.Sample(Input(logits, p, 43, step));
  }
  EXPECT_GT(differ, 10);
}

TEST(SamplerTest, EmpiricalDistributionFollowsTemperature) {
  Sampler s;
  SamplingParams p;
  p.temperature = 0.8;
  const std::vector<float> logits = {0.f, 1.f, 2.f, 0.5f};
  const std::vector<double> expect = Softmax(logits, 0.8);
  std::vector<int> counts(4);
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++counts[s.Sample(Input(logits, p, 7, i))];
  for (int v = 0; v < 4; ++v) EXPECT_NEAR(counts[v] / double(n), expect[v], 0.01) << v;
}

TEST(SamplerTest, TopKTopPMinPTruncate) {
  Sampler s;
  const std::vector<float> logits = {3.f, 2.9f, 0.f, -1.f, 2.8f};
  SamplingParams p;
  p.top_k = 2;
  for (int i = 0; i < 500; ++i) {
    const int32_t t = s.Sample(Input(logits, p, 1, i));
    EXPECT_TRUE(t == 0 || t == 1) << t;
  }
  p = SamplingParams();
  p.top_p = 0.3;  // the top token alone has ~36%
  for (int i = 0; i < 200; ++i) EXPECT_EQ(s.Sample(Input(logits, p, 2, i)), 0);
  p = SamplingParams();
  p.min_p = 0.5;  // keeps 0, 1, 4
  for (int i = 0; i < 500; ++i) {
    const int32_t t = s.Sample(Input(logits, p, 3, i));
    EXPECT_TRUE(t == 0 || t == 1 || t == 4) << t;
  }
}

TEST(SamplerTest, BannedTokensAreNeverChosen) {
  Sampler s;
  SamplingParams p;
  const std::vector<float> logits = {10.f, 0.f, 0.f};
  const std::vector<int32_t> banned = {0};
  for (double t : {0.0, 1.0}) {
    p.temperature = t;
    for (int i = 0; i < 100; ++i) {
      SampleInput in = Input(logits, p, 5, i);
      in.banned = banned;
      EXPECT_NE(s.Sample(in), 0);
    }
  }
}

TEST(SamplerTest, PenaltiesShiftTheChoice) {
  Sampler s;
  SamplingParams p;
  p.temperature = 0;
  const std::vector<float> logits = {2.f, 1.9f, -5.f};
  const std::vector<int32_t> seen = {0};
  SampleInput in = Input(logits, p, 0, 0);
  in.all_tokens = seen;
  EXPECT_EQ(s.Sample(in), 0);
  p.repetition_penalty = 1.2;  // 2 / 1.2 < 1.9
  EXPECT_EQ(s.Sample(in), 1);
  p.repetition_penalty = 1.0;
  absl::flat_hash_map<int32_t, int32_t> counts = {{0, 2}};
  in.output_counts = &counts;
  p.frequency_penalty = 0.1;  // 2 - 0.2 < 1.9
  EXPECT_EQ(s.Sample(in), 1);
  p.frequency_penalty = 0;
  p.presence_penalty = 0.05;  // 1.95 > 1.9
  EXPECT_EQ(s.Sample(in), 0);
}

}  // namespace
}  // namespace rl::engine
