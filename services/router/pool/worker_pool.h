// WorkerPool: the router's registry of rl-worker processes and its picking. Each worker is a
// handle (worker.h: channels, in-flight count, open calls) and a WorkerState (worker_state.h:
// liveness, enablement, holds, health answer, version) kept here under one mutex. Pick filters
// the routable workers (live and not suspect, enabled, held by no admin call, serving, at the
// fleet's version, not excluded) and lets the RoutingPolicy choose (routing_policy.h:
// round-robin by default); a chosen worker whose connection is not READY (it may have restarted,
// at another version) becomes suspect and is not picked until a health check, run at once, has
// seen it again. Health checks (health_checker.h) and failed calls drive liveness; marking a
// worker dead cancels every call open to it.
//
// Fleet weights: the admin records the last successful fleet-wide update (SetFleetWeights,
// fleet_weights.h). A live worker behind it is never routed: when the source is replayable the
// pool hands it to the catch-up handler, else it is listed STALE until resynced; a worker that
// comes back live is handed over once too (its pause state). Observers hear of every change.
// docs/routing.md (states, picking, health) and docs/router-admin.md (catch-up) have the rules.
//
// Cost: Pick, List and the Worker* lookups are O(#workers) under the mutex. Thread-safe; the
// catch-up handler and observers are called without the mutex.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "rl/v1/router.pb.h"
#include "services/router/pool/fleet_weights.h"
#include "services/router/pool/health_checker.h"
#include "services/router/pool/routing_policy.h"
#include "services/router/pool/worker.h"
#include "services/router/pool/worker_state.h"

namespace rl::router {

struct PoolOptions {
  std::chrono::milliseconds health_interval{1000};
  std::chrono::milliseconds health_timeout{2000};
  int failure_threshold = 2;
  int success_threshold = 1;
};

// Where a generation's attempts get their worker (generation.h): the pool in the router, a
// fake in tests.
class WorkerSource {
 public:
  virtual ~WorkerSource() = default;
  // A routable worker for `request` (not one it excludes); an empty lease when none.
  virtual Lease Pick(const PickRequest& request) = 0;
  // True while an admin broadcast holds the pool (see WorkerPool::BeginHold).
  virtual bool held() const = 0;
  virtual void ReportFailure(Worker* w) = 0;
  virtual void ReportVersion(Worker* w, int64_t version) = 0;
};

class WorkerPool final : public WorkerSource {
 public:
  // `policy` null: round-robin. Starts the health thread.
  explicit WorkerPool(const PoolOptions& options, std::unique_ptr<RoutingPolicy> policy = nullptr);
  ~WorkerPool() override;  // stops the health thread

  // ---- registry ----
  // Adds (idempotent) and checks the worker once before returning; InvalidArgument for an
  // address that is not HOST:PORT.
  absl::Status Add(const std::string& address);
  // Add for many (start-up), the first checks concurrently; the first bad address's error.
  absl::Status AddAll(const std::vector<std::string>& addresses);
  absl::Status Remove(const std::string& address);  // NotFound when unknown
  // Operator switch (routing only: admin broadcasts still reach a disabled live worker).
  // Enabling also clears a "weights may be partial" disable. NotFound when unknown.
  absl::Status SetEnabled(const std::string& address, bool enabled);
  // Current state of every worker, sorted by address (reason filled when not routable).
  std::vector<rl::v1::WorkerStatus> List() const;
  void FillList(rl::v1::WorkerListResponse* out) const;
  // Live workers (enabled or not, behind or not): the targets of admin broadcasts.
  std::vector<std::shared_ptr<Worker>> LiveWorkers() const;
  std::shared_ptr<Worker> Find(const std::string& address) const;  // null when unknown
  bool IsEnabled(const std::string& address) const;                // false when unknown
  // A copy of a worker's state (tests, diagnostics); nullopt when unknown.
  std::optional<WorkerState> StateOf(const std::string& address) const;

  // ---- picking ----
  Lease Pick(const PickRequest& request) override;
  Lease Pick() { return Pick(PickRequest{}); }
  // An admin broadcast that takes workers out of routing holds the pool (nested). While held,
  // a request that finds no routable worker waits for the broadcast instead of failing.
  void BeginHold() { holds_.fetch_add(1); }
  void EndHold() { holds_.fetch_sub(1); }
  bool held() const override { return holds_.load() > 0; }
  // One admin call takes `w` out of routing (Hold) until it ends (Release); nested.
  void Hold(Worker* w);
  void Release(Worker* w);
  // Disables a worker whose weights may be partial; the reason shows in ListWorkers until an
  // operator enables it or a resync succeeds (ClearPartial).
  void DisablePartial(Worker* w, const std::string& reason);
  void ClearPartial(Worker* w);

  // ---- health ----
  // A call to `w` failed with UNAVAILABLE: not routed until the next health check passes (it
  // may be restarting, at another weight version); dead after `failure_threshold` of them.
  void ReportFailure(Worker* w) override;
  // `w` missed an admin deadline or hangs: dead now (its calls are cancelled, also when it was
  // removed from the pool meanwhile); health checks bring it back once it answers again.
  void MarkDead(Worker* w, const std::string& reason);
  // `w` reported weight `version` (responses, admin results).
  void ReportVersion(Worker* w, int64_t version) override;
  // Checks one worker now (health + version), as the health thread does; ProbeAsync runs
  // `done` on a gRPC thread once the outcome is applied (the pool must outlive it).
  void Probe(const std::shared_ptr<Worker>& w) { health_->Probe(w); }
  void ProbeAsync(const std::shared_ptr<Worker>& w, std::function<void()> done) {
    health_->ProbeAsync(w, std::move(done));
  }
  // One health round now, every worker at once (tests; the thread does this every interval).
  void CheckAll() { health_->CheckAll(); }
  // True when live workers report different weight versions.
  bool VersionMismatch() const;

  // ---- fleet weights and the catch-up hand-off ----
  void SetFleetWeights(const FleetWeights& fleet);
  FleetWeights fleet_weights() const;
  // The recorded fleet version alone (-1 when none), without copying the source: per request.
  int64_t fleet_version() const;
  // True when `w` reports a version older than the fleet's.
  bool Behind(Worker* w) const;
  void SetCatchUpHandler(CatchUpHandler handler);
  // The catch-up handler is done with `w`: health checks hand it over again while it is behind.
  void FinishSync(Worker* w);
  // `observer` hears of every later SetFleetWeights until removed; it must outlive that.
  void AddObserver(FleetObserver* observer);
  void RemoveObserver(FleetObserver* observer);

 private:
  struct Entry {
    std::shared_ptr<Worker> worker;
    WorkerState state;
  };

  Entry* FindLocked(const Worker* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Entry* FindLocked(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const Entry* FindLocked(const std::string& address) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The newest weight version among live workers (-1 when none is live).
  int64_t NewestLiveVersionLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool EligibleLocked(const Entry& e, const PickRequest& request) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  rl::v1::WorkerStatus StatusLocked(const Entry& e, int64_t newest_live) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Cancels the calls of a worker that a transition just killed (under mu_, as before any
  // later call could register).
  void OnChange(Entry* e, WorkerState::Change change) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies one health check's outcome, then offers the worker for catch-up.
  void ApplyCheck(const std::shared_ptr<Worker>& w, const HealthReport& report)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Hands `w` to the catch-up handler when it is live, behind a replayable fleet version or just
  // rejoined, and not syncing already.
  void MaybeCatchUp(const std::shared_ptr<Worker>& w) ABSL_LOCKS_EXCLUDED(mu_, handoff_mu_);
  std::vector<std::shared_ptr<Worker>> Snapshot() const ABSL_LOCKS_EXCLUDED(mu_);

  const PoolOptions options_;
  const HealthThresholds thresholds_;
  mutable absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);  // sorted by address
  const std::unique_ptr<RoutingPolicy> policy_ ABSL_PT_GUARDED_BY(mu_);
  FleetWeights fleet_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> holds_{0};
  // Deliveries to the catch-up handler and the observers, in order; taken before mu_ (never
  // while holding it).
  absl::Mutex handoff_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  CatchUpHandler catch_up_ ABSL_GUARDED_BY(handoff_mu_);
  std::vector<FleetObserver*> observers_ ABSL_GUARDED_BY(handoff_mu_);
  std::unique_ptr<HealthChecker> health_;  // last: its thread stops first
};

}  // namespace rl::router
