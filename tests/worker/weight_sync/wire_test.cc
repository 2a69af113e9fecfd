#include "services/worker/weight_sync/wire.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace rl::weight_sync {
namespace {

using ::testing::HasSubstr;

TEST(WireTest, TensorBytesAndValidation) {
  EXPECT_EQ(*TensorBytes({"w", "F32", {3, 4}}), 48);
  EXPECT_EQ(*TensorBytes({"w", "BF16", {3, 4}}), 24);
  EXPECT_EQ(*TensorBytes({"w", "F16", {}}), 2);  // scalar
  EXPECT_EQ(*TensorBytes({"w", "F16", {0, 5}}), 0);
  EXPECT_TRUE(absl::IsInvalidArgument(TensorBytes({"w", "I64", {2}}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(TensorBytes({"w", "f32", {2}}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(TensorBytes({"w", "F32", {-1}}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      TensorBytes({"w", "F32", {int64_t{1} << 40, int64_t{1} << 40}}).status()));
}

TEST(WireTest, HelloAndWelcomeRoundTrip) {
  Hello hello{BackendId::kNccl, 3, 5, "g-1"};
  auto back = DecodeHello(EncodeHello(hello));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->backend, BackendId::kNccl);
  EXPECT_EQ(back->rank, 3);
  EXPECT_EQ(back->world_size, 5);
  EXPECT_EQ(back->group_name, "g-1");

  Welcome welcome{absl::StatusCode::kAlreadyExists, "rank 3 taken", std::string(128, 'x')};
  auto w = DecodeWelcome(EncodeWelcome(welcome));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->code, absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(w->message, "rank 3 taken");
  EXPECT_EQ(w->nccl_unique_id, std::string(128, 'x'));
}

TEST(WireTest, BadMagicVersionAndTruncationAreErrors) {
  std::string hello = EncodeHello({BackendId::kTcp, 1, 2, "g"});
  std::string bad_magic = hello;
  bad_magic[0] ^= 1;
  EXPECT_THAT(std::string(DecodeHello(bad_magic).status().message()), HasSubstr("magic"));
  std::string bad_version = hello;
  bad_version[4] = 9;
  EXPECT_THAT(std::string(DecodeHello(bad_version).status().message()), HasSubstr("version"));
  EXPECT_TRUE(absl::IsDataLoss(DecodeHello(hello.substr(0, hello.size() - 1)).status()));
  EXPECT_TRUE(absl::IsDataLoss(DecodeHello(hello + "x").status()));
}

TEST(WireTest, BucketFrameRoundTrip) {
  auto header = MakeBucketHeader({{"a", "F32", {2, 3}}, {"b", "BF16", {5}}, {"c", "F16", {}}});
  ASSERT_TRUE(header.ok());
  EXPECT_EQ(header->payload_bytes, 24 + 10 + 2);
  header->payload_crc32c = 0xDEADBEEF;
  Frame frame{FrameKind::kBucket, 7, *header};
  auto back = DecodeFrame(EncodeFrame(frame));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->kind, FrameKind::kBucket);
  EXPECT_EQ(back->seq, 7u);
  EXPECT_EQ(back->bucket.payload_bytes, 36);
  EXPECT_EQ(back->bucket.payload_crc32c, 0xDEADBEEFu);
  EXPECT_EQ(back->bucket.tensor_bytes, (std::vector<int64_t>{24, 10, 2}));
  EXPECT_TRUE(
      MatchBucket({{"a", "F32", {2, 3}}, {"b", "BF16", {5}}, {"c", "F16", {}}}, back->bucket).ok());

  auto close = DecodeFrame(EncodeFrame({FrameKind::kClose, 9, {}}));
  ASSERT_TRUE(close.ok());
  EXPECT_EQ(close->kind, FrameKind::kClose);
}

TEST(WireTest, FrameWithInconsistentSizesIsRejected) {
  auto header = MakeBucketHeader({{"a", "F32", {4}}});
  ASSERT_TRUE(header.ok());
  header->tensor_bytes[0] = 15;  // lies about the tensor size
  header->payload_bytes = 15;
  auto decoded = DecodeFrame(EncodeFrame({FrameKind::kBucket, 0, *header}));
  EXPECT_TRUE(absl::IsDataLoss(decoded.status()));
  EXPECT_THAT(std::string(decoded.status().message()), HasSubstr("announces 15 bytes"));

  header = MakeBucketHeader({{"a", "F32", {4}}});
  header->payload_bytes = 1 << 30;  // payload larger than its tensors
  EXPECT_TRUE(
      absl::IsDataLoss(DecodeFrame(EncodeFrame({FrameKind::kBucket, 0, *header})).status()));
}

TEST(WireTest, MatchBucketNamesTheFirstDifference) {
  auto header = MakeBucketHeader({{"a", "F32", {2, 3}}, {"b", "BF16", {5}}});
  ASSERT_TRUE(header.ok());
  auto mismatch = [&](std::vector<TensorSpec> expected) {
    absl::Status st = MatchBucket(expected, *header);
    EXPECT_TRUE(absl::IsInvalidArgument(st));
    return std::string(st.message());
  };
  EXPECT_THAT(mismatch({{"a", "F32", {2, 3}}}),
              HasSubstr("lists 1 tensors, the sender broadcast 2"));
  EXPECT_THAT(mismatch({{"a", "F32", {2, 3}}, {"x", "BF16", {5}}}), HasSubstr("(name)"));
  EXPECT_THAT(mismatch({{"a", "F16", {2, 3}}, {"b", "BF16", {5}}}), HasSubstr("(dtype)"));
  EXPECT_THAT(mismatch({{"a", "F32", {3, 2}}, {"b", "BF16", {5}}}),
              HasSubstr("metadata says 'a' F32[3, 2], the sender broadcast 'a' F32[2, 3]"));
}

}  // namespace
}  // namespace rl::weight_sync
