// The worker's Prometheus metrics in one table: the registry, the counters and histograms
// recorded per finished request and per weight update, and the gauges read from the engine
// on every scrape. Served by MetricsHttpServer at /metrics.
//
// Thread-safety: Record* may be called from any thread (the metric types are thread-safe).
#pragma once

#include <functional>

#include "common/metrics.h"
#include "services/worker/engine/engine.h"

namespace rl::worker {

class WorkerMetrics {
 public:
  // Registers every metric. The gauges read `engine` (and `asleep`) at scrape time: both must
  // outlive this table's registry, or the registry's HTTP server must stop first.
  WorkerMetrics(engine::Engine* engine, std::function<bool()> asleep);
  WorkerMetrics(const WorkerMetrics&) = delete;
  WorkerMetrics& operator=(const WorkerMetrics&) = delete;

  // A Generate completion finished (any reason).
  void RecordFinished(const engine::GenerateResult& r);
  // A weight update took `seconds` (successful or not).
  void RecordUpdate(double seconds) { update_seconds_->Observe(seconds); }

  MetricsRegistry* registry() { return &registry_; }

 private:
  MetricsRegistry registry_;
  Counter* requests_total_;
  Counter* aborted_total_;
  Counter* prompt_tokens_total_;
  Counter* generated_tokens_total_;
  Counter* cached_tokens_total_;
  Histogram* ttft_seconds_;
  Histogram* per_token_seconds_;
  Histogram* e2e_seconds_;
  Histogram* update_seconds_;
};

}  // namespace rl::worker
