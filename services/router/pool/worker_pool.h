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
// fleet_weights.h). A worker whose version differs from the fleet's (the recorded one, else the
// newest among live workers) is never routed, logged once with the reason and listed: behind a
// version it can be brought to (from the fleet's folder, or from a live peer at that version
// when the version came from a tensor stream or a group) the pool hands it to the catch-up
// handler (SYNCING), behind another (no peer holds it) it is STALE until resynced, otherwise
// VERSION_MISMATCH; a worker that comes back live is handed over once too (its pause state).
// Observers hear of every change.
//
// Worker identity (GetLoad's instance_id and weights_sha256): a live worker that answers with a
// new instance_id restarted since its last check (even within one health interval): its calls
// to the old process end and it rejoins as after a revival (catch-up hand-off). The pool learns
// the fleet's digest at the reference version (the first one a live worker at that version
// reports; relearned when the version moves); a live worker at that version reporting another
// known digest holds other content under the same number: listed VERSION_MISMATCH with the
// reason, never routed, counted by DigestMismatches. A worker that reports no digest ("") is
// not judged.
//
// Capacity: the sum over registered workers of the requests each runs at once (GetLoad's
// max_running_requests; kDefaultWorkerCapacity until reported), for the router's automatic
// admission bound; a capacity observer hears of every change.
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
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "rl/v1/router.pb.h"
#include "services/router/pool/fleet_weights.h"
#include "services/router/pool/health_checker.h"
#include "services/router/pool/routing_policy.h"
#include "services/router/pool/worker.h"
#include "services/router/pool/worker_state.h"

namespace rl::router {

// A worker's capacity until it reports one (rl-worker's default --max-running-requests).
inline constexpr int32_t kDefaultWorkerCapacity = 256;

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
  // The weight versions of the workers routable now, whatever a request accepts (sorted,
  // unique): what a version-constrained request that found no worker is told is available.
  virtual std::vector<int64_t> RoutableVersions() const { return {}; }
};

// What the routing policy did since the pool started (docs/routing.md, "Policies").
struct RoutingStats {
  int64_t picks = 0;        // workers picked (retries included)
  int64_t keyed_picks = 0;  // placed by a preference (key, group, trajectory, cached prefix)
  int64_t key_moves = 0;    // a preferred worker was over the load bound
  // Mean over picks of max / mean load (samples in flight) of the candidates, right after the
  // pick (0 before the first pick).
  double mean_load_spread = 0;
};

class WorkerPool final : public WorkerSource {
 public:
  // `policy` null: round-robin (routing_policy.h has the others). Starts the health thread.
  explicit WorkerPool(const PoolOptions& options, std::unique_ptr<RoutingPolicy> policy = nullptr);
  ~WorkerPool() override;  // stops the health thread

  // ---- registry ----
  // Adds (idempotent) and checks the worker once before returning; InvalidArgument for an
  // address that is not HOST:PORT. Start-up (--worker): the worker may not be up yet.
  absl::Status Add(const std::string& address);
  // AddWorker: checks the address first (one health check, bounded by the health timeout) and
  // registers it only when an rl-worker answered: INVALID_ARGUMENT for a server that is not an
  // rl-worker (no rl.v1.Worker service, e.g. an rl-router), UNAVAILABLE for no answer unless
  // `allow_unreachable` (then it is registered and listed DEAD until it answers). A registered
  // address is OK at once.
  absl::Status AddChecked(const std::string& address, bool allow_unreachable);
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
  std::vector<int64_t> RoutableVersions() const override;
  // An admin broadcast that takes workers out of routing holds the pool (nested). While held,
  // a request that finds no routable worker waits for the broadcast instead of failing.
  void BeginHold() { holds_.fetch_add(1); }
  // The last hold ending logs the workers whose version differs from the fleet's (once each).
  void EndHold();
  bool held() const override { return holds_.load() > 0; }
  // One admin call takes `w` out of routing (Hold) until it ends (Release); nested.
  void Hold(Worker* w);
  void Release(Worker* w);
  // Disables a worker whose weights may be partial; the reason shows in ListWorkers until an
  // operator enables it or a resync succeeds (ClearPartial).
  void DisablePartial(Worker* w, const std::string& reason);
  void ClearPartial(Worker* w);

  // ---- routing figures ----
  // The policy's configuration, fixed at construction (read without the lock).
  const char* policy_name() const { return policy_config_.name; }
  double policy_load_factor() const { return policy_config_.load_factor; }
  int32_t policy_load_slack() const { return policy_config_.load_slack; }
  RoutingStats routing_stats() const;
  // Max / mean load (samples in flight) of the routable workers now; 0 when none is loaded.
  double LoadSpread() const;

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
  // Live workers at the fleet's version whose weights digest differs from the fleet's (see the
  // file comment): out of routing.
  int64_t DigestMismatches() const;
  // The fleet's digest as learned ("" none yet) and the version it is for.
  std::string ReferenceDigest() const;
  // The fleet's version for routing: the recorded one, else the newest among live workers (-1:
  // none known).
  int64_t ReferenceVersion() const;

  // ---- capacity ----
  // Requests the registered workers run at once, summed (see the file comment).
  int64_t Capacity() const;
  // `observer` hears of every capacity change (with the new capacity), on the thread that made
  // it, without the pool's lock held; set it before workers are added.
  void SetCapacityObserver(std::function<void(int64_t)> observer);

  // ---- fleet weights and the catch-up hand-off ----
  void SetFleetWeights(const FleetWeights& fleet);
  FleetWeights fleet_weights() const;
  // The operator's decision on a live worker AHEAD of the fleet's recorded version
  // (VERSION_MISMATCH): its version becomes the fleet's, from `model_path` (the folder that holds
  // it: the others are caught up from it) or, when empty, from a source the router cannot replay
  // (the others are STALE until resynced). Returns the new record. NotFound for an unknown
  // address; FailedPrecondition while an admin broadcast holds the pool, or for a worker that is
  // not live, has reported no version, or is not ahead of the fleet's version.
  absl::StatusOr<FleetWeights> AdoptWorkerVersion(const std::string& address,
                                                  const std::string& model_path);
  // The recorded fleet version alone (-1 when none), without copying the source: per request.
  int64_t fleet_version() const;
  // The fleet's pause state (the admin's pause / continue broadcasts set it; recovered at
  // start-up). Workers that report paused while the fleet is not are out of routing; a
  // continue clears every worker's paused mark (the broadcast reached every live worker).
  void SetFleetPaused(bool paused) ABSL_LOCKS_EXCLUDED(mu_, handoff_mu_);
  bool fleet_paused() const ABSL_LOCKS_EXCLUDED(mu_);
  // True when `w` reports a version older than the fleet's.
  bool Behind(Worker* w) const;
  // Workers that can send the fleet's weights to `except` (peer catch-up): live and not suspect,
  // enabled, serving (not asleep, updating or draining), not syncing, at exactly `version`;
  // least loaded first.
  std::vector<std::shared_ptr<Worker>> PeersAt(int64_t version, const Worker* except) const;
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
    bool version_warned = false;  // its version mismatch was logged
    bool digest_warned = false;   // its digest mismatch was logged
  };

  Entry* FindLocked(const Worker* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Entry* FindLocked(const std::string& address) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const Entry* FindLocked(const std::string& address) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The newest weight version among live workers (-1 when none is live).
  int64_t NewestLiveVersionLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  int64_t ReferenceVersionLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool EligibleLocked(const Entry& e, const PickRequest& request, int64_t reference) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Routable at `reference` and not holding other content under the fleet's version number.
  bool RoutableLocked(const Entry& e, int64_t reference) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Live, at the version the fleet's digest is for, reporting another known digest.
  bool DigestDiffersLocked(const Entry& e) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Follows the reference version: forgets the digest when it moved, learns it from the live
  // workers at that version when unknown.
  void LearnDigestLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  rl::v1::WorkerStatus StatusLocked(const Entry& e, int64_t reference) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // True when `e` is behind the fleet and can be caught up now: from the fleet's folder, or from
  // a peer at the fleet's version (tensor or distributed updates exist only in memory).
  bool CatchableLocked(const Entry& e) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool IsPeerLocked(const Entry& e, int64_t version) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Why a live worker at `e`'s version is not routed when it differs from `reference`.
  std::string VersionReasonLocked(const Entry& e, int64_t reference) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Logs, once per worker, each live worker that starts to differ from the fleet's version
  // (not while an admin broadcast holds the pool: versions move then).
  void WarnVersionsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t CapacityLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Tells the capacity observer when the capacity changed.
  void NotifyCapacity() ABSL_LOCKS_EXCLUDED(mu_);
  // Registers `w` (unless known) and applies `first` (a check made before), then probes it
  // until the success threshold.
  void Insert(const std::shared_ptr<Worker>& w, const HealthReport* first) ABSL_LOCKS_EXCLUDED(mu_);
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
  // Counts one pick of candidates[index] for `units` samples in routing_stats_.
  void RecordPickLocked(const Choice& choice, absl::Span<const Candidate> candidates, int32_t units)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const PoolOptions options_;
  const HealthThresholds thresholds_;
  mutable absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);  // sorted by address
  const std::unique_ptr<RoutingPolicy> policy_ ABSL_PT_GUARDED_BY(mu_);
  struct PolicyConfig {
    const char* name;
    double load_factor;
    int32_t load_slack;
  };
  const PolicyConfig policy_config_;
  FleetWeights fleet_ ABSL_GUARDED_BY(mu_);
  RoutingStats routing_stats_ ABSL_GUARDED_BY(mu_);
  double load_spread_sum_ ABSL_GUARDED_BY(mu_) = 0;
  bool fleet_paused_ ABSL_GUARDED_BY(mu_) = false;
  // The fleet's weights digest (learned, see the file comment) and the version it is for.
  int64_t digest_version_ ABSL_GUARDED_BY(mu_) = -1;
  std::string reference_digest_ ABSL_GUARDED_BY(mu_);
  std::atomic<int> holds_{0};
  absl::Mutex capacity_mu_;
  std::function<void(int64_t)> capacity_observer_ ABSL_GUARDED_BY(capacity_mu_);
  int64_t notified_capacity_ ABSL_GUARDED_BY(capacity_mu_) = -1;
  // Deliveries to the catch-up handler and the observers, in order; taken before mu_ (never
  // while holding it).
  absl::Mutex handoff_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  CatchUpHandler catch_up_ ABSL_GUARDED_BY(handoff_mu_);
  std::vector<FleetObserver*> observers_ ABSL_GUARDED_BY(handoff_mu_);
  std::unique_ptr<HealthChecker> health_;  // last: its thread stops first
};

}  // namespace rl::router
