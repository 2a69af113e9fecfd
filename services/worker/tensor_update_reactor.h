// TensorUpdateReactor: one UpdateWeightsFromTensor call (client streaming): assembles the named
// tensors chunk by chunk, then applies them through WeightUpdates when the client half-closes.
// Design: every chunk is checked before anything is allocated for it (update_validation.h: a
// served weight with its exact shape, a known dtype; offset and size within the tensor, no
// overlap; the stream's total under --max-update-bytes); a tensor must arrive complete. The
// apply, which waits for the engine, runs on the admin executor, never on a gRPC thread; a full
// executor answers RESOURCE_EXHAUSTED.
// Cost: the stream's tensors are held in host memory until applied (at most --max-update-bytes).
// Lifetime: deletes itself in OnDone; the services it uses outlive every call.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/auth.h"
#include "common/bounded_executor.h"
#include "common/request_limits.h"
#include "rl/v1/admin.grpc.pb.h"
#include "services/worker/weights/weight_updates.h"

namespace rl::worker {

class TensorUpdateReactor final
    : public grpc::ServerReadReactor<rl::v1::UpdateWeightsFromTensorRequest> {
 public:
  TensorUpdateReactor(WeightUpdates& weights, const RequestLimits& limits,
                      BoundedExecutor& executor, const BearerAuth& auth,
                      grpc::CallbackServerContext* context, rl::v1::AdminResponse* response);

  void OnReadDone(bool ok) override;
  void OnDone() override { delete this; }

 private:
  struct Pending {
    NamedTensor tensor;
    int64_t received = 0;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
  };

  absl::Status AddChunk();
  absl::Status Apply();

  WeightUpdates& weights_;
  const RequestLimits& limits_;
  BoundedExecutor& executor_;
  rl::v1::AdminResponse* response_;
  rl::v1::UpdateWeightsFromTensorRequest msg_;
  bool first_ = true;
  UpdatePolicy policy_;
  std::map<std::string, Pending> pending_;
  int64_t allocated_ = 0;  // bytes of the tensors in pending_, at most --max-update-bytes
};

}  // namespace rl::worker
