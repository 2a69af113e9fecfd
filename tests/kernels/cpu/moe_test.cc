// The CPU MoE kernels: routing equals torch's softmax + topk (including torch's order among equal
// weights, and NaN rows), norm_topk_prob, the grouped expert MLP against a plain per-token
// reference in double, batch invariance of a token's output, and bad expert ids refused.
#include "kernels/cpu/moe.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/model_io/dtype.h"
#include "gtest/gtest.h"

namespace rl::kernels::cpu {
namespace {

std::vector<int32_t> TopK(const std::vector<float>& logits, int64_t k, bool norm = false,
                          std::vector<float>* weights = nullptr) {
  std::vector<int32_t> ids(static_cast<size_t>(k));
  std::vector<float> w(static_cast<size_t>(k));
  MoeRouteParams p;
  p.logits = logits.data();
  p.ids = ids.data();
  p.weights = w.data();
  p.num_tokens = 1;
  p.num_experts = static_cast<int64_t>(logits.size());
  p.top_k = k;
  p.norm_topk_prob = norm;
  EXPECT_TRUE(p.Validate().ok());
  MoeRoute(p);
  if (weights != nullptr) *weights = w;
  return ids;
}

// Expected orders printed by torch 2.15 (CPU):
// torch.topk(torch.softmax(torch.tensor([x]), -1, dtype=torch.float), k).indices
TEST(MoeRouteTest, EqualWeightsComeOutInTorchsOrder) {
  EXPECT_EQ(TopK({0.1f, 0.5f, 0.5f, 0.2f, 0.5f, 0.5f}, 3), (std::vector<int32_t>{1, 5, 4}));
  EXPECT_EQ(TopK({1, 3, 3, 0, 3, 2, 3, 3}, 4), (std::vector<int32_t>{4, 7, 6, 1}));
  EXPECT_EQ(TopK(std::vector<float>(128, 0.0f), 8),
            (std::vector<int32_t>{84, 87, 86, 85, 82, 81, 88, 83}));
  EXPECT_EQ(TopK(std::vector<float>(128, 0.0f), 1), (std::vector<int32_t>{0}));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(TopK({nan, 1, 1, nan}, 2), (std::vector<int32_t>{2, 3}));
}

TEST(MoeRouteTest, SoftmaxWeightsAndNormalization) {
  const std::vector<float> logits = {0.5f, -1.0f, 2.0f, 0.0f, 1.5f};
  double z = 0;
  for (float v : logits) z += std::exp(static_cast<double>(v));
  std::vector<float> w;
  EXPECT_EQ(TopK(logits, 2, false, &w), (std::vector<int32_t>{2, 4}));
  EXPECT_NEAR(w[0], std::exp(2.0) / z, 1e-7);
  EXPECT_NEAR(w[1], std::exp(1.5) / z, 1e-7);
  EXPECT_EQ(TopK(logits, 2, true, &w), (std::vector<int32_t>{2, 4}));
  EXPECT_NEAR(w[0], std::exp(2.0) / (std::exp(2.0) + std::exp(1.5)), 1e-7);
  EXPECT_NEAR(w[0] + w[1], 1.0, 1e-7);
}

TEST(MoeRouteTest, BadSizesAreRefused) {
  MoeRouteParams p;
  EXPECT_FALSE(p.Validate().ok());
  float l = 0;
  int32_t id = 0;
  float w = 0;
  p.logits = &l;
  p.ids = &id;
  p.weights = &w;
  p.num_tokens = 1;
  p.num_experts = 1;
  p.top_k = 2;
  EXPECT_FALSE(p.Validate().ok());
}

class MoeExpertsTest : public ::testing::Test {
 protected:
  static constexpr int64_t kHidden = 24, kInter = 20, kExperts = 6, kTopK = 2, kTokens = 9;

  void SetUp() override {
    std::mt19937 rng(7);
    std::normal_distribution<float> n(0.0f, 0.3f);
    for (int64_t e = 0; e < kExperts; ++e) {
      gate_.emplace_back(kInter * kHidden);
      up_.emplace_back(kInter * kHidden);
      down_.emplace_back(kHidden * kInter);
      for (auto* m : {&gate_.back(), &up_.back(), &down_.back()}) {
        for (float& v : *m) v = n(rng);
      }
    }
    for (int64_t e = 0; e < kExperts; ++e) {
      ptrs_.push_back(gate_[e].data());
    }
    for (int64_t e = 0; e < kExperts; ++e) ptrs_.push_back(up_[e].data());
    for (int64_t e = 0; e < kExperts; ++e) ptrs_.push_back(down_[e].data());
    x_.resize(kTokens * kHidden);
    for (float& v : x_) v = n(rng);
    for (int64_t t = 0; t < kTokens; ++t) {
      // Distinct experts per token; expert 5 is never used.
      ids_.push_back(static_cast<int32_t>(t % 5));
      ids_.push_back(static_cast<int32_t>((t + 2) % 5));
      weights_.push_back(0.25f + 0.05f * static_cast<float>(t));
      weights_.push_back(0.5f);
    }
  }

  MoeExpertsParams Params(const float* x, const int32_t* ids, const float* w, float* y,
                          int64_t tokens) const {
    MoeExpertsParams p;
    p.x = x;
    p.ids = ids;
    p.weights = w;
    p.gate = ptrs_.data();
    p.up = ptrs_.data() + kExperts;
    p.down = ptrs_.data() + 2 * kExperts;
    p.y = y;
    p.num_tokens = tokens;
    p.hidden = kHidden;
    p.intermediate = kInter;
    p.num_experts = kExperts;
    p.top_k = kTopK;
    return p;
  }

  std::vector<std::vector<float>> gate_, up_, down_;
  std::vector<const void*> ptrs_;
  std::vector<float> x_, weights_;
  std::vector<int32_t> ids_;
};

TEST_F(MoeExpertsTest, MatchesAPerTokenReference) {
  ThreadPool pool(2);
  MoeScratch scratch;
  std::vector<float> y(kTokens * kHidden, -1.0f);
  ASSERT_TRUE(Params(x_.data(), ids_.data(), weights_.data(), y.data(), kTokens).Validate().ok());
  ASSERT_TRUE(MoeExperts(Params(x_.data(), ids_.data(), weights_.data(), y.data(), kTokens), &pool,
                         &scratch)
                  .ok());
  for (int64_t t = 0; t < kTokens; ++t) {
    std::vector<double> ref(kHidden, 0.0);
    for (int64_t j = 0; j < kTopK; ++j) {
      const int64_t e = ids_[t * kTopK + j];
      std::vector<double> act(kInter);
      for (int64_t i = 0; i < kInter; ++i) {
        double g = 0, u = 0;
        for (int64_t h = 0; h < kHidden; ++h) {
          g += static_cast<double>(gate_[e][i * kHidden + h]) * x_[t * kHidden + h];
          u += static_cast<double>(up_[e][i * kHidden + h]) * x_[t * kHidden + h];
        }
        act[i] = g / (1 + std::exp(-g)) * u;
      }
      for (int64_t h = 0; h < kHidden; ++h) {
        double d = 0;
        for (int64_t i = 0; i < kInter; ++i) d += down_[e][h * kInter + i] * act[i];
        ref[h] += weights_[t * kTopK + j] * d;
      }
    }
    for (int64_t h = 0; h < kHidden; ++h) EXPECT_NEAR(y[t * kHidden + h], ref[h], 1e-5);
  }
}

TEST_F(MoeExpertsTest, ATokensOutputDoesNotDependOnTheBatch) {
  ThreadPool pool(3);
  MoeScratch scratch;
  std::vector<float> all(kTokens * kHidden);
  ASSERT_TRUE(MoeExperts(Params(x_.data(), ids_.data(), weights_.data(), all.data(), kTokens),
                         &pool, &scratch)
                  .ok());
  for (int64_t t = 0; t < kTokens; ++t) {
    std::vector<float> one(kHidden);
    ASSERT_TRUE(MoeExperts(Params(x_.data() + t * kHidden, ids_.data() + t * kTopK,
                                  weights_.data() + t * kTopK, one.data(), 1),
                           &pool, &scratch)
                    .ok());
    EXPECT_EQ(std::memcmp(one.data(), all.data() + t * kHidden, kHidden * sizeof(float)), 0)
        << "token " << t;
  }
}

TEST_F(MoeExpertsTest, BadExpertIdsAreRefused) {
  ThreadPool pool(1);
  MoeScratch scratch;
  std::vector<float> y(kTokens * kHidden, 7.0f);
  std::vector<int32_t> bad = ids_;
  bad[3] = kExperts;
  absl::Status s = MoeExperts(Params(x_.data(), bad.data(), weights_.data(), y.data(), kTokens),
                              &pool, &scratch);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(y[0], 7.0f);  // nothing written
  bad[3] = -1;
  EXPECT_FALSE(
      MoeExperts(Params(x_.data(), bad.data(), weights_.data(), y.data(), kTokens), &pool, &scratch)
          .ok());
  EXPECT_FALSE(
      Params(x_.data(), ids_.data(), weights_.data(), const_cast<float*>(x_.data()), kTokens)
          .Validate()
          .ok());
}

}  // namespace
}  // namespace rl::kernels::cpu
