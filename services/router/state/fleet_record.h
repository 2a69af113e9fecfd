// FleetRecord: the fleet facts a router restart must not forget — the version and source of the
// last fleet-wide weight update and whether the fleet is paused — kept in the text cache's store
// (cache_store.h, its meta table) beside the trajectories. As a FleetObserver of the pool it
// writes every change durably before the admin call that made it returns; Restore() puts the
// record back into the pool at start-up, before any worker is added, so that the pool's own
// rules apply to what the workers report: a worker behind the recorded version is caught up
// (disk source) or listed STALE, never routed; a worker paused while the recorded fleet is not
// is out of routing with the reason; a paused fleet stays paused (a rejoining worker is brought
// to the fleet's pause state, never continued behind the trainer's back).
//
// Cost: one small synchronous transaction per change (admin calls only). Thread-safe.
#pragma once

#include "absl/status/status.h"
#include "services/router/cache/cache_store.h"
#include "services/router/pool/fleet_weights.h"
#include "services/router/pool/worker_pool.h"

namespace rl::router {

class FleetRecord final : public FleetObserver {
 public:
  // `store` must outlive this.
  explicit FleetRecord(CacheStore* store) : store_(store) {}

  // Reads the record into `pool` (SetFleetWeights, SetFleetPaused); nothing when none was
  // written. FailedPrecondition naming the store when a value is unreadable.
  absl::Status Restore(WorkerPool* pool);

  void OnFleetWeights(const FleetWeights& before, const FleetWeights& after) override;
  void OnFleetPaused(bool paused) override;

 private:
  CacheStore* const store_;
};

}  // namespace rl::router
