// CatchUp: brings workers that (re)join the fleet back in line with it, one at a time on a
// thread of its own, under the admin lock and a pool hold (requests wait rather than fail). The
// pool hands it workers (WorkerPool::SetCatchUpHandler): one behind a replayable fleet version
// is paused (retract), loaded from the fleet's folder at the fleet's version (a delta's chain
// replayed from a folder it can load; a live peer when none applies) and continued unless the
// fleet is paused; one behind a version that exists only in memory (a tensor stream,
// a group) is paused, held out of routing and sent the weights by a live peer at that version
// (SendWeightsToPeer: up to 3 peers, least loaded first, 0.2 s doubling between them), then
// must report the version and the peer's checksum before it is continued and routed; one that
// just rejoined gets the fleet's pause state. A failure is retried when the pool hands the
// worker over again, after an exponential backoff (0.5 s to 30 s per address).
// docs/router-admin.md has the rules.
//
// Cost: one thread; one worker call in flight at a time (a peer's send streams the whole model
// worker to worker, never through the router). The router's own calls are cancelled at
// destruction instead of waiting for their deadlines.
#pragma once

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "services/router/admin/broadcast.h"
#include "services/router/pool/worker_pool.h"

namespace rl::router::admin {

class CatchUp {
 public:
  // Becomes the pool's catch-up handler and starts the thread; `broadcaster` (its lock, pause
  // state and calls) must outlive this.
  CatchUp(WorkerPool* pool, Broadcaster* broadcaster);
  // Stops taking workers, cancels the call in flight, stops the thread and gives back the
  // workers still queued (FinishSync).
  ~CatchUp();
  CatchUp(const CatchUp&) = delete;
  CatchUp& operator=(const CatchUp&) = delete;

 private:
  void Enqueue(std::shared_ptr<Worker> w) ABSL_LOCKS_EXCLUDED(mu_);
  void Loop();
  // One worker: the replay when it is behind a replayable version, else the pause state.
  absl::Status Run(const std::shared_ptr<Worker>& w);
  // Behind a disk version: paused, loaded from the fleet's folder at the fleet's version (from
  // an earlier folder of the record's chain on, when the fleet's is a delta of a version `w`
  // does not hold), continued unless the fleet is paused. FAILED_PRECONDITION when no folder of
  // the chain applies.
  absl::Status FromDisk(const std::shared_ptr<Worker>& w, const FleetWeights& fleet,
                        bool fleet_paused);
  // Pauses / continues a rejoined worker whose pause state differs from the fleet's.
  absl::Status ReconcilePause(const std::shared_ptr<Worker>& w, bool fleet_paused);
  // Behind a version that exists only in memory: a live peer at the fleet's version sends its
  // weights to `w` (paused and held out of routing meanwhile), the next peer after a backoff when
  // one fails; `w` is routed again only once it reports the version and the peer's checksum.
  absl::Status FromPeer(const std::shared_ptr<Worker>& w, const FleetWeights& fleet,
                        bool fleet_paused);
  // One peer's send to `w`, then `w`'s version and checksum against what the peer sent
  // (DATA_LOSS when they differ after the apply).
  absl::Status SendFrom(const std::shared_ptr<Worker>& peer, const std::shared_ptr<Worker>& w,
                        int64_t version);
  // Waits `delay` unless the destructor began (then false).
  bool SleepUnlessStopping(std::chrono::milliseconds delay) ABSL_LOCKS_EXCLUDED(mu_);
  // One of the router's own calls to `w`, waited for; cancelled also when `also` is marked dead.
  Result CallOwn(const Plan& plan, const std::shared_ptr<Worker>& w, const WorkerCall& call,
                 Worker* also = nullptr);
  // The router's own calls are registered so that destruction cancels the one in flight. Begin
  // returns false once stopping.
  bool BeginOwnCall(grpc::ClientContext* ctx) ABSL_LOCKS_EXCLUDED(own_call_mu_);
  void EndOwnCall() ABSL_LOCKS_EXCLUDED(own_call_mu_);

  WorkerPool* const pool_;
  Broadcaster* const broadcaster_;
  absl::Mutex mu_;
  std::deque<std::shared_ptr<Worker>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex own_call_mu_;
  grpc::ClientContext* own_call_ ABSL_GUARDED_BY(own_call_mu_) = nullptr;
  bool stopping_ ABSL_GUARDED_BY(own_call_mu_) = false;
  // Earliest next attempt per address after failures, and the delay that led to it.
  std::map<std::string, std::pair<std::chrono::steady_clock::time_point,
                                  std::chrono::milliseconds>>
      backoff_;  // the thread's only
  std::thread thread_;
};

}  // namespace rl::router::admin
