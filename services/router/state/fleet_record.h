// FleetRecord: the fleet facts a router restart must not forget — the version and source of the
// last fleet-wide weight update (or of a worker's version an operator adopted), whether the
// fleet is paused, and the workers an operator added or removed at run time — kept in the text
// cache's store (cache_store.h, its meta table) beside the trajectories. As a FleetObserver of
// the pool it writes every weight and pause change durably before the admin call that made it
// returns; AddWorker / RemoveWorker record theirs before they answer. Restore() puts the record
// back into the pool at start-up, before any worker is added, so that the pool's own rules apply
// to what the workers report: a worker behind the recorded version is caught up (disk source) or
// listed STALE, one ahead of it is VERSION_MISMATCH until an operator resyncs or adopts it, never
// routed; a worker paused while the recorded fleet is not is out of routing with the reason; a
// paused fleet stays paused (a rejoining worker is brought to the fleet's pause state, never
// continued behind the trainer's back). StartWorkers() is the registry to start with: the
// --worker flags, less the addresses removed at run time, plus those added.
//
// Cost: one small synchronous transaction per change (admin calls only). Thread-safe.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "services/router/cache/cache_store.h"
#include "services/router/pool/fleet_weights.h"
#include "services/router/pool/worker_pool.h"

namespace rl::router {

class FleetRecord final : public FleetObserver {
 public:
  // `store` must outlive this.
  explicit FleetRecord(CacheStore* store) : store_(store) {}

  // Reads the record into `pool` (SetFleetWeights, SetFleetPaused) and the run-time worker
  // changes into this object; nothing when none was written. FailedPrecondition naming the
  // store when a value is unreadable.
  absl::Status Restore(WorkerPool* pool) ABSL_LOCKS_EXCLUDED(mu_);
  // `flags` (the --worker addresses) less those removed at run time, plus those added, in that
  // order, without duplicates.
  std::vector<std::string> StartWorkers(const std::vector<std::string>& flags) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // An operator added / removed `address` (AddWorker / RemoveWorker): durable before it returns.
  // An added address is no longer removed and the other way round. The store's error (the
  // change is then in memory only) naming it.
  absl::Status RecordAdded(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status RecordRemoved(const std::string& address) ABSL_LOCKS_EXCLUDED(mu_);

  void OnFleetWeights(const FleetWeights& before, const FleetWeights& after) override;
  void OnFleetPaused(bool paused) override;

 private:
  // Writes both sets in one transaction.
  absl::Status PersistWorkersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  CacheStore* const store_;
  mutable absl::Mutex mu_;  // orders the worker changes' writes
  std::set<std::string> added_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> removed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rl::router
