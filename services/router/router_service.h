// rl.v1.Router: the trainers' entry point. Generate looks up the longest cached prefix of a
// text prompt (its tokens, loss masks and logprobs are reused exactly, never re-tokenized),
// tokenizes only the remainder, streams the worker's output with text deltas decoded in the
// context of the prompt, and inserts the trajectory (prompt tokens mask 0, generated tokens
// mask 1 with their logprobs) under the response's weight version.
//
// Retries: a generation that fails UNAVAILABLE, or that a worker aborts, before anything was
// sent to the client is retried with exponential backoff on another live worker (any worker
// once all were tried), at most `max_attempts` times; after the first streamed message a
// failure is reported, never silently replayed. Finding no routable worker while an admin
// broadcast holds the pool (pause, weight update, group init) is not an attempt: the request
// waits for the broadcast to end, up to `hold_wait`, so a weight sync loses no request.
// Thread-safe. Generate runs its worker call on a thread of its own per request.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "common/auth.h"
#include "common/metrics.h"
#include "common/tokenizer/tokenizer.h"
#include "rl/v1/router.grpc.pb.h"
#include "services/router/cache/text_cache.h"
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

  // Router + cache figures (also rendered into the Prometheus registry).
  void FillMetrics(rl::v1::GetMetricsResponse* out) const;

  // Shared with the Generate reactor.
  WorkerPool* pool() const { return pool_; }
  TextCache* cache() const { return cache_; }
  const tokenizer::Tokenizer* tokenizer() const { return tokenizer_; }
  const RetryOptions& retry() const { return retry_; }
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
};

}  // namespace rl::router
