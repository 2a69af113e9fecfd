// The fleet's weights as the router records them: the version and source of the last
// successful fleet-wide weight update (the admin broadcast records it, worker_pool.h keeps it),
// and the two ways the pool tells the rest of the router about it:
//   - FleetObserver: told of every change of the record (the text cache follows the version
//     for its GC; wired at the composition root, router_server.cc);
//   - CatchUpHandler: given each live worker that must catch up (behind a replayable version,
//     or just rejoined with a pause state that may differ from the fleet's).
// docs/router-admin.md has the catch-up rules. Value types and interfaces only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace rl::router {

class Worker;

struct FleetWeights {
  // kAdopted: an operator adopted a worker's version (Router.AdoptWorkerVersion) without naming
  // the folder that holds it. Appended last: the fleet record persists the number.
  enum class Source { kNone, kDisk, kTensor, kDistributed, kAdopted };
  int64_t version = -1;  // -1: no update recorded
  Source source = Source::kNone;
  std::string path;  // kDisk: the folder; kAdopted: the adopted worker's address
  // kDisk: the fleet-wide disk updates just before this one, oldest first, back to the last
  // update from another source (at most kMaxDiskChain): when `path` is a delta publication, the
  // folders a worker behind it replays from a version it holds (a full checkpoint, then the
  // deltas after it; docs/router-admin.md, "Catch-up").
  struct DiskStep {
    int64_t version = -1;
    std::string path;
    bool operator==(const DiskStep&) const = default;
  };
  static constexpr size_t kMaxDiskChain = 32;
  std::vector<DiskStep> chain;
  // A worker behind this version can be brought up to date by replaying the update.
  bool replayable() const { return source == Source::kDisk && version >= 0; }
  std::string Describe() const;  // "disk:DIR", "tensor", "distributed", "adopted:ADDR", ""
};

// Told of every change of the fleet's record, in order, on the thread that made it, without the
// pool's lock held. Must be quick and must not call back into the pool's fleet setters.
class FleetObserver {
 public:
  virtual ~FleetObserver() = default;
  virtual void OnFleetWeights(const FleetWeights& before, const FleetWeights& after) = 0;
  // The fleet's pause state changed (a pause or continue broadcast succeeded somewhere).
  virtual void OnFleetPaused(bool /*paused*/) {}
};

// Takes a worker to catch up. Called from the health thread or a reporting thread; must return
// quickly (queue the work) and call WorkerPool::FinishSync when done with it.
using CatchUpHandler = std::function<void(std::shared_ptr<Worker>)>;

}  // namespace rl::router
