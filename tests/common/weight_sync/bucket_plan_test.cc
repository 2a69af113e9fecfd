#include "common/weight_sync/bucket_plan.h"

#include <set>
#include <string>
#include <vector>

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

// A delta bucket's line (issue 30): the tensors as listed (their own dtype and shape, not the
// U8 payload they travel as), their encodings, counts and payload bytes, and the parent version.
TEST(BucketPlanTest, DeltaLineRoundTrips) {
  const std::vector<uint8_t> a(7), b(40);
  Bucket bucket;
  bucket.specs = {{"w.a", "U8", {7}}, {"w.b", "F32", {2, 5}}};
  bucket.data = {absl::MakeConstSpan(a), absl::MakeConstSpan(b)};
  bucket.bytes = 47;
  bucket.listed = {{"w.a", "BF16", {3, 4}}, {"w.b", "F32", {2, 5}}};
  bucket.encodings = {"xor", "dense"};
  bucket.delta_counts = {5, 0};
  auto parsed = ParseBucketLine(BucketJson(bucket, 0, 1, 6));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->specs.size(), 2u);
  EXPECT_EQ(parsed->specs[0].dtype, "BF16");
  EXPECT_EQ(parsed->specs[0].shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(parsed->encodings, (std::vector<std::string>{"xor", "dense"}));
  EXPECT_EQ(parsed->delta_counts, (std::vector<int64_t>{5, 0}));
  EXPECT_EQ(parsed->payload_bytes, (std::vector<int64_t>{7, 40}));
  EXPECT_EQ(parsed->parent_version, 6);
  // A dense line carries none of it.
  bucket.listed.clear();
  parsed = ParseBucketLine(BucketJson(bucket, 0, 1));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->encodings.empty());
  EXPECT_EQ(parsed->parent_version, -1);
  // Lists that do not cover every name, and a negative parent, are refused.
  EXPECT_FALSE(ParseBucketLine(R"({"names": ["a"], "dtypes": ["F32"], "shapes": [[1]],
      "encodings": ["xor", "xor"], "delta_counts": [1], "payload_bytes": [2]})")
                   .ok());
  EXPECT_FALSE(ParseBucketLine(R"({"names": ["a"], "dtypes": ["F32"], "shapes": [[1]],
      "encodings": ["xor"]})")
                   .ok());
  EXPECT_FALSE(
      ParseBucketLine(R"({"names": [], "dtypes": [], "shapes": [], "parent_version": -2})").ok());
}

}  // namespace
}  // namespace rl::weight_sync
