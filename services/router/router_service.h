// rl.v1.Router: the trainers' entry point. Generate runs a Generation (generation.h: prompt
// resolution through the text cache, attempts and retries, the hold during admin broadcasts,
// the trajectory insert) on the gRPC callback API at both ends: the client's stream is a
// WriteQueueReactor, each worker call a ClientReadReactor, retry backoffs gRPC alarms, so no
// thread waits on a stream. The blocking work left (tokenizing long prompts, cache inserts) runs
// on a small fixed pool (`blocking`); AddWorker's check of the new worker runs on the bounded
// admin executor. Router.Abort forwarding is asynchronous too (router_abort.cc).
//
// Admission (admission.h): at most --max-in-flight generations run, --max-queued more wait in
// fair per-client queues (client: the `rl-client-id` header, else the peer), the rest are
// refused RESOURCE_EXHAUSTED at once. Flow control: a client that does not read its stream has
// at most --max-stream-buffer-bytes queued for it; beyond, its stream ends RESOURCE_EXHAUSTED
// and the worker call is cancelled (the worker aborts the request). Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "common/auth.h"
#include "common/bounded_executor.h"
#include "common/metrics.h"
#include "common/request_limits.h"
#include "common/tokenizer/tokenizer.h"
#include "rl/v1/router.grpc.pb.h"
#include "services/router/admission.h"
#include "services/router/cache/prompt_resolver.h"
#include "services/router/cache/text_cache.h"
#include "services/router/generation.h"
#include "services/router/request_table.h"
#include "services/router/worker_pool.h"

namespace rl::router {

// The metadata header that names a client for fair admission (else its peer address).
inline constexpr char kClientIdHeader[] = "rl-client-id";
inline constexpr size_t kMaxClientIdBytes = 128;

struct RouterServiceOptions {
  RetryOptions retry;
  RequestLimits limits;  // the --max-* request limits (checked before tokenization)
  AdmissionOptions admission;
  int64_t max_stream_buffer_bytes = 4 << 20;
  BoundedExecutor* blocking = nullptr;  // tokenization of long prompts, cache inserts
  BoundedExecutor* admin = nullptr;     // AddWorker checks
};

class RouterService final : public rl::v1::Router::CallbackService {
 public:
  RouterService(WorkerPool* pool, TextCache* cache, const tokenizer::Tokenizer* tokenizer,
                const BearerAuth* data_auth, const BearerAuth* admin_auth, MetricsRegistry* metrics,
                const RouterServiceOptions& options);
  ~RouterService() override;  // waits for the generations still winding down

  grpc::ServerWriteReactor<rl::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const rl::v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* RetrieveFromText(grpc::CallbackServerContext* context,
                                             const rl::v1::RetrieveFromTextRequest* request,
                                             rl::v1::RetrieveFromTextResponse* response) override;
  grpc::ServerUnaryReactor* AddWorker(grpc::CallbackServerContext* context,
                                      const rl::v1::AddWorkerRequest* request,
                                      rl::v1::WorkerListResponse* response) override;
  grpc::ServerUnaryReactor* RemoveWorker(grpc::CallbackServerContext* context,
                                         const rl::v1::RemoveWorkerRequest* request,
                                         rl::v1::WorkerListResponse* response) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* context,
                                        const rl::v1::ListWorkersRequest* request,
                                        rl::v1::WorkerListResponse* response) override;
  grpc::ServerUnaryReactor* SetWorkerEnabled(grpc::CallbackServerContext* context,
                                             const rl::v1::SetWorkerEnabledRequest* request,
                                             rl::v1::WorkerListResponse* response) override;
  grpc::ServerUnaryReactor* GetMetrics(grpc::CallbackServerContext* context,
                                       const rl::v1::GetMetricsRequest* request,
                                       rl::v1::GetMetricsResponse* response) override;
  // router_abort.cc
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* context,
                                  const rl::v1::AbortRequest* request,
                                  rl::v1::AbortResponse* response) override;
  // Router.Abort's work: forwards to the workers with asynchronous calls (no thread waits) and
  // calls `done` with the number aborted (on a gRPC thread, or inline when nothing is sent).
  void AbortRequests(const rl::v1::AbortRequest& request, std::optional<std::string> authorization,
                     std::function<void(absl::StatusOr<int32_t>)> done);

  // Router + cache figures (also rendered into the Prometheus registry).
  void FillMetrics(rl::v1::GetMetricsResponse* out) const;

  // Shared with the Generate reactor.
  const GenerationEnv* env() const { return &env_; }
  WorkerPool* pool() const { return pool_; }
  const RouterServiceOptions& options() const { return options_; }
  const BearerAuth* data_auth() const { return data_auth_; }
  Admission* admission() { return &admission_; }
  RequestTable* requests() { return &requests_; }
  // Generate streams alive (their reactors exist); WaitForGenerations blocks until none is
  // (after the server stopped taking calls: each winds down within a retry backoff).
  void EnterGeneration();
  void LeaveGeneration();
  void WaitForGenerations();
  Counter* requests_total;
  Counter* retries_total;
  Counter* failures_total;
  Counter* rejected_total;
  Counter* overflows_total;
  Gauge* in_flight;

 private:
  // RetrieveFromText with tokenize_remainder: the prompt a Generate of `text` would send.
  absl::Status ResolveForRetrieve(const std::string& text,
                                  rl::v1::RetrieveFromTextResponse* response);

  WorkerPool* pool_;
  TextCache* cache_;
  const tokenizer::Tokenizer* tokenizer_;
  const BearerAuth* data_auth_;
  const BearerAuth* admin_auth_;
  MetricsRegistry* metrics_;
  const RouterServiceOptions options_;
  const RequestLimits& limits_ = options_.limits;
  mutable SeamCounters seam_counters_;
  RequestTable requests_;
  Admission admission_;
  GenerationEnv env_;
  absl::Mutex live_mu_;
  int live_generations_ ABSL_GUARDED_BY(live_mu_) = 0;
  // Router.Abort calls forwarding now (bounded by kMaxAbortsInFlight).
  std::atomic<int> aborts_in_flight_{0};
};

}  // namespace rl::router
