// rl.v1.Router: the trainers' entry point. Generate resolves a text prompt with
// ResolveTextPrompt (cache/prompt_resolver.h: cached generated tokens and the turns they
// extend reused exactly, the rest encoded as the full text would be, decode(tokens) == text
// checked), streams the worker's output with text deltas decoded in the context of the prompt,
// and inserts the trajectory (prompt tokens mask 0, generated tokens mask 1 with their
// logprobs and per-token weight versions) under the response's weight version.
// When every attempt ended in a worker abort, the last attempt's final message (finish reason
// abort, partial output, attempts) is returned, not an error.
//
// Retries: a generation that fails UNAVAILABLE, or that a worker aborts, before anything was
// sent to the client is retried with exponential backoff on another live worker (any worker
// once all were tried), at most `max_attempts` times; after the first streamed message a
// failure is reported, never silently replayed. Finding no routable worker while an admin
// broadcast holds the pool (pause, weight update, group init) is not an attempt: the request
// waits for the broadcast to end, up to `hold_wait`, so a weight sync loses no request.
// Thread-safe. Generate runs its worker call on a thread of its own per request.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "common/auth.h"
#include "common/request_limits.h"
#include "common/metrics.h"
#include "common/tokenizer/tokenizer.h"
#include "rl/v1/router.grpc.pb.h"
#include "services/router/cache/prompt_resolver.h"
#include "services/router/cache/text_cache.h"
#include "services/router/request_table.h"
#include "services/router/worker_pool.h"

namespace rl::router {

struct RetryOptions {
  int max_attempts = 3;
  std::chrono::milliseconds backoff{50};
  std::chrono::milliseconds max_backoff{2000};
  std::chrono::milliseconds hold_wait{300000};
  std::chrono::milliseconds hold_poll{20};
};

class RouterService final : public rl::v1::Router::CallbackService {
 public:
  RouterService(WorkerPool* pool, TextCache* cache, const tokenizer::Tokenizer* tokenizer,
                const BearerAuth* data_auth, const BearerAuth* admin_auth, MetricsRegistry* metrics,
                RetryOptions retry);

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
  // Router.Abort's work (blocking: forwards to workers); returns the number aborted.
  absl::StatusOr<int32_t> AbortRequests(const rl::v1::AbortRequest& request,
                                        const std::optional<std::string>& authorization);

  // Router + cache figures (also rendered into the Prometheus registry).
  void FillMetrics(rl::v1::GetMetricsResponse* out) const;

  // Shared with the Generate reactor.
  WorkerPool* pool() const { return pool_; }
  TextCache* cache() const { return cache_; }
  const tokenizer::Tokenizer* tokenizer() const { return tokenizer_; }
  const RetryOptions& retry() const { return retry_; }
  SeamCounters* seam_counters() const { return &seam_counters_; }
  // The --max-* request limits (checked before tokenization); set once before serving.
  void set_limits(const RequestLimits& limits) { limits_ = limits; }
  const RequestLimits& limits() const { return limits_; }
  RequestTable* requests() { return &requests_; }
  Counter* requests_total;
  Counter* retries_total;
  Counter* failures_total;
  Gauge* in_flight;

 private:
  WorkerPool* pool_;
  TextCache* cache_;
  const tokenizer::Tokenizer* tokenizer_;
  const BearerAuth* data_auth_;
  const BearerAuth* admin_auth_;
  MetricsRegistry* metrics_;
  RetryOptions retry_;
  mutable SeamCounters seam_counters_;
  RequestLimits limits_;
  RequestTable requests_;
  // Router.Abort calls forwarding on their own thread now (bounded by kMaxAbortsInFlight).
  std::atomic<int> aborts_in_flight_{0};
};

}  // namespace rl::router
