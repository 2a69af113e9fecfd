// The backend-independent halves of a joined group: bucket headers, checksums, acks, broken
// and closed states. Backends (tcp_transport.h, nccl_transport.h) only move payload bytes.
//
// Per bucket: the sender checksums the tensors once (CRC32C), sends the header frame to every
// receiver over its control socket, lets the backend move the payload, then reads one ack per
// receiver. A receiver reads the header, matches it against the caller's specs, lets the
// backend deliver (or, on a mismatch, consume and drop) the payload, checks the CRC, acks,
// and only then runs the per-tensor callbacks.
//
// Thread safety: Receive / Broadcast are serialized by a mutex; Close may run concurrently
// (it shuts the sockets down first so a pending call fails promptly, then waits for it).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "services/worker/weight_sync/group.h"
#include "services/worker/weight_sync/socket.h"
#include "services/worker/weight_sync/weight_sync.h"
#include "services/worker/weight_sync/wire.h"

namespace rl::weight_sync {

class ReceiverSession : public WeightReceiver {
 public:
  ReceiverSession(GroupOptions options, Socket control);
  ~ReceiverSession() override = default;

  using WeightReceiver::Receive;
  absl::Status Receive(const std::vector<TensorSpec>& specs, const TensorCallback& on_tensor,
                       const std::function<void()>& on_posted) final;
  void Close() final;
  const GroupOptions& options() const final { return options_; }

 protected:
  // Moves the payload of `header` off the wire. With `keep`, returns a host span of exactly
  // header.payload_bytes and sets `*crc` to its CRC32C; without, consumes and drops it (the
  // group must stay in step) and returns an empty span. The span stays valid until the next
  // call or ReleaseBackend.
  virtual absl::StatusOr<absl::Span<const uint8_t>> ReceivePayload(const BucketHeader& header,
                                                                   bool keep, uint32_t* crc) = 0;
  // Frees buffers and communicators; called once, under the session lock, from Close.
  virtual void ReleaseBackend() = 0;

  const Socket& control() const { return control_; }
  // Set as soon as Close starts; long waits poll it to give up promptly.
  const std::atomic<bool>* closing_flag() const { return &closing_; }
  std::chrono::milliseconds stall() const { return stall_; }

 private:
  absl::Status ReceiveLocked(const std::vector<TensorSpec>& specs, const TensorCallback& on_tensor,
                             const std::function<void()>& on_posted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records a stream-breaking error; later calls fail fast with it.
  absl::Status Break(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const GroupOptions options_;
  const std::chrono::milliseconds stall_;
  const std::string context_;
  Socket control_;
  std::atomic<bool> closing_{false};
  absl::Mutex mu_;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
};

class SenderSession : public WeightSender {
 public:
  SenderSession(GroupOptions options, BackendId backend);
  ~SenderSession() override = default;

  int port() const final { return port_; }
  absl::Status WaitForReceivers() final;
  absl::StatusOr<BroadcastStats> Broadcast(
      const std::vector<TensorSpec>& specs,
      const std::vector<absl::Span<const uint8_t>>& data) final;
  void Close() final;
  const GroupOptions& options() const final { return options_; }

  // Binds the listener; called once by the factory before the session is handed out.
  absl::Status Listen();

 protected:
  // Backend hooks. PrepareGroup runs before the Welcome goes out and returns the bytes the
  // receivers need to join the data plane (nccl: the ncclUniqueId); CompleteGroup runs after.
  virtual absl::StatusOr<std::string> PrepareGroup() = 0;
  virtual absl::Status CompleteGroup() = 0;
  // Sends `frame` (the encoded bucket header) and the payload to every receiver and reads
  // their acks with ReadAck; returns one status per receiver (index rank - 1). A status
  // carries UNAVAILABLE / DEADLINE_EXCEEDED / DATA_LOSS for I/O trouble, else the
  // receiver's own verdict.
  virtual std::vector<absl::Status> Transmit(
      const std::string& frame, uint64_t seq, int64_t payload_bytes,
      const std::vector<absl::Span<const uint8_t>>& data) = 0;
  virtual void ReleaseBackend() = 0;

  // Reads receiver `index`'s ack for bucket `seq`.
  absl::Status ReadAck(size_t index, uint64_t seq);

  std::vector<Socket>& receivers() { return receivers_; }
  // Set as soon as Close starts; long waits poll it to give up promptly.
  const std::atomic<bool>* closing_flag() const { return &closing_; }
  std::chrono::milliseconds stall() const { return stall_; }
  const std::string& context() const { return context_; }

 private:
  const GroupOptions options_;
  const BackendId backend_;
  const std::chrono::milliseconds stall_;
  std::string context_;
  int port_ = 0;
  std::atomic<bool> closing_{false};
  // Guards only the assignment of listener_ / receivers_ against Close's shutdowns; their use
  // on the data path is under mu_.
  absl::Mutex sockets_mu_;
  std::unique_ptr<GroupListener> listener_;
  std::vector<Socket> receivers_;
  absl::Mutex mu_ ABSL_ACQUIRED_BEFORE(sockets_mu_);
  bool ready_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<absl::Status> broken_ ABSL_GUARDED_BY(mu_);  // per receiver
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace rl::weight_sync
