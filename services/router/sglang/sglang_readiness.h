// Readiness of rl-router's SGLang side (the SMG gateway's way in), as rl-worker reports its own:
// the gateway should send a request only when the router can route it now. Ready = not draining
// and at least one routable worker (listed LIVE with no reason: live and not suspect, enabled,
// held by no admin broadcast, serving, at the fleet's version). SglangReadinessOf answers
// SGLang's HealthCheck RPC; ReadinessWatch publishes the same on grpc.health.v1 (the gateway's
// and a kubelet's probe) under the SGLang scheduler's service name and, on --sglang-port,
// rl.v1.Router; the overall status stays liveness. The router's main-port rl.v1.Router
// readiness does not follow the workers (admin calls must reach a router with none).
//
// Design: worker states change on the pool's health thread, admin broadcasts and failed calls,
// so the watch re-evaluates every interval (the router's --health-interval-ms) on its own thread
// and publishes only changes; Refresh publishes at once (Drain).
// Cost: one pool listing (O(#workers) under the pool's mutex) per interval and per HealthCheck.
// Thread-safe.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "services/router/pool/worker_pool.h"

namespace rl::router {

// The readiness service SGLang's own gRPC server reports (grpc.health.v1).
inline constexpr char kSglangReadinessService[] = "sglang.grpc.scheduler.SglangScheduler";

struct SglangReadiness {
  bool ready = false;
  std::string message;  // why not, or how many workers are routable
};

// What the SGLang side reports now.
SglangReadiness SglangReadinessOf(const WorkerPool& pool, bool draining);

class ReadinessWatch {
 public:
  // Evaluates `ready` now and every `interval`, calling `publish` with each value that differs
  // from the last one published (on the watch's thread, or Refresh's caller). Both must stay
  // valid until the watch is destroyed.
  ReadinessWatch(std::function<bool()> ready, std::function<void(bool)> publish,
                 std::chrono::milliseconds interval);
  ~ReadinessWatch();  // stops the thread; nothing is published after
  ReadinessWatch(const ReadinessWatch&) = delete;
  ReadinessWatch& operator=(const ReadinessWatch&) = delete;

  // Evaluates and publishes now.
  void Refresh() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void EvaluateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const std::function<bool()> ready_;
  const std::function<void(bool)> publish_;
  const std::chrono::milliseconds interval_;
  absl::Mutex mu_;  // one evaluation and publish at a time, in order
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<bool> published_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace rl::router
