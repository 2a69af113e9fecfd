// The nccl backend (built when CUDA and NCCL are found): bucket payloads move with one
// ncclBroadcast from rank 0 per bucket; the TCP control channel carries the ncclUniqueId (in
// the Welcome), the bucket headers and the acks (session.h).
//
// Group init is eager: every rank creates its communicator with ncclCommInitRankConfig in
// non-blocking mode right after the handshake and polls ncclCommGetAsyncError until it is
// ready, aborting it (ncclCommAbort) when GroupOptions::timeout passes, so init never hangs.
// Collectives are bounded the same way by the stall timeout; a timed-out or failed collective
// aborts the communicator and breaks the group. NCCL_* environment variables apply as usual
// and must agree between trainer and workers (e.g. NCCL_CUMEM_ENABLE).
//
// Buffers: the sender copies each bucket from the caller's host spans into a device staging
// buffer and broadcasts it; a receiver broadcasts into its device staging buffer, then copies
// it to a pinned host buffer that the on_tensor callback reads (host bytes, like tcp; a later
// device-pointer callback can skip that copy). Both staging buffers grow to the largest
// bucket and are freed on Close. NCCL refuses two ranks on one GPU: each rank needs its own
// device (GroupOptions::cuda_device).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "services/worker/weight_sync/weight_sync.h"

namespace rl::weight_sync {

absl::StatusOr<std::unique_ptr<WeightReceiver>> ConnectNcclReceiver(const GroupOptions& options);
absl::StatusOr<std::unique_ptr<WeightSender>> CreateNcclSender(const GroupOptions& options);

}  // namespace rl::weight_sync
