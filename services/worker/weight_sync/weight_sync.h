// Weight-sync transport: moves tensor bytes from the trainer (rank 0) to rl-worker processes
// while only metadata travels over gRPC (DESIGN.md: InitWeightsUpdateGroup /
// UpdateWeightsFromDistributed / DestroyWeightsUpdateGroup).
//
// A group is one WeightSender (rank 0, the trainer) and world_size - 1 WeightReceivers (ranks
// 1..world_size-1, one per worker; rank = the worker's rank_offset). Both backends rendezvous
// with a TCP handshake on master_address:master_port and keep that connection as the control
// channel (bucket headers, acks). `tcp` streams the bucket bytes over it too; `nccl` moves
// them with ncclBroadcast from rank 0 (eager communicator creation at group init, the
// ncclUniqueId travels in the handshake). The wire format is in wire.h.
//
// Invariants: a receiver hands bytes to its callback only after the bucket header matched the
// caller's specs exactly (count, order, name, dtype, shape, byte length) and the payload's
// CRC32C matched; a mismatch is an error, never partial or silent data. A receiver that
// rejects a bucket still consumes it, so the group stays in step for the next one. Every wait
// is bounded: group formation by `timeout`, a peer that stops making progress by
// `stall_timeout`. After an I/O error (lost connection, stall mid-bucket) the group is broken:
// later calls fail fast with FAILED_PRECONDITION until it is destroyed and joined again.
//
// Cost: a receiver keeps one host staging buffer the size of the largest bucket it received
// (nccl: plus a device buffer of the same size), freed on Close. tcp moves each byte once per
// receiver through the kernel with ≥ 1 MiB syscalls; the sender serves receivers from one
// thread each. CRC32C runs at ~8 GB/s per core on both ends.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/weight_sync/tensor_spec.h"  // TensorSpec, TensorBytes, DescribeSpec

namespace rl::weight_sync {

struct GroupOptions {
  std::string backend = "tcp";  // "tcp" | "nccl"
  // Sender: the address to bind ("0.0.0.0" for all). Receiver: the sender's address.
  std::string master_address = "127.0.0.1";
  int master_port = 0;  // sender: 0 binds an ephemeral port (WeightSender::port())
  int rank = 0;         // 0 for the sender; a receiver's rank_offset in [1, world_size)
  int world_size = 2;   // trainer + receivers
  std::string group_name;
  // Bound on forming the group: connecting, the handshake, every rank joining and (nccl) the
  // communicator creation.
  std::chrono::milliseconds timeout{60000};
  // Bound on a data-plane wait that makes no progress (a bucket that does not start, a peer
  // that stops mid-bucket, a missing ack). Zero: use `timeout`.
  std::chrono::milliseconds stall_timeout{0};
  int cuda_device = 0;  // nccl: the device this rank's communicator and staging buffers use
};

// Checks the fields a sender (rank 0) or receiver (rank ≥ 1) needs; InvalidArgument naming
// the field otherwise.
absl::Status ValidateGroupOptions(const GroupOptions& options);

// Called once per tensor of a verified bucket, in the bucket's order. `bytes` holds exactly
// TensorBytes(spec) bytes and stays valid only during the call. An error stops the bucket
// and is returned by Receive.
using TensorCallback =
    std::function<absl::Status(const TensorSpec& spec, absl::Span<const uint8_t> bytes)>;

// The worker side of a group (rank ≥ 1).
class WeightReceiver {
 public:
  virtual ~WeightReceiver() = default;

  // Receives the next bucket the sender broadcasts and checks it against `specs` (the
  // metadata UpdateWeightsFromDistributed carried). On a match with a good checksum, calls
  // `on_tensor` for every tensor, then returns its first error or OK. Errors: INVALID_ARGUMENT
  // when the bucket's metadata differs from `specs` (the message names the first difference)
  // or `specs` itself is invalid; DATA_LOSS for a checksum mismatch; DEADLINE_EXCEEDED when
  // the sender stalls; UNAVAILABLE when the connection breaks; FAILED_PRECONDITION after
  // Close, after the sender closed the group, or when an earlier error broke it.
  // Not reentrant: one Receive at a time per receiver.
  // `on_posted` (may be empty) runs once the receive is posted: the group was found usable
  // and the receiver waits for the bucket (a closed or broken group fails without calling it).
  virtual absl::Status Receive(const std::vector<TensorSpec>& specs,
                               const TensorCallback& on_tensor,
                               const std::function<void()>& on_posted) = 0;
  absl::Status Receive(const std::vector<TensorSpec>& specs, const TensorCallback& on_tensor) {
    return Receive(specs, on_tensor, nullptr);
  }

  // Leaves the group and frees the staging buffers. Safe to call from another thread while
  // Receive runs (that Receive then fails promptly); the receiver must outlive both calls.
  // Idempotent.
  virtual void Close() = 0;

  virtual const GroupOptions& options() const = 0;
};

// Joins the group `options` describes as rank options.rank: connects to the sender (retrying
// refused connections until `timeout`), performs the handshake, waits until every rank has
// joined and, for nccl, creates the communicator. Errors name the address, the group and the
// elapsed time: DEADLINE_EXCEEDED when no group formed in time, INVALID_ARGUMENT /
// ALREADY_EXISTS when the sender refused the handshake (group name, rank, world size,
// backend), UNIMPLEMENTED for nccl in a build without NCCL, FAILED_PRECONDITION for nccl
// without a CUDA device.
absl::StatusOr<std::unique_ptr<WeightReceiver>> ConnectReceiver(const GroupOptions& options);

// Totals over one Broadcast, for logs and throughput figures.
struct BroadcastStats {
  int64_t bytes = 0;     // payload bytes of the bucket (sent once per receiver)
  double seconds = 0.0;  // from checksumming the bucket to the last receiver's ack
};

// The trainer side of a group (rank 0).
class WeightSender {
 public:
  virtual ~WeightSender() = default;

  // Binds and listens on master_address:master_port (options.rank must be 0). Returns at
  // once; receivers may connect from then on.
  static absl::StatusOr<std::unique_ptr<WeightSender>> Create(const GroupOptions& options);

  // The bound port (the ephemeral one when master_port was 0).
  virtual int port() const = 0;

  // Waits until world_size - 1 receivers with distinct ranks have joined (refusing handshakes
  // with another group name, backend or world size, a rank out of range or already taken),
  // then completes the group (nccl: creates the communicator). DEADLINE_EXCEEDED after
  // `timeout`, listing the ranks still missing. Call once.
  virtual absl::Status WaitForReceivers() = 0;

  // Sends one bucket to every receiver: specs[i] describes data[i] (exactly TensorBytes
  // bytes). Returns once every receiver acknowledged the bucket; an error names each rank
  // that failed or rejected it. The spans are only read during the call.
  virtual absl::StatusOr<BroadcastStats> Broadcast(
      const std::vector<TensorSpec>& specs, const std::vector<absl::Span<const uint8_t>>& data) = 0;

  // Tells receivers the group is over (their pending Receive fails with FAILED_PRECONDITION)
  // and releases sockets and communicators. Idempotent.
  virtual void Close() = 0;

  virtual const GroupOptions& options() const = 0;
};

// Whether this build has the nccl backend, and the number of CUDA devices it sees (0 without
// CUDA, without a driver or without devices).
bool NcclBackendBuilt();
int NumCudaDevices();

}  // namespace rl::weight_sync
