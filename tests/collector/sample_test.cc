// sample.h: weight-version expansion and a record filled from the router's final.
#include "services/collector/sample.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/collector/collector_test_util.h"

namespace rl::collector {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(WeightVersions, SegmentsExpandPerToken) {
  rl::v1::GenerateFinal f = MakeFinal({1, 2}, {10, 11, 12, 13, 14});
  f.set_weight_version(4);
  auto* a = f.add_weight_version_segments();
  a->set_weight_version(3);
  a->set_num_tokens(2);
  auto* b = f.add_weight_version_segments();
  b->set_weight_version(4);
  b->set_num_tokens(3);
  auto v = ExpandWeightVersions(f);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_THAT(*v, ElementsAre(3, 3, 4, 4, 4));
}

TEST(WeightVersions, NoSegmentsFallsBackToWeightVersion) {
  rl::v1::GenerateFinal f = MakeFinal({1}, {10, 11, 12});
  f.set_weight_version(7);
  auto v = ExpandWeightVersions(f);
  ASSERT_TRUE(v.ok());
  EXPECT_THAT(*v, ElementsAre(7, 7, 7));
}

TEST(WeightVersions, SegmentsThatDoNotCoverTheOutputAreRejected) {
  rl::v1::GenerateFinal f = MakeFinal({1}, {10, 11, 12});
  auto* a = f.add_weight_version_segments();
  a->set_weight_version(1);
  a->set_num_tokens(2);
  EXPECT_THAT(ExpandWeightVersions(f).status().message(), HasSubstr("cover 2 of the 3"));
  a->set_num_tokens(4);
  EXPECT_FALSE(ExpandWeightVersions(f).ok());
  a->set_num_tokens(-1);
  EXPECT_FALSE(ExpandWeightVersions(f).ok());
}

TEST(FillFromFinal, PromptAndResponseColumns) {
  rl::v1::GenerateFinal f = MakeFinal({5, 6, 7}, {20, 21});
  f.set_weight_version(2);
  auto* a = f.add_weight_version_segments();
  a->set_weight_version(1);
  a->set_num_tokens(1);
  auto* b = f.add_weight_version_segments();
  b->set_weight_version(2);
  b->set_num_tokens(1);
  SampleRecord r;
  ASSERT_TRUE(FillFromFinal(f, &r).ok());
  EXPECT_EQ(r.prompt_len, 3);
  EXPECT_THAT(r.tokens, ElementsAre(5, 6, 7, 20, 21));
  EXPECT_THAT(r.loss_mask, ElementsAre(0, 0, 0, 1, 1));
  EXPECT_THAT(r.weight_versions, ElementsAre(-1, -1, -1, 1, 2));
  EXPECT_TRUE(std::isnan(r.rollout_logprobs[0]));
  EXPECT_FLOAT_EQ(r.rollout_logprobs[3], -1.0f);
  EXPECT_FLOAT_EQ(r.rollout_logprobs[4], -2.0f);
  EXPECT_EQ(r.finish_reason, "stop");
  EXPECT_EQ(r.weight_version, 2);
}

TEST(FillFromFinal, MissingTrajectoryIsAnError) {
  rl::v1::GenerateFinal f;
  f.add_output_ids(3);
  SampleRecord r;
  EXPECT_THAT(FillFromFinal(f, &r).message(), HasSubstr("return_trajectory"));
}

}  // namespace
}  // namespace rl::collector
