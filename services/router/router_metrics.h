// RouterMetrics: the router's metrics in one table, named rl_router_<what>: the counters the
// Generate path records, and the gauges read at scrape time from the pool, the text cache, the
// admission queue and the prompt resolver's seam counters. Rendered as Prometheus text by the
// registry (the HTTP endpoint, GetMetrics) and as GetMetricsResponse fields by Fill.
//
// Cost: the Record calls are lock-free atomics; a scrape reads every gauge (the pool's list and
// the cache's stats under their locks). Thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "common/metrics.h"
#include "rl/v1/router.pb.h"
#include "services/router/admission.h"
#include "services/router/cache/prompt_resolver.h"
#include "services/router/cache/text_cache.h"
#include "services/router/pool/worker_pool.h"

namespace rl::router {

class RouterMetrics {
 public:
  // Registers every metric in `registry`; the gauges read the others at scrape time, so all of
  // them must outlive the registry's scrapes.
  RouterMetrics(MetricsRegistry* registry, const WorkerPool* pool, const TextCache* cache,
                const Admission* admission, const SeamCounters* seam);
  RouterMetrics(const RouterMetrics&) = delete;
  RouterMetrics& operator=(const RouterMetrics&) = delete;

  // A Generate request was admitted and its prompt resolved (it now runs).
  void RecordStarted() {
    requests_total_->Inc();
    in_flight_->Add(1);
  }
  // A running Generate request ended (`failed`: with an error status).
  void RecordEnded(bool failed) {
    in_flight_->Add(-1);
    if (failed) failures_total_->Inc();
  }
  // Admission refused a request (RESOURCE_EXHAUSTED).
  void RecordRejected() { rejected_total_->Inc(); }
  // A client that did not read its stream was cut off.
  void RecordOverflow() { overflows_total_->Inc(); }
  // A worker finished a completion of `prompt` prompt tokens, `cached` of them from its prefix
  // cache (rl_router_worker_*_tokens_total{worker}).
  void RecordPrefix(const std::string& worker, int64_t prompt, int64_t cached);
  // Drops a removed worker's series.
  void ForgetWorker(const std::string& worker);
  // Counted by the Generation itself (GenerationEnv::retries_total).
  Counter* retries_total() const { return retries_total_; }
  // Answers that said cache_history_unknown (GenerationEnv::history_unknown_total).
  Counter* history_unknown_total() const { return history_unknown_total_; }

  // GetMetrics' answer: router totals, every worker's status, the cache's figures and the whole
  // registry as Prometheus text.
  void Fill(rl::v1::GetMetricsResponse* out) const;

 private:
  MetricsRegistry* const registry_;
  const WorkerPool* const pool_;
  const TextCache* const cache_;
  const SeamCounters* const seam_;
  Counter* requests_total_;
  Counter* retries_total_;
  Counter* failures_total_;
  Counter* rejected_total_;
  Counter* overflows_total_;
  Counter* history_unknown_total_;
  Gauge* in_flight_;
};

}  // namespace rl::router
