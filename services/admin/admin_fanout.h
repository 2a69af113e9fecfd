// rl.v1.Admin on the router: every call is broadcast to the live workers (in parallel, each
// with a deadline) and answered with one result per worker.
//
// One admin lock serializes the calls that change fleet state (pause, continue, flush, weight
// updates, group init/update/destroy, sleep/wake); a caller that waits longer than the lock
// timeout gets UNAVAILABLE instead of queueing forever. For pause and weight-update calls the
// targets are disabled for routing during the broadcast; afterwards each worker that succeeded
// gets its previous enabled state back, and a worker whose update or group init failed stays
// disabled until an operator re-enables it (rlctl workers enable ADDR). The caller's
// `authorization` header is forwarded to the workers. InitWeightsUpdateGroup gives the i-th
// live worker (sorted by address) rank rank_offset + i, so one call forms the whole group. A
// successful weight update advances the text cache's current version (which drives its GC).
// Thread-safe.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/auth.h"
#include "rl/v1/admin.grpc.pb.h"
#include "services/router/cache/text_cache.h"
#include "services/router/worker_pool.h"

namespace rl::admin {

struct FanoutOptions {
  std::chrono::milliseconds lock_timeout{30000};
  std::chrono::milliseconds call_timeout{600000};
};

// One worker's answer to a read-only broadcast.
template <typename Resp>
struct Reply {
  std::string worker;
  grpc::Status status;
  Resp resp;
};

template <typename Req, typename Resp>
using StubMethod = grpc::Status (rl::v1::Admin::Stub::*)(grpc::ClientContext*, const Req&, Resp*);

class AdminFanout final : public rl::v1::Admin::CallbackService {
 public:
  AdminFanout(router::WorkerPool* pool, router::TextCache* cache, const BearerAuth* auth,
              FanoutOptions options)
      : pool_(pool), cache_(cache), auth_(auth), options_(options) {}

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
  // How a broadcast treats routing around it.
  enum class Routing {
    kKeep,           // leave enabled flags alone
    kDisableDuring,  // disable during (holding the pool), restore each worker that succeeded
                     // and mark it serving
    kSleep,          // as kDisableDuring, but a worker that succeeded is marked not serving
                     // (asleep) before it is re-enabled
  };
  // (worker, its index among the targets sorted by address, context, response).
  using WorkerCall = std::function<grpc::Status(router::Worker&, size_t, grpc::ClientContext&,
                                                rl::v1::AdminResponse*)>;
  // Takes the admin lock (bounded wait), broadcasts `call` to every live worker and fills
  // `resp` with one result per worker. `bumps_version`: a success advances the cache version.
  absl::Status Broadcast(const char* what, Ctx* caller, Routing routing, bool bumps_version,
                         const WorkerCall& call, rl::v1::AdminResponse* resp);
  grpc::ServerUnaryReactor* Run(Ctx* c, std::function<absl::Status()> fn);
  // ReleaseMemory / ResumeMemory: a broadcast that also marks the workers (not) serving.
  absl::Status SleepOrWake(Ctx* c, bool sleep, rl::v1::AdminResponse* resp, const WorkerCall& call);
  // Calls `method` on every live worker in parallel (read-only calls: no admin lock).
  template <typename Req, typename Resp>
  std::vector<Reply<Resp>> Gather(Ctx* caller, const Req& req, StubMethod<Req, Resp> method) const;
  void Prepare(Ctx* caller, grpc::ClientContext* ctx) const;

  router::WorkerPool* pool_;
  router::TextCache* cache_;
  const BearerAuth* auth_;
  const FanoutOptions options_;
  absl::Mutex admin_mu_;
  bool admin_busy_ ABSL_GUARDED_BY(admin_mu_) = false;
};

}  // namespace rl::admin
