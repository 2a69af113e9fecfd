// TensorUpdateReactor: one UpdateWeightsFromTensor call (client streaming): assembles the named
// tensors chunk by chunk and applies them through WeightUpdates only when the stream ended with
// its explicit end: the `end` message (TensorStreamEnd), whose counts must match what arrived,
// then the client's half-close. A stream that ends any other way (cancelled, past its deadline,
// a broken connection, a message that does not parse, a half-close without `end`) changes
// nothing: the old weights keep serving and the answer says why (docs/weight-updates.md).
// Design: every chunk is checked before anything is allocated for it (update_validation.h: a
// served weight with its exact shape, a known dtype; offset and size within the tensor, no
// overlap; the stream's total under --max-update-bytes); its data is scanned for NaN / ±Inf
// while it is copied (unless --allow-non-finite-weights); a tensor must arrive complete. A first
// message may carry the options alone. The apply, which waits for the engine, runs on the admin
// executor, never on a gRPC thread; a full executor answers RESOURCE_EXHAUSTED.
// Staged (`stage` in the first message, issue 30): the stream takes the worker's one staged slot
// at its first message (WeightUpdates::BeginStage: the previous staged version is freed, a second
// stage is refused) and, at its explicit end, stages the tensors instead of applying them; a
// stream cut any way before that releases the slot with nothing staged.
// Deltas (issue 30): a first message naming `parent_version` makes the stream a delta of that
// version (refused at once, FAILED_PRECONDITION naming both versions, unless it is served): its
// chunks carry per-tensor delta payloads (TensorChunk.encoding "overwrite" / "xor", the
// weights.rldelta encodings of common/weight_sync/delta.h; `offset` counts payload bytes) or
// whole tensors ("" / "dense"). A payload's size is bounded before it is allocated (the largest
// encoding of its count, --max-update-bytes); at the end every payload is checked whole and
// applied to a copy of the served weights (publication.h, BuildOnServedCopy), NaN / ±Inf
// refused, and the result verified against `manifest_json` when the stream carries one (a dense
// stream with a manifest is verified the same way) before it is applied or staged.
// Cost: the stream's tensors are held in host memory until applied (at most --max-update-bytes);
// the finite scan reads each byte once more while it is in cache.
// Admission: `admitted` is the caller's key and admin lease (control/admin_lease.h), checked by
// AdminService before the first message; a stream not admitted is refused with it at once.
// Lifetime: deletes itself in OnDone; the services it uses outlive every call.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/bounded_executor.h"
#include "common/request_limits.h"
#include "common/weight_sync/delta.h"
#include "common/weight_sync/manifest.h"
#include "rl/v1/admin.grpc.pb.h"
#include "services/worker/weights/weight_updates.h"

namespace rl::worker {

class TensorUpdateReactor final
    : public grpc::ServerReadReactor<rl::v1::UpdateWeightsFromTensorRequest> {
 public:
  TensorUpdateReactor(WeightUpdates& weights, const RequestLimits& limits,
                      BoundedExecutor& executor, absl::Status admitted,
                      bool allow_non_finite_weights, grpc::CallbackServerContext* context,
                      rl::v1::AdminResponse* response);

  void OnReadDone(bool ok) override;
  void OnDone() override { delete this; }

 private:
  struct Pending {
    NamedTensor tensor;  // a delta tensor: `bytes` holds its payload
    std::optional<weight_sync::DeltaEncoding> encoding;
    int64_t count = 0;
    int64_t received = 0;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    // Elements that straddle a chunk boundary, scanned once the tensor is complete.
    std::vector<int64_t> straddling;
  };

  // One message: the options (first only), a chunk, the end.
  absl::Status AddMessage();
  absl::Status AddChunk(const rl::v1::TensorChunk& c);
  // The first message's parent_version / manifest_json (a delta or verified stream).
  absl::Status TakeDeltaOptions();
  // A chunk of a tensor's delta payload.
  absl::Status AddDeltaChunk(const rl::v1::TensorChunk& c, weight_sync::DeltaEncoding encoding);
  // The end's counts against what arrived; every tensor complete.
  absl::Status CheckEnd(const rl::v1::TensorStreamEnd& end) const;
  // The stream is over (half-close, cancel, broken connection or a message that did not parse).
  void OnStreamEnded();
  absl::Status Apply();
  // Finishes a stream that applies and stages nothing.
  void FinishUnapplied(const grpc::Status& status);

  WeightUpdates& weights_;
  const RequestLimits& limits_;
  BoundedExecutor& executor_;
  const bool allow_non_finite_;
  grpc::CallbackServerContext* const context_;
  rl::v1::AdminResponse* response_;
  rl::v1::UpdateWeightsFromTensorRequest msg_;
  int64_t num_messages_ = 0;
  bool ended_ = false;  // the `end` message arrived and matched
  // The end's rank_sha256: a full-state stream (a peer's send), verified before the apply.
  std::string expected_rank_sha256_;
  UpdatePolicy policy_;
  // A delta stream's parent, and the result's manifest when the stream carries one: either
  // makes the stream build its result on a copy of the served weights (DeltaUpdate).
  std::optional<int64_t> parent_version_;
  std::optional<weight_sync::Manifest> manifest_;
  std::unique_ptr<StageTicket> stage_;  // a staged stream: the staged slot it holds
  std::map<std::string, Pending> pending_;
  int64_t allocated_ = 0;   // bytes of the tensors in pending_, at most --max-update-bytes
  int64_t data_bytes_ = 0;  // data bytes of every chunk so far
};

}  // namespace rl::worker
