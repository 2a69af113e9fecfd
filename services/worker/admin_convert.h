// Translation between rl.v1.Admin protos and the worker's control-plane and weight-update
// domain structs (control/worker_control.h, weights/weight_updates.h). Pure functions, no
// state; every length or enum a request carries is checked here, naming the field.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rl/v1/admin.pb.h"
#include "services/worker/control/worker_control.h"
#include "services/worker/model/model_runner.h"
#include "services/worker/weights/weight_updates.h"
#include "services/worker/weights/weights_checker.h"

namespace rl::worker {

// AdminResponse of a successful call.
void ToProto(const AdminOutcome& outcome, rl::v1::AdminResponse* out);
// Fills `out` from `outcome` when it is OK; its status.
absl::Status FillFrom(const absl::StatusOr<AdminOutcome>& outcome, rl::v1::AdminResponse* out);

// The update policy of a weight-update request. Its flush_cache field is not read: every
// update flushes the prefix cache (KV computed with the old weights is never reused), whatever
// the request says (README "Semantics worth knowing"; UpdatePolicy).
template <typename Request>
UpdatePolicy PolicyFrom(const Request& req) {
  UpdatePolicy policy;
  if (req.has_weight_version()) policy.weight_version = req.weight_version();
  policy.abort_all_requests = req.abort_all_requests();
  if constexpr (requires { req.keep_pause(); }) policy.keep_pause = req.keep_pause();
  if constexpr (requires { req.keep_kv(); }) policy.keep_kv = req.keep_kv();
  return policy;
}

// A staged receive or stream (`stage`) takes no engine options: abort_all_requests,
// keep_pause and keep_kv belong to ActivateWeights (INVALID_ARGUMENT naming them).
absl::Status CheckStagePolicy(const UpdatePolicy& policy);
// PauseGeneration(drain)'s wait: drain_timeout_ms (default kDefaultDrainTimeout, at most
// kMaxDrainTimeout; negative or larger is INVALID_ARGUMENT).
inline constexpr int32_t kDefaultDrainTimeoutMs = 60000;
inline constexpr int32_t kMaxDrainTimeoutMs = 600000;
absl::StatusOr<absl::Duration> DrainTimeoutFrom(const rl::v1::PauseGenerationRequest& req);

// An InitWeightsUpdateGroup request; an unspecified backend is `default_backend`.
GroupRequest GroupRequestFrom(const rl::v1::InitWeightsUpdateGroupRequest& req,
                              const std::string& default_backend);
// The tensors of one UpdateWeightsFromDistributed bucket; INVALID_ARGUMENT when the lists'
// lengths differ.
absl::StatusOr<std::vector<model::TensorInfo>> SpecsFrom(
    const rl::v1::UpdateWeightsFromDistributedRequest& req);
// The buckets of a Prepare/ReceiveWeights request; INVALID_ARGUMENT when a bucket's lists differ
// in length.
absl::StatusOr<WeightBuckets> BucketsFrom(
    const google::protobuf::RepeatedPtrField<rl::v1::WeightBucket>& in);

// The delta of a ReceiveWeights{parent_version} request (issue 30): each bucket's encodings /
// delta_counts / payload_bytes (empty: every tensor whole; else one per tensor), and
// manifest_json parsed when set. INVALID_ARGUMENT naming the field.
absl::StatusOr<GroupDelta> GroupDeltaFrom(
    const google::protobuf::RepeatedPtrField<rl::v1::WeightBucket>& in, int64_t parent_version,
    const std::string& manifest_json);

absl::StatusOr<CheckerAction> FromProto(rl::v1::WeightsCheckerAction action);
void ToProto(const CheckerResult& result, rl::v1::WeightsCheckerResponse* out);
void ToProto(const std::vector<model::TensorInfo>& weights, rl::v1::ListWeightsResponse* out);

}  // namespace rl::worker
