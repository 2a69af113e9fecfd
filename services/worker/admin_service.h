// rl.v1.Admin on the worker: translates protos ⇄ domain calls of WorkerServer and of its
// WeightUpdateController (weight updates and groups). Every call is checked against the admin
// key first. Calls that wait for the engine run on their own thread
// (admin calls are rare) so they never block gRPC's callback threads.
#pragma once

#include "common/auth.h"
#include "rl/v1/admin.grpc.pb.h"

namespace rl::worker {

class WeightUpdateController;
class WorkerServer;

class AdminService final : public rl::v1::Admin::CallbackService {
 public:
  // Both must outlive the service.
  AdminService(WorkerServer* server, WeightUpdateController* updates, const BearerAuth* auth)
      : server_(server), updates_(updates), auth_(auth) {}

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
  WorkerServer* server_;
  WeightUpdateController* updates_;
  const BearerAuth* auth_;
};

}  // namespace rl::worker
