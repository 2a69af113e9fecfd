// HealthChecker: the pool's active health checks. A check of one worker is gRPC health, then
// GetLoad for its weight version, both asynchronous calls under one deadline; the outcome goes
// to a sink (the pool applies it to the worker's state, worker_state.h). A thread runs a round
// over every worker each `interval`, all at once, or sooner when woken (a call failed, a
// connection dropped).
//
// Cost: a round holds no thread per worker and lasts at most one `timeout`, whatever the fleet
// size; two calls per worker per round. Thread-safe. The sink runs on gRPC threads; the checker
// (and what the sink touches) must outlive every probe it started.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "services/router/pool/worker.h"
#include "services/router/pool/worker_state.h"

namespace rl::router {

struct HealthCheckOptions {
  std::chrono::milliseconds interval{1000};  // between rounds
  std::chrono::milliseconds timeout{2000};   // deadline of one check (both calls)
};

class HealthChecker {
 public:
  // The workers a round checks.
  using Targets = std::function<std::vector<std::shared_ptr<Worker>>()>;
  // Applies one check's outcome.
  using Sink = std::function<void(const std::shared_ptr<Worker>&, const HealthReport&)>;

  // Starts the round thread.
  HealthChecker(const HealthCheckOptions& options, Targets targets, Sink sink);
  ~HealthChecker();  // stops the thread after the round in progress
  HealthChecker(const HealthChecker&) = delete;
  HealthChecker& operator=(const HealthChecker&) = delete;

  // Checks `w` now; `done` runs (on a gRPC thread) once the sink has the outcome.
  void ProbeAsync(const std::shared_ptr<Worker>& w, std::function<void()> done);
  // Checks `w` once and hands the outcome to `on_report` (on a gRPC thread) instead of the sink.
  void CheckAsync(const std::shared_ptr<Worker>& w,
                  std::function<void(const HealthReport&)> on_report);
  // CheckAsync, waited for (at most one timeout).
  HealthReport Check(const std::shared_ptr<Worker>& w);
  // ProbeAsync, waited for.
  void Probe(const std::shared_ptr<Worker>& w);
  // One round now, every target at once; returns when every outcome is applied.
  void CheckAll();
  // The thread's next round starts now instead of after the interval.
  void Wake() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const HealthCheckOptions options_;
  const Targets targets_;
  const Sink sink_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace rl::router
