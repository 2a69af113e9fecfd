// The weight-sync wire protocol over the TCP control channel (both backends).
//
// Every control message is framed as u32 body length, u32 CRC32C(body), body; integers are
// little-endian, strings are u32 length + bytes. Bodies:
//   Hello   (receiver → sender, once): u32 magic "RLWS", u16 version, u8 backend, i32 rank,
//           i32 world_size, str group_name.
//   Welcome (sender → receiver, once): u32 magic, u16 version, u32 code (absl::StatusCode, 0 =
//           joined), str message, str nccl_unique_id (empty for tcp). An error welcome is
//           sent right after a bad Hello; the OK one only when every rank has joined.
//   Frame   (sender → receiver, per bucket): u8 kind (1 bucket, 2 close), u64 seq; a bucket
//           adds u32 count, count × {str name, str dtype, u32 ndim, ndim × i64 dim, u64 bytes},
//           u64 payload_bytes, u32 payload CRC32C. tcp: payload_bytes raw bytes follow (the
//           tensors back to back in header order); nccl: one ncclBroadcast of that size.
//   Ack     (receiver → sender, per bucket): u8 kind 3, u64 seq, u32 code, str message.
// Decoders check the magic, version, lengths and that every per-tensor byte count equals
// numel × dtype size and they sum to payload_bytes, so a receiver never trusts an unchecked
// size. Messages are capped at 64 MiB.
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

inline constexpr uint32_t kMagic = 0x53574C52;  // "RLWS" little-endian
inline constexpr uint16_t kProtocolVersion = 1;
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
