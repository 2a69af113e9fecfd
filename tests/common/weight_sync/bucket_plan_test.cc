#include "common/weight_sync/bucket_plan.h"

#include <set>

#include "gtest/gtest.h"

namespace rl::weight_sync {
namespace {

model_io::TensorView View(const std::string& name, int64_t numel, std::vector<uint8_t>* store) {
  store->resize(static_cast<size_t>(numel) * 4);
  return {name, model_io::DType::kF32, {numel}, absl::Span<const uint8_t>(*store)};
}

TEST(BucketPlanTest, GreedyInOrderWithOversizedTensorsAlone) {
  std::vector<std::vector<uint8_t>> store(5);
  std::vector<model_io::TensorView> tensors = {
      View("a", 10, &store[0]),   // 40 B
      View("b", 10, &store[1]),   // 40 B
      View("c", 100, &store[2]),  // 400 B: larger than a bucket, alone
      View("d", 5, &store[3]),    // 20 B
      View("e", 15, &store[4]),   // 60 B
  };
  auto buckets = PlanBuckets(tensors, 100);
  ASSERT_TRUE(buckets.ok()) << buckets.status();
  ASSERT_EQ(buckets->size(), 3u);
  EXPECT_EQ((*buckets)[0].bytes, 80);
  EXPECT_EQ((*buckets)[1].specs.size(), 1u);
  EXPECT_EQ((*buckets)[1].specs[0].name, "c");
  EXPECT_EQ((*buckets)[2].bytes, 80);
  EXPECT_EQ((*buckets)[2].data[1].data(), store[4].data());
}

TEST(BucketPlanTest, RejectsNonFloatDTypesAndBadSize) {
  std::vector<uint8_t> bytes(16);
  std::vector<model_io::TensorView> tensors = {
      {"ids", model_io::DType::kI64, {2}, absl::Span<const uint8_t>(bytes)}};
  EXPECT_TRUE(absl::IsInvalidArgument(PlanBuckets(tensors, 100).status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(PlanBuckets(std::vector<model_io::TensorView>{}, 0).status()));
  EXPECT_TRUE(PlanBuckets(std::vector<model_io::TensorView>{}, 10)->empty());
}

TEST(BucketPlanTest, JsonLineRoundTrips) {
  Bucket bucket;
  bucket.specs = {{"a.weight", "BF16", {4, 8}}, {"b", "F32", {}}};
  bucket.bytes = 68;
  std::string line = BucketJson(bucket, 1, 2);
  EXPECT_NE(line.find("\"last\":true"), std::string::npos) << line;
  auto specs = ParseBucketJson(line);
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_EQ(specs->size(), 2u);
  EXPECT_EQ((*specs)[0].name, "a.weight");
  EXPECT_EQ((*specs)[0].dtype, "BF16");
  EXPECT_EQ((*specs)[0].shape, (std::vector<int64_t>{4, 8}));
  EXPECT_TRUE((*specs)[1].shape.empty());
  EXPECT_TRUE(absl::IsInvalidArgument(ParseBucketJson("listening on x").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ParseBucketJson("{\"done\":true}").status()));
}

}  // namespace
}  // namespace rl::weight_sync
