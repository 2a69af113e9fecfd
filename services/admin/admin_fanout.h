// rl.v1.Admin on the router: every call is broadcast to the live workers (all at once, each
// with a per-worker deadline) and answered with one result per worker. Worker calls use the
// asynchronous (callback) client API: a broadcast over N workers costs one waiting thread of
// the admin executor, not N threads.
//
// One admin lock serializes the calls that change fleet state (pause, continue, flush, weight
// updates, group init/update/destroy, sleep/wake) and the catch-up of rejoining workers; a
// caller that waits longer than the lock timeout gets UNAVAILABLE instead of queueing forever.
//
// Per-worker deadlines: control calls (pause, continue, flush, destroy group, read-only calls)
// get `control_timeout`, loads (weight updates, group init, sleep, wake) `load_timeout`. A worker
// that misses its deadline is reported (DEADLINE_EXCEEDED, left_out), marked dead (its streams
// are cancelled) and so left out of later broadcasts until health checks readmit it; a worker
// the health checks mark dead during a call has that call cancelled. So one stuck worker holds
// the lock for at most min(deadline, health detection time).
//
// Per-worker outcomes: for pause, updates, group init and sleep each target is held out of
// routing during its own call and put back as soon as that call ends (after a fresh health
// probe), whatever the outcome, except when its weights may now be partial (a failed distributed
// or tensor apply, a failed group init): that worker is disabled with the reason (ListWorkers),
// until a resync or `rlctl workers enable`. A refused call or a failed disk load leaves the old
// weights serving, so the worker serves again at once.
//
// Catch-up: a successful weight update records the fleet's version and source in the pool. A
// worker that (re)joins behind it is brought up to date before it is routed: from a disk source
// the router replays it (pause retract → load DIR at the fleet's version → continue unless the
// fleet is paused); a tensor/distributed source cannot be replayed and the worker is listed
// STALE until UpdateWeightsFromDisk with `workers` (rlctl workers resync) brings it back. A
// worker that comes back live also gets the fleet's pause state (continue or pause retract), so
// a pause that reached it late or a continue it missed never leaves it holding requests.
//
// The caller's `authorization` header is forwarded to the workers (catch-up uses
// `worker_admin_key`). InitWeightsUpdateGroup gives the i-th live worker (sorted by address)
// rank rank_offset + i, so one call forms the whole group. Each call's waiting runs on the
// router's bounded admin executor (FanoutOptions::executor), never on a thread of its own. A
// successful weight update advances the text cache's current version (which drives its GC).
// Thread-safe.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/auth.h"
#include "common/bounded_executor.h"
#include "rl/v1/admin.grpc.pb.h"
#include "services/router/cache/text_cache.h"
#include "services/router/worker_pool.h"

namespace rl::admin {

struct FanoutOptions {
  std::chrono::milliseconds lock_timeout{30000};
  // Per-worker deadline of pause / continue / flush / destroy-group and read-only calls.
  std::chrono::milliseconds control_timeout{10000};
  // Per-worker deadline of weight updates, group init, sleep and wake.
  std::chrono::milliseconds load_timeout{600000};
  // Bearer key for calls the router makes on its own (catch-up); empty: none.
  std::string worker_admin_key;
  // Runs every call's blocking work (required; bounded: a full executor answers
  // RESOURCE_EXHAUSTED).
  BoundedExecutor* executor = nullptr;
};

// One worker's answer to a read-only broadcast.
template <typename Resp>
struct Reply {
  std::string worker;
  grpc::Status status;
  Resp resp;
};

// A unary Admin method of the asynchronous (callback) client API.
using AsyncAdmin = rl::v1::Admin::StubInterface::async_interface;
template <typename Req, typename Resp>
using AsyncMethod = void (AsyncAdmin::*)(grpc::ClientContext*, const Req*, Resp*,
                                         std::function<void(grpc::Status)>);

class AdminFanout final : public rl::v1::Admin::CallbackService {
 public:
  AdminFanout(router::WorkerPool* pool, router::TextCache* cache, const BearerAuth* auth,
              FanoutOptions options);
  ~AdminFanout() override;  // stops the catch-up thread
  using Ctx = grpc::CallbackServerContext;
  grpc::ServerUnaryReactor* PauseGeneration(Ctx* c, const rl::v1::PauseGenerationRequest* req,
                                            rl::v1::AdminResponse* resp) override;
  grpc::ServerUnaryReactor* ContinueGeneration(Ctx* c, const rl::v1::ContinueGenerationRequest* req,
                                               rl::v1::AdminResponse* resp) override;
  grpc::ServerUnaryReactor* FlushCache(Ctx* c, const rl::v1::FlushCacheRequest* req,
                                       rl::v1::AdminResponse* resp) override;
  grpc::ServerUnaryReactor* UpdateWeightsFromDisk(Ctx* c,
                                                  const rl::v1::UpdateWeightsFromDiskRequest* req,
                                                  rl::v1::AdminResponse* resp) override;
  grpc::ServerReadReactor<rl::v1::UpdateWeightsFromTensorRequest>* UpdateWeightsFromTensor(
      Ctx* c, rl::v1::AdminResponse* resp) override;
  grpc::ServerUnaryReactor* InitWeightsUpdateGroup(Ctx* c,
                                                   const rl::v1::InitWeightsUpdateGroupRequest* req,
                                                   rl::v1::AdminResponse* resp) override;
  grpc::ServerUnaryReactor* UpdateWeightsFromDistributed(
      Ctx* c, const rl::v1::UpdateWeightsFromDistributedRequest* req,
      rl::v1::AdminResponse* resp) override;
  grpc::ServerUnaryReactor* DestroyWeightsUpdateGroup(
      Ctx* c, const rl::v1::DestroyWeightsUpdateGroupRequest* req,
      rl::v1::AdminResponse* resp) override;
  grpc::ServerUnaryReactor* PrepareWeightsUpdate(Ctx* c,
                                                 const rl::v1::PrepareWeightsUpdateRequest* req,
                                                 rl::v1::AdminResponse* resp) override;
  grpc::ServerUnaryReactor* CompleteWeightsUpdate(Ctx* c,
                                                  const rl::v1::CompleteWeightsUpdateRequest* req,
                                                  rl::v1::AdminResponse* resp) override;
  grpc::ServerUnaryReactor* ReceiveWeights(Ctx* c, const rl::v1::ReceiveWeightsRequest* req,
                                           rl::v1::AdminResponse* resp) override;
  grpc::ServerUnaryReactor* GetModelInfo(Ctx* c, const rl::v1::GetModelInfoRequest* req,
                                         rl::v1::GetModelInfoResponse* resp) override;
  grpc::ServerUnaryReactor* GetServerInfo(Ctx* c, const rl::v1::GetServerInfoRequest* req,
                                          rl::v1::GetServerInfoResponse* resp) override;
  grpc::ServerUnaryReactor* ListWeights(Ctx* c, const rl::v1::ListWeightsRequest* req,
                                        rl::v1::ListWeightsResponse* resp) override;
  grpc::ServerUnaryReactor* WeightsChecker(Ctx* c, const rl::v1::WeightsCheckerRequest* req,
                                           rl::v1::WeightsCheckerResponse* resp) override;
  grpc::ServerUnaryReactor* ReleaseMemory(Ctx* c, const rl::v1::ReleaseMemoryRequest* req,
                                          rl::v1::AdminResponse* resp) override;
  grpc::ServerUnaryReactor* ResumeMemory(Ctx* c, const rl::v1::ResumeMemoryRequest* req,
                                         rl::v1::AdminResponse* resp) override;

 private:
  enum class Deadline { kControl, kLoad };
  // Which failures may leave a worker's weights partial (it then stays out of routing).
  enum class Partial { kNever, kTensor, kDistributed, kGroup };
  struct Plan {
    const char* what = "";
    Deadline deadline = Deadline::kControl;
    bool hold = false;   // hold each target out of routing during its call, probe it after
    bool probe = false;  // probe each target after a successful call (wake)
    Partial partial = Partial::kNever;
    // A weight update: success records the fleet weights (source, path) and the cache version.
    bool bumps_version = false;
    router::FleetWeights::Source source = router::FleetWeights::Source::kNone;
    std::string path;
    // After a success on some worker the fleet is paused (true) / running (false); unset: as is.
    std::optional<bool> sets_paused;
    // Non-empty: only these workers (resync), live or not.
    std::vector<std::string> only;
  };
  // Called with a call's status, once (on a gRPC thread).
  using Done = std::function<void(grpc::Status)>;
  // Starts one asynchronous call: (worker, its index among the targets sorted by address,
  // context, response, done). The request must live until `done`.
  using WorkerCall = std::function<void(router::Worker&, size_t, grpc::ClientContext*,
                                        rl::v1::AdminResponse*, Done)>;
  struct Result {
    grpc::Status status;
    rl::v1::AdminResponse resp;
    bool left_out = false;
  };
  struct Call;  // one worker's call in flight (admin_fanout.cc)
  // Takes the admin lock (bounded wait), starts `call` on every target at once (asynchronous
  // calls: no thread per worker; the calling thread waits for all), settles each worker's
  // routing as soon as its call ends and fills `resp` with one result per worker.
  // CompleteWeightsUpdate / ReceiveWeights: the same plan, another stub method.
  template <typename Request>
  grpc::ServerUnaryReactor* FanOutReceive(Ctx* c, const Request* req, rl::v1::AdminResponse* resp,
                                          const char* what,
                                          AsyncMethod<Request, rl::v1::AdminResponse> method);
  absl::Status Broadcast(const Plan& plan, Ctx* caller, const WorkerCall& call,
                         rl::v1::AdminResponse* resp);
  // Starts one call with its deadline, registered on the worker (cancelled if it is marked
  // dead); `finished` runs once the outcome is in `c->result` (a missed deadline marks the
  // worker dead). `plan`, `c` and `w` must outlive it.
  void StartOne(const Plan& plan, Ctx* caller, const std::shared_ptr<router::Worker>& w,
                size_t index, const WorkerCall& call, Call* c, std::function<void()> finished);
  // StartOne, waited for (catch-up: one worker at a time).
  Result CallOne(const Plan& plan, Ctx* caller, const std::shared_ptr<router::Worker>& w,
                 size_t index, const WorkerCall& call);
  // Applies one worker's outcome to the pool (versions, death, partial weights, routing);
  // `settled` runs once the worker is routed again (after an asynchronous health probe where
  // the plan wants one).
  void Settle(const Plan& plan, const std::shared_ptr<router::Worker>& w, Result* r,
              std::function<void()> settled);
  absl::Status LockAdmin(const char* what);
  void UnlockAdmin();
  grpc::ServerUnaryReactor* Run(Ctx* c, std::function<absl::Status()> fn);
  // Calls `method` on every live worker at once and waits for all (read-only calls: no admin
  // lock).
  template <typename Req, typename Resp>
  std::vector<Reply<Resp>> Gather(Ctx* caller, const Req& req, AsyncMethod<Req, Resp> method) const;
  // Deadline and authorization for a call to a worker (`caller` may be null: the router's own).
  void Prepare(Ctx* caller, grpc::ClientContext* ctx, std::chrono::milliseconds timeout) const;
  std::chrono::milliseconds Timeout(Deadline d) const;

  // Catch-up of workers behind a replayable fleet version (one at a time, under the admin lock).
  void EnqueueCatchUp(std::shared_ptr<router::Worker> w);
  void CatchUpLoop();
  absl::Status CatchUp(const std::shared_ptr<router::Worker>& w);
  // The router's own calls (caller == null: catch-up) are registered so that destruction
  // cancels the one in flight instead of waiting for its deadline. Begin returns false once
  // the fan-out is stopping.
  bool BeginOwnCall(grpc::ClientContext* ctx);
  void EndOwnCall();
  // Pauses / continues a rejoined worker whose pause state differs from the fleet's.
  absl::Status ReconcilePause(const std::shared_ptr<router::Worker>& w, bool fleet_paused);

  router::WorkerPool* pool_;
  router::TextCache* cache_;
  const BearerAuth* auth_;
  const FanoutOptions options_;
  absl::Mutex admin_mu_;
  bool admin_busy_ ABSL_GUARDED_BY(admin_mu_) = false;
  bool fleet_paused_ ABSL_GUARDED_BY(admin_mu_) = false;

  absl::Mutex catch_up_mu_;
  std::deque<std::shared_ptr<router::Worker>> catch_up_queue_ ABSL_GUARDED_BY(catch_up_mu_);
  bool stop_ ABSL_GUARDED_BY(catch_up_mu_) = false;
  absl::Mutex own_call_mu_;
  grpc::ClientContext* own_call_ ABSL_GUARDED_BY(own_call_mu_) = nullptr;
  bool stopping_ ABSL_GUARDED_BY(own_call_mu_) = false;
  // Earliest next catch-up attempt per address after failures (exponential backoff).
  std::map<std::string, std::pair<std::chrono::steady_clock::time_point,
                                  std::chrono::milliseconds>>
      catch_up_backoff_;  // catch-up thread only
  std::thread catch_up_thread_;
};

}  // namespace rl::admin
