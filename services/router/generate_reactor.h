// The Router.Generate stream: one reactor per call, on the gRPC callback API at both ends. It
// admits the request (admission.h), then drives its Generation (generation.h): each attempt's
// worker call is a ClientReadReactor, each wait (retry backoff, admin hold) a gRPC alarm, and
// the blocking steps (tokenizing a long prompt, the final's cache insert) run on the blocking
// pool. The client's stream is a WriteQueueReactor with at most --max-stream-buffer-bytes queued
// for a client that does not read; beyond, the stream ends RESOURCE_EXHAUSTED and the worker
// call is cancelled. docs/routing.md follows a request through it.
// docs/life-of-a-request.md follows one request through every layer, with file names.
//
// Cost: no thread waits on a stream; per message, the Generation's decode and one queued write.
#pragma once

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/auth.h"
#include "common/bounded_executor.h"
#include "common/drain_gate.h"
#include "grpcpp/support/server_callback.h"
#include "rl/v1/router.grpc.pb.h"
#include "services/router/admission.h"
#include "services/router/generation.h"
#include "services/router/pool/worker_pool.h"
#include "services/router/router_metrics.h"

namespace rl::router {

// The metadata header that names a client for fair admission (else its peer address).
inline constexpr char kClientIdHeader[] = "rl-client-id";
inline constexpr size_t kMaxClientIdBytes = 128;
// The metadata header that carries a routing key when GenerateRequest.routing_key is empty
// (docs/routing.md, "Policies").
inline constexpr char kRoutingKeyHeader[] = "rl-routing-key";

// Generate streams alive (their reactors exist). Thread-safe.
class LiveGenerations {
 public:
  void Enter() ABSL_LOCKS_EXCLUDED(mu_);
  void Leave() ABSL_LOCKS_EXCLUDED(mu_);
  // Blocks until none is alive (after the server stopped taking calls: each winds down within
  // a retry backoff).
  void WaitForNone() ABSL_LOCKS_EXCLUDED(mu_);
  // WaitForNone for at most `timeout`; false when some are still alive.
  bool WaitForNoneFor(absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  int live_ ABSL_GUARDED_BY(mu_) = 0;
};

// What every Generate reactor uses; owned by the RouterService, outlives every reactor.
struct GenerateContext {
  const GenerationEnv* env = nullptr;
  WorkerPool* pool = nullptr;  // the fleet's version, the floor of every worker call
  const BearerAuth* data_auth = nullptr;
  Admission* admission = nullptr;
  BoundedExecutor* blocking = nullptr;
  int64_t max_stream_buffer_bytes = 4 << 20;
  RouterMetrics* metrics = nullptr;
  LiveGenerations* live = nullptr;
  const DrainGate* drain = nullptr;  // refuses new streams while the router drains (may be null)
  // --cache-store-failure refuse: while the durable store has failed (disk full, I/O error), a
  // text prompt (whose trajectory would not be durable) is refused UNAVAILABLE naming the store,
  // until the store recovers (cache_store.h); serve: answered, marked trajectory_not_durable.
  bool refuse_when_store_failed = false;
};

// A new reactor for one Router.Generate call (it deletes itself when done).
grpc::ServerWriteReactor<rl::v1::GenerateResponse>* StartGenerate(
    const GenerateContext* ctx, grpc::CallbackServerContext* context,
    const rl::v1::GenerateRequest& request);

}  // namespace rl::router
