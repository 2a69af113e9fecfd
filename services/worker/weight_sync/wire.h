// The weight-sync wire protocol over the TCP control channel (both backends).
//
// Every control message is one rl.v1.WeightSyncMessage (protos/rl/v1/weight_sync.proto: Hello,
// Welcome, Bucket, Close, Ack), serialized and framed as u32 body length, u32 CRC32C(body),
// body (little-endian). Protobuf, so that a trainer in any language (the rlfleet Python sender)
// speaks it with generated classes. The bucket payload is not a message: tcp writes its raw
// bytes right after the bucket frame (the tensors back to back in header order); nccl moves
// them with one ncclBroadcast. The structs below are the C++ side's view of those messages.
// Decoders check the protocol version, the message kind, lengths and that every per-tensor byte
// count equals numel × dtype size and they sum to payload_bytes, so a receiver never trusts an
// unchecked size. Messages are capped at 64 MiB. Cost: one protobuf parse / serialize per
// control message (bytes to a few KiB per bucket); payload bytes never pass through protobuf.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/worker/weight_sync/socket.h"
#include "services/worker/weight_sync/weight_sync.h"

namespace rl::weight_sync {

// rl.v1.WEIGHT_SYNC_PROTOCOL_V2: version 1 was a hand-written binary codec.
inline constexpr int kProtocolVersion = 2;
inline constexpr uint32_t kMaxMessageBytes = 64u << 20;

enum class BackendId : uint8_t { kTcp = 0, kNccl = 1 };
absl::StatusOr<BackendId> ParseBackend(const std::string& name);
const char* BackendName(BackendId id);

struct Hello {
  BackendId backend = BackendId::kTcp;
  int32_t rank = 0;
  int32_t world_size = 0;
  std::string group_name;
};

struct Welcome {
  absl::StatusCode code = absl::StatusCode::kOk;
  std::string message;
  std::string nccl_unique_id;
};

enum class FrameKind : uint8_t { kBucket = 1, kClose = 2 };

struct BucketHeader {
  std::vector<TensorSpec> tensors;
  std::vector<int64_t> tensor_bytes;  // TensorBytes(tensors[i])
  int64_t payload_bytes = 0;          // sum of tensor_bytes
  uint32_t payload_crc32c = 0;
};

struct Frame {
  FrameKind kind = FrameKind::kBucket;
  uint64_t seq = 0;
  BucketHeader bucket;  // kind == kBucket only
};

struct Ack {
  uint64_t seq = 0;
  absl::StatusCode code = absl::StatusCode::kOk;
  std::string message;
};

std::string EncodeHello(const Hello& hello);
absl::StatusOr<Hello> DecodeHello(const std::string& body);
std::string EncodeWelcome(const Welcome& welcome);
absl::StatusOr<Welcome> DecodeWelcome(const std::string& body);
// Fills tensor_bytes and payload_bytes from `tensors` (InvalidArgument for a bad spec).
absl::StatusOr<BucketHeader> MakeBucketHeader(std::vector<TensorSpec> tensors);
std::string EncodeFrame(const Frame& frame);
absl::StatusOr<Frame> DecodeFrame(const std::string& body);
std::string EncodeAck(const Ack& ack);
absl::StatusOr<Ack> DecodeAck(const std::string& body);

// INVALID_ARGUMENT naming the first difference between what the caller expects (the gRPC
// metadata) and what the sender announced: count, then per tensor name, dtype, shape, bytes.
absl::Status MatchBucket(const std::vector<TensorSpec>& expected, const BucketHeader& got);

// Sends one framed message.
absl::Status WriteMessage(const Socket& socket, const std::string& body,
                          std::chrono::milliseconds stall, const std::string& what);
// Reads one framed message, checking its length cap and CRC (DATA_LOSS). `*started` (optional)
// tells whether any byte of it arrived, i.e. whether an error left the stream mid-message.
absl::StatusOr<std::string> ReadMessage(const Socket& socket, std::chrono::milliseconds stall,
                                        const std::string& what, bool* started = nullptr);

}  // namespace rl::weight_sync
