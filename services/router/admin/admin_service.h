// AdminService: rl.v1.Admin on the router. Translates each RPC into a broadcast plan
// (broadcast.h: which workers, which deadline, whether they are held out of routing, whether a
// failure may leave partial weights, what success records) or a read-only gather, and the
// aggregated per-worker answer back into the proto. It owns the broadcast engine and the
// catch-up of rejoining workers (catch_up.h). docs/router-admin.md has the semantics.
//
// Every call checks the admin key first; its waiting runs on the bounded admin executor (a full
// executor answers RESOURCE_EXHAUSTED), never on a thread of its own. InitWeightsUpdateGroup
// gives the i-th live worker (sorted by address) rank rank_offset + i. RefitWeights is the
// transactional refit: stage everywhere (serving goes on), then activate everywhere or nowhere.
// Thread-safe.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/auth.h"
#include "common/bounded_executor.h"
#include "common/drain_gate.h"
#include "common/request_limits.h"
#include "rl/v1/admin.grpc.pb.h"
#include "services/router/admin/broadcast.h"
#include "services/router/admin/catch_up.h"
#include "services/router/admin/lease_keeper.h"
#include "services/router/admin/tensor_fanout.h"
#include "services/router/pool/worker_pool.h"

namespace rl::router::admin {

struct AdminOptions {
  BroadcastOptions broadcast;
  // Runs every call's blocking work (required).
  BoundedExecutor* executor = nullptr;
  // The --max-* bounds a tensor stream is checked against before it is forwarded.
  RequestLimits limits;
  // While the router drains (SIGTERM) every call is refused UNAVAILABLE (may be null).
  const DrainGate* drain = nullptr;
};

class AdminService final : public rl::v1::Admin::CallbackService {
 public:
  // Starts the catch-up thread; `pool`, `auth` and the executor must outlive this.
  AdminService(WorkerPool* pool, const BearerAuth* auth, AdminOptions options);
  ~AdminService() override;  // stops the catch-up thread

  // The admin lock every fleet-changing call takes (the router's AdoptWorkerVersion too).
  AdminLock& lock() { return broadcaster_.lock(); }

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
  // Staged refits (issue 30; docs/router-admin.md, "Transactional refit").
  grpc::ServerUnaryReactor* StageWeights(Ctx* c, const rl::v1::StageWeightsRequest* req,
                                         rl::v1::AdminResponse* resp) override;
  grpc::ServerUnaryReactor* ActivateWeights(Ctx* c, const rl::v1::ActivateWeightsRequest* req,
                                            rl::v1::AdminResponse* resp) override;
  grpc::ServerUnaryReactor* DropStagedWeights(Ctx* c, const rl::v1::DropStagedWeightsRequest* req,
                                              rl::v1::AdminResponse* resp) override;
  grpc::ServerUnaryReactor* RefitWeights(Ctx* c, const rl::v1::RefitWeightsRequest* req,
                                         rl::v1::AdminResponse* resp) override;

 private:
  // Checks the key, then runs `fn` on the admin executor and finishes the call with its status.
  grpc::ServerUnaryReactor* Run(Ctx* c, std::function<absl::Status()> fn);
  // A resync (UpdateWeightsFromDisk with `workers`) only brings workers to the fleet's version:
  // sets `req`'s version to it, marks a resync of every live worker whole-fleet, and refuses
  // (FAILED_PRECONDITION, with the reason) one that would serve another version, or other
  // weights than the fleet's (docs/router-admin.md, "Resync").
  absl::Status CheckResync(Ctx* c, rl::v1::UpdateWeightsFromDiskRequest* req, Plan* plan);
  // The refit, the admin lock held: stage on every live worker; activate on them only when every
  // one staged, else drop everywhere (nothing activates).
  absl::Status RefitLocked(Ctx* c, const rl::v1::RefitWeightsRequest& req,
                           rl::v1::AdminResponse* resp);
  // A staged tensor push (UpdateWeightsFromTensor with `stage`): the relay's broadcast under the
  // admin lock, then DropUnlessAllStagedLocked: all or none.
  absl::Status StageTensorsLocked(Ctx* c, const TensorRelayStart& start,
                                  rl::v1::AdminResponse* resp);
  // After a staging broadcast (`resp` holds its per-worker results): when some worker failed,
  // the others drop what they staged and `resp` says so (success false, the reasons kept).
  void DropUnlessAllStagedLocked(Ctx* c, const char* what, rl::v1::AdminResponse* resp);
  // A staged receive (`stage` set): broadcast under the admin lock with no hold and nothing
  // recorded, then DropUnlessAllStagedLocked: all or none.
  template <typename Request>
  grpc::ServerUnaryReactor* ForwardStage(Ctx* c, const Request* req, rl::v1::AdminResponse* resp,
                                         const char* what,
                                         AsyncMethod<Request, rl::v1::AdminResponse> method);
  // Broadcasts `method` with the caller's own request, under `plan`.
  template <typename Request>
  grpc::ServerUnaryReactor* Forward(Ctx* c, const Request* req, rl::v1::AdminResponse* resp,
                                    Plan plan, AsyncMethod<Request, rl::v1::AdminResponse> method);

  // Records whether the group's last PrepareWeightsUpdate was a delta; TakeDeltaPrepared answers
  // it for the group's Complete (and forgets it). A router restarted in between answers false:
  // the Complete is then treated like a dense one (conservatively).
  void NotePrepared(const std::string& group, bool delta) ABSL_LOCKS_EXCLUDED(delta_mu_);
  bool TakeDeltaPrepared(const std::string& group) ABSL_LOCKS_EXCLUDED(delta_mu_);
  // Forgets `group`; whether it was remembered.
  bool ForgetLocked(const std::string& group) ABSL_EXCLUSIVE_LOCKS_REQUIRED(delta_mu_);

  WorkerPool* const pool_;
  const BearerAuth* const auth_;
  BoundedExecutor* const executor_;
  const RequestLimits limits_;
  const DrainGate* const drain_;
  Broadcaster broadcaster_;
  std::unique_ptr<CatchUp> catch_up_;          // after broadcaster_: stopped first
  std::unique_ptr<LeaseKeeper> lease_keeper_;  // after broadcaster_: stopped first
  absl::Mutex delta_mu_;
  std::set<std::string> delta_prepared_ ABSL_GUARDED_BY(delta_mu_);  // bounded by kMaxGroups
  std::deque<std::string> delta_order_ ABSL_GUARDED_BY(delta_mu_);   // the same, oldest first
};

}  // namespace rl::router::admin
