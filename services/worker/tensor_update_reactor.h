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
// Cost: the stream's tensors are held in host memory until applied (at most --max-update-bytes);
// the finite scan reads each byte once more while it is in cache.
// Admission: `admitted` is the caller's key and admin lease (control/admin_lease.h), checked by
// AdminService before the first message; a stream not admitted is refused with it at once.
// Lifetime: deletes itself in OnDone; the services it uses outlive every call.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/bounded_executor.h"
#include "common/request_limits.h"
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
    NamedTensor tensor;
    int64_t received = 0;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    // Elements that straddle a chunk boundary, scanned once the tensor is complete.
    std::vector<int64_t> straddling;
  };

  // One message: the options (first only), a chunk, the end.
  absl::Status AddMessage();
  absl::Status AddChunk(const rl::v1::TensorChunk& c);
  // The end's counts against what arrived; every tensor complete.
  absl::Status CheckEnd(const rl::v1::TensorStreamEnd& end) const;
  // The stream is over (half-close, cancel, broken connection or a message that did not parse).
  void OnStreamEnded();
  absl::Status Apply();

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
  std::map<std::string, Pending> pending_;
  int64_t allocated_ = 0;   // bytes of the tensors in pending_, at most --max-update-bytes
  int64_t data_bytes_ = 0;  // data bytes of every chunk so far
};

}  // namespace rl::worker
