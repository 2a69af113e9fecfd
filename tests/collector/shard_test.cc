// shard.h: exact, deterministic round trips (R3 included) and refused corruptions.
#include "services/collector/shard.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/collector/collector_test_util.h"

namespace rl::collector {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(Shard, RoundTripIsExactAndDeterministic) {
  std::vector<SampleRecord> in = {Record(4, 0, {1, 2, 3, 9}, 3), Record(1, 1, {7, 8}, 1)};
  SampleRecord failed;
  failed.key = {2, 0};
  failed.status = "UNAVAILABLE: gone (after 6 attempts)";
  failed.attempts = 6;
  in.push_back(failed);
  const std::string bytes = EncodeShard(in);
  EXPECT_EQ(bytes, EncodeShard(in));
  auto out = DecodeShard(bytes, "mem");
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 3u);
  for (size_t i = 0; i < in.size(); ++i) {
    const SampleRecord& a = in[i];
    const SampleRecord& b = (*out)[i];
    EXPECT_EQ(a.key, b.key);
    EXPECT_EQ(a.group, b.group);
    EXPECT_EQ(a.status, b.status);
    EXPECT_EQ(a.finish_reason, b.finish_reason);
    EXPECT_EQ(a.prompt_len, b.prompt_len);
    EXPECT_EQ(a.attempts, b.attempts);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_EQ(a.loss_mask, b.loss_mask);
    EXPECT_EQ(a.weight_versions, b.weight_versions);
    ASSERT_EQ(a.rollout_logprobs.size(), b.rollout_logprobs.size());
    for (size_t j = 0; j < a.rollout_logprobs.size(); ++j) {
      EXPECT_EQ(std::isnan(a.rollout_logprobs[j]), std::isnan(b.rollout_logprobs[j]));
      if (!std::isnan(a.rollout_logprobs[j]))
        EXPECT_EQ(a.rollout_logprobs[j], b.rollout_logprobs[j]);
    }
  }
  EXPECT_EQ((*out)[0].metadata_json, R"({"label":[1,2],"source":"gsm8k"})");
  // Re-encoding what was decoded gives the same bytes.
  EXPECT_EQ(EncodeShard(*out), bytes);
}

// R3: the final's routed experts land in the record (checked against their shape) and travel
// through a shard exactly; shards without routing keep their old layout.
TEST(Shard, RoutedExpertsRoundTrip) {
  rl::v1::GenerateFinal f = MakeFinal({5, 6, 7}, {20, 21});
  rl::v1::RoutedExperts* re = f.mutable_routed_experts();
  const std::vector<int32_t> ids = {3, 1, 0, 2, 7, 4, 5, 6};  // [2 tokens, 2 layers, 2]
  const std::vector<float> w = {0.6f, 0.4f, 0.5f, 0.5f, 0.9f, 0.1f, 0.7f, 0.3f};
  re->set_expert_ids(ids.data(), ids.size() * 4);
  re->set_expert_weights(w.data(), w.size() * 4);
  for (int d : {2, 2, 2}) re->add_shape(d);
  re->set_start_pos(2);
  SampleRecord r;
  ASSERT_TRUE(FillFromFinal(f, &r).ok());
  EXPECT_EQ(r.routed_experts, ids);
  EXPECT_EQ(r.expert_weights, w);
  EXPECT_THAT(r.routed_shape, ElementsAre(2, 2, 2));
  EXPECT_EQ(r.routed_start, 2);

  std::vector<SampleRecord> in = {r, Record(1, 1, {7, 8}, 1)};
  const std::string bytes = EncodeShard(in);
  auto out = DecodeShard(bytes, "mem");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[0].routed_experts, ids);
  EXPECT_EQ((*out)[0].expert_weights, w);
  EXPECT_EQ((*out)[0].routed_shape, r.routed_shape);
  EXPECT_EQ((*out)[0].routed_start, 2);
  EXPECT_TRUE((*out)[1].routed_shape.empty());
  EXPECT_TRUE((*out)[1].routed_experts.empty());
  EXPECT_EQ(EncodeShard(*out), bytes);
  EXPECT_EQ(EncodeShard({Record(1, 1, {7, 8}, 1)}).find("routed"), std::string::npos);
  // A shard whose routed_shape overflows or is negative is refused, never multiplied blindly.
  for (const std::vector<int32_t>& shape :
       {std::vector<int32_t>{2147483647, 2147483647, 2147483647},
        std::vector<int32_t>{-2, -2, 2}}) {
    SampleRecord odd = r;
    odd.routed_shape = shape;
    auto decoded = DecodeShard(EncodeShard({odd}), "mem");
    ASSERT_FALSE(decoded.ok());
    EXPECT_THAT(decoded.status().message(), HasSubstr("routed_shape"));
  }

  // Bytes that do not match the shape are refused.
  re->set_expert_ids(ids.data(), 7 * 4);
  SampleRecord bad;
  EXPECT_THAT(FillFromFinal(f, &bad).message(), HasSubstr("routed_experts"));
  re->set_expert_ids(ids.data(), ids.size() * 4);
  re->set_start_pos(4);  // tokens [4, 6) beyond the 5 tokens
  EXPECT_THAT(FillFromFinal(f, &bad).message(), HasSubstr("beyond"));
}

TEST(Shard, EmptyShardAndCorruptionAreHandled) {
  auto empty = DecodeShard(EncodeShard({}), "empty");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->empty());
  std::string bytes = EncodeShard({Record(1, 0, {1, 2, 3}, 1)});
  EXPECT_FALSE(DecodeShard(bytes.substr(0, bytes.size() - 3), "cut").ok());
  EXPECT_FALSE(DecodeShard("", "nothing").ok());
  EXPECT_FALSE(DecodeShard(std::string(16, '\xff'), "garbage").ok());
}

}  // namespace
}  // namespace rl::collector
