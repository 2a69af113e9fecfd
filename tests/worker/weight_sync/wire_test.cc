#include "services/worker/weight_sync/wire.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rl/v1/weight_sync.pb.h"

namespace rl::weight_sync {
namespace {

using ::testing::HasSubstr;

TEST(WireTest, TensorBytesAndValidation) {
  EXPECT_EQ(*TensorBytes({"w", "F32", {3, 4}}), 48);
  EXPECT_EQ(*TensorBytes({"w", "BF16", {3, 4}}), 24);
  EXPECT_EQ(*TensorBytes({"w", "F16", {}}), 2);  // scalar
  EXPECT_EQ(*TensorBytes({"w", "F16", {0, 5}}), 0);
  EXPECT_EQ(*TensorBytes({"w", "U8", {5}}), 5);  // a delta payload (issue 30)
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

TEST(WireTest, WrongKindVersionAndGarbageAreErrors) {
  // Another message where a hello is due (e.g. a peer speaking the other side's part).
  std::string welcome = EncodeWelcome({});
  EXPECT_THAT(std::string(DecodeHello(welcome).status().message()),
              HasSubstr("expected a hello, got welcome"));
  rl::v1::WeightSyncMessage old;
  old.mutable_hello()->set_protocol(static_cast<rl::v1::WeightSyncProtocol>(1));
  old.mutable_hello()->set_backend(rl::v1::GROUP_BACKEND_TCP);
  auto version = DecodeHello(old.SerializeAsString());
  EXPECT_TRUE(absl::IsInvalidArgument(version.status()));
  EXPECT_THAT(std::string(version.status().message()), HasSubstr("protocol version 1"));
  rl::v1::WeightSyncMessage no_backend;
  no_backend.mutable_hello()->set_protocol(rl::v1::WEIGHT_SYNC_PROTOCOL_V2);
  EXPECT_THAT(std::string(DecodeHello(no_backend.SerializeAsString()).status().message()),
              HasSubstr("unknown backend"));
  // The old hand-written codec's hello ("RLWS", version 1, ...) and other garbage do not parse.
  const std::string legacy("RLWS\x01\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00", 15);
  EXPECT_TRUE(absl::IsDataLoss(DecodeHello(legacy).status()));
  std::string hello = EncodeHello({BackendId::kTcp, 1, 2, "g"});
  EXPECT_TRUE(absl::IsDataLoss(DecodeHello(hello.substr(0, hello.size() - 1)).status()));
  EXPECT_TRUE(absl::IsDataLoss(DecodeFrame(std::string("\xff\xff\xff", 3)).status()));
  EXPECT_TRUE(absl::IsDataLoss(DecodeAck(EncodeHello({BackendId::kTcp, 1, 2, "g"})).status()));
}

TEST(WireTest, MessagesAreTheWeightSyncProto) {
  // What a trainer in another language (the rlfleet Python sender) parses and builds.
  auto header = MakeBucketHeader({{"w", "BF16", {2, 3}}});
  ASSERT_TRUE(header.ok());
  header->payload_crc32c = 0x01020304;
  rl::v1::WeightSyncMessage msg;
  ASSERT_TRUE(msg.ParseFromString(EncodeFrame({FrameKind::kBucket, 4, *header})));
  ASSERT_TRUE(msg.has_bucket());
  EXPECT_EQ(msg.bucket().seq(), 4u);
  ASSERT_EQ(msg.bucket().tensors_size(), 1);
  EXPECT_EQ(msg.bucket().tensors(0).name(), "w");
  EXPECT_EQ(msg.bucket().tensors(0).dtype(), "BF16");
  EXPECT_EQ(msg.bucket().tensors(0).bytes(), 12u);
  EXPECT_EQ(msg.bucket().payload_bytes(), 12u);
  EXPECT_EQ(msg.bucket().payload_crc32c(), 0x01020304u);

  rl::v1::WeightSyncMessage ack;
  ack.mutable_ack()->set_seq(4);
  ack.mutable_ack()->set_code(3);
  ack.mutable_ack()->set_message("bucket mismatch");
  auto decoded = DecodeAck(ack.SerializeAsString());
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->seq, 4u);
  EXPECT_EQ(decoded->code, absl::StatusCode::kInvalidArgument);
  ack.mutable_ack()->set_code(99);  // out of range: UNKNOWN, never a made-up code
  EXPECT_EQ(DecodeAck(ack.SerializeAsString())->code, absl::StatusCode::kUnknown);
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
