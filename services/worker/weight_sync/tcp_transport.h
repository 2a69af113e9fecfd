// The tcp backend: bucket payloads stream over the same sockets as the control messages.
//
// Sender: one thread per receiver writes the header and then the tensors straight from the
// caller's spans (sendmsg scatter-gather, ≤ 16 MiB per call, no copy), then reads that
// receiver's ack. Receiver: recv() ≤ 4 MiB at a time into a host staging buffer sized to the
// largest bucket seen, checksumming each chunk as it lands; a rejected bucket is drained
// through a 4 MiB scratch buffer instead. Works everywhere; the tests' transport.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "services/worker/weight_sync/weight_sync.h"

namespace rl::weight_sync {

absl::StatusOr<std::unique_ptr<WeightReceiver>> ConnectTcpReceiver(const GroupOptions& options);
absl::StatusOr<std::unique_ptr<WeightSender>> CreateTcpSender(const GroupOptions& options);

}  // namespace rl::weight_sync
