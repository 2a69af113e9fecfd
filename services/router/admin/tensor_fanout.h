// The tensor-stream fan-out of Admin.UpdateWeightsFromTensor: the client's stream of chunks is
// buffered whole (server read reactor), then replayed to every target worker as a client stream
// of its own (client write reactor), all workers at once.
//
// Cost: the whole stream is held in router memory for the broadcast's duration (each message is
// bounded by the server's message limit, their number only by the client); one write in flight
// per worker.
#pragma once

#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "common/bounded_executor.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/server_callback.h"
#include "rl/v1/admin.grpc.pb.h"
#include "services/router/pool/worker.h"

namespace rl::router::admin {

using TensorChunks = std::vector<rl::v1::UpdateWeightsFromTensorRequest>;

// Reads the client's whole stream, then runs `apply` over it on `executor` and finishes the call
// with its status (RESOURCE_EXHAUSTED when the executor is full). Deletes itself when done.
grpc::ServerReadReactor<rl::v1::UpdateWeightsFromTensorRequest>* NewTensorFanout(
    std::function<absl::Status(const TensorChunks&)> apply, BoundedExecutor* executor);

// Finishes the call at once with `status` (a refused caller).
grpc::ServerReadReactor<rl::v1::UpdateWeightsFromTensorRequest>* NewRejectedTensorStream(
    const absl::Status& status);

// Streams `chunks` to `w` (Admin.UpdateWeightsFromTensor) under `ctx`; `done` gets the call's
// status. `chunks`, `ctx` and `resp` must outlive `done`.
void ReplayTensorStream(Worker& w, const TensorChunks* chunks, grpc::ClientContext* ctx,
                        rl::v1::AdminResponse* resp, std::function<void(grpc::Status)> done);

}  // namespace rl::router::admin
