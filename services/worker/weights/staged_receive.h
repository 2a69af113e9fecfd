// StagedReceive: the receiving half of a two-phase group update (PrepareWeightsUpdate posts it,
// CompleteWeightsUpdate waits for it and applies), plus the two steps every group receive
// shares: receiving buckets into host staging and applying staged tensors.
//
// A delta receive (issue 30) keeps its GroupDelta with it: the encoded tensors travel as their
// payloads, and Complete builds the update from them (GroupDeltaUpdate) through the one delta
// path every transport shares (publication.h, BuildOnServedCopy).
//
// Design: Post starts the receive on a thread of its own and returns once the first bucket's
// receive is posted (the transport waits for its header: tcp buffers what the trainer sends,
// nccl joins the broadcast after it), or with the receive's error when it ended first. The
// thread is owned and joined here, never detached; it is not on the worker's admin executor
// because it lives until Complete or Destroy, and a Prepare waiting for a queued receive could
// deadlock a full executor. Applying validates every tensor before changing any.
// Cost: every listed tensor is copied into host memory until it is applied (model bytes at most).
// Thread-safety: Post, Wait and the destructor from one owner at a time (the group's claim).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "common/request_limits.h"
#include "services/worker/model/model_runner.h"
#include "services/worker/weight_sync/weight_sync.h"
#include "services/worker/weights/weight_updates.h"

namespace rl::worker {

class StagedReceive {
 public:
  // Starts receiving `buckets` (see the file comment); with `delta`, the tensors it names
  // encoded arrive as their payloads. The error of a receive that ended before it was posted (a
  // closed or broken group), its thread joined.
  static absl::StatusOr<std::unique_ptr<StagedReceive>> Post(
      std::shared_ptr<weight_sync::WeightReceiver> receiver, WeightBuckets buckets,
      std::optional<GroupDelta> delta = std::nullopt);
  // Joins the thread: close the receiver first for a prompt return.
  ~StagedReceive();
  StagedReceive(const StagedReceive&) = delete;
  StagedReceive& operator=(const StagedReceive&) = delete;

  // Waits for the receive to end (bounded by the group's stall timeout); its status. After an
  // OK, tensors() holds every listed tensor in order.
  absl::Status Wait();
  const std::vector<NamedTensor>& tensors() const { return tensors_; }
  // Moves the received tensors out (a staged Complete keeps them as the staged version).
  std::vector<NamedTensor> TakeTensors() { return std::move(tensors_); }
  // The delta this receive carries (Post's), if any.
  const std::optional<GroupDelta>& delta() const { return delta_; }
  // The update a delta receive built after an OK Wait (GroupDeltaUpdate); moves the tensors out.
  DeltaUpdate TakeDeltaUpdate();

 private:
  StagedReceive() = default;

  std::thread thread_;
  // The thread writes posted_ before notifying settled_ (once: posted, or ended before
  // posting), and status_ and tensors_, read after join.
  absl::Notification settled_;
  bool posted_ = false;
  absl::Status status_;
  std::vector<NamedTensor> tensors_;
  std::optional<GroupDelta> delta_;  // set by Post, read by the thread and after
};

// Receives `buckets` in order, copying every tensor into `out`. `on_posted` (may be empty) runs
// once the first bucket's receive is posted. Every tensor is scanned for NaN / ±Inf while it is
// copied (in cache): a non-finite value fails the receive naming the tensor and the element,
// unless non-finite weights are allowed (model_io::NonFiniteWeightsAllowed,
// --allow-non-finite-weights). With `delta`, a tensor it names encoded travels as its payload
// (U8[payload_bytes] on the wire) and `out` holds that payload (its values are checked when the
// delta is applied).
absl::Status ReceiveBuckets(weight_sync::WeightReceiver* receiver, const WeightBuckets& buckets,
                            std::vector<NamedTensor>* out,
                            const std::function<void()>& on_posted = nullptr,
                            const GroupDelta* delta = nullptr);

// The checks of a delta receive that need no engine, before anything is posted: every encoded
// tensor is one the buckets list, its count and payload bytes fit its dtype and shape
// (weight_sync::MaxDeltaPayloadBytes), and the payloads together fit --max-update-bytes.
// INVALID_ARGUMENT naming the tensor.
absl::Status CheckGroupDelta(const WeightBuckets& buckets, const GroupDelta& delta,
                             const RequestLimits& limits);

// The DeltaUpdate of a delta receive: `received` (ReceiveBuckets' output) split into the delta
// payloads `delta` names encoded and the whole tensors, with its parent and manifest.
DeltaUpdate GroupDeltaUpdate(std::vector<NamedTensor> received, GroupDelta delta);

// Validates every staged tensor against `runner`'s weights, then writes them into it (nothing
// changes on a validation error).
absl::Status ApplyStaged(model::ModelRunner& runner, const std::vector<NamedTensor>& tensors);

}  // namespace rl::worker
