// The tensor-stream fan-out of Admin.UpdateWeightsFromTensor on the router: the client's chunks
// are forwarded to every target worker as they arrive (a server read reactor in, one client
// write reactor per worker out), never buffered whole.
//
// Flow control: the next client message is read only once every worker still in the update has
// taken the previous one (its write completed); a worker whose stream fails is dropped from the
// update (its own result says why) and the others go on. Every message is checked against the
// router's --max-tensor-chunk-bytes / --max-update-bytes / --max-tensor-rank before it is
// forwarded. The workers' streams end with a half-close only when the client's stream ended with
// its explicit end (the `end` message, then the half-close); a stream cut any other way (cancel,
// deadline, broken connection, a malformed or refused message, --admin-load-timeout-ms before the
// end) cancels every worker's stream, so no worker applies anything. After the end each worker
// has --admin-load-timeout-ms to answer, else it is marked dead. docs/router-admin.md.
// A staged stream (`stage` in the first message) is relayed the same way; the workers stage it
// instead of applying it, and the broadcast that TensorRelayStart::stage selects is all or none.
//
// Cost: one message in router memory at a time (at most --max-tensor-chunk-bytes plus a header)
// plus one serialized copy per worker in gRPC's send buffers; no thread per worker (the broadcast
// holds one admin-executor thread for the stream's duration, under the admin lock).
#pragma once

#include <chrono>
#include <functional>

#include "absl/status/status.h"
#include "common/bounded_executor.h"
#include "common/request_limits.h"
#include "grpcpp/support/server_callback.h"
#include "rl/v1/admin.grpc.pb.h"
#include "services/router/admin/broadcast.h"
#include "services/router/pool/worker_pool.h"

namespace rl::router::admin {

// What the relay hands to the broadcast it starts once the first message arrived.
struct TensorRelayStart {
  bool keep_pause = false;  // the first message's option
  // The first message's `stage`: the workers stage the stream (no hold, no version recorded);
  // the broadcast is all or none (AdminService drops what the others staged when one fails).
  bool stage = false;
  // Starts one worker's forwarding stream (the broadcast's WorkerCall).
  WorkerCall call;
  // The broadcast calls it once every target's call has started (Plan::started).
  std::function<void(size_t)> started;
};

struct TensorRelayOptions {
  RequestLimits limits;
  // Bounds the stream's transfer (from the first message to the end) and, after the end, each
  // worker's answer (--admin-load-timeout-ms).
  std::chrono::milliseconds load_timeout{600000};
};

// Runs the broadcast (under the admin lock; blocks until every worker's call ended).
using StartTensorBroadcast = std::function<absl::Status(const TensorRelayStart&)>;

// The reactor of one client stream; `start` runs on `executor` after the first message. `pool`
// marks dead a worker that misses its deadline after the end. Deletes itself when done.
grpc::ServerReadReactor<rl::v1::UpdateWeightsFromTensorRequest>* NewTensorRelay(
    grpc::CallbackServerContext* context, StartTensorBroadcast start, BoundedExecutor* executor,
    WorkerPool* pool, TensorRelayOptions options);

// Finishes the call at once with `status` (a refused caller).
grpc::ServerReadReactor<rl::v1::UpdateWeightsFromTensorRequest>* NewRejectedTensorStream(
    const absl::Status& status);

}  // namespace rl::router::admin
