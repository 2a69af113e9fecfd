// rl.v1.Admin on the worker: translates protos (admin_convert.h) to the control plane
// (WorkerControl: pause, continue, flush, sleep / wake, the weights checker, the worker's
// state) and the weight-update unit (WeightUpdates), checking the admin key first.
// Design: the calls that wait for the engine (or a receive) run on the admin executor, a
// BoundedExecutor the composition root shares with the other background calls, so they never
// block gRPC's callback threads and never make a thread per call; when it is full (every
// thread busy and its queue full: a stuck engine or slow receives) a call answers
// RESOURCE_EXHAUSTED at once, saying so. GetModelInfo and GetServerInfo answer inline (they
// never wait). Control calls (all but GetModelInfo, GetServerInfo, ListWeights) are fenced by
// the admin lease (control/admin_lease.h): one router at a time; GetServerInfo reports it.
// Semantics: docs/worker-control.md, docs/weight-updates.md.
// Thread-safe. Lifetime: everything it references must outlive the gRPC server's drain and the
// executor's last task (the composition root shuts the server down, then the executor).
#pragma once

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/auth.h"
#include "common/bounded_executor.h"
#include "rl/v1/admin.grpc.pb.h"
#include "services/worker/control/admin_lease.h"
#include "services/worker/control/worker_control.h"
#include "services/worker/generate_host.h"
#include "services/worker/weights/peer_sender.h"
#include "services/worker/weights/weight_updates.h"

namespace rl::worker {

class AdminService final : public rl::v1::Admin::CallbackService {
 public:
  // `allow_non_finite_weights` (--allow-non-finite-weights): streamed tensors holding NaN or
  // ±Inf are accepted instead of refused.
  AdminService(GenerateHost& host, WorkerControl& control, WeightUpdates& weights,
               BoundedExecutor& executor, const BearerAuth& auth,
               bool allow_non_finite_weights = false)
      : host_(host),
        control_(control),
        weights_(weights),
        executor_(executor),
        auth_(auth),
        allow_non_finite_weights_(allow_non_finite_weights) {}

  // RESOURCE_EXHAUSTED for `method` refused by a full admin executor.
  static absl::Status ExecutorFull(absl::string_view method, const BoundedExecutor& executor);

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
  grpc::ServerUnaryReactor* StageWeights(Ctx* c, const rl::v1::StageWeightsRequest* req,
                                         rl::v1::AdminResponse* resp) override;
  grpc::ServerUnaryReactor* ActivateWeights(Ctx* c, const rl::v1::ActivateWeightsRequest* req,
                                            rl::v1::AdminResponse* resp) override;
  grpc::ServerUnaryReactor* DropStagedWeights(Ctx* c, const rl::v1::DropStagedWeightsRequest* req,
                                              rl::v1::AdminResponse* resp) override;
  // Peer catch-up (weights/peer_sender.h): a control call, on the admin executor for the whole
  // send; the caller's authorization and lease headers go on to the receiver.
  grpc::ServerUnaryReactor* SendWeightsToPeer(Ctx* c, const rl::v1::SendWeightsToPeerRequest* req,
                                              rl::v1::AdminResponse* resp) override;
  // Set once before serving; null: SendWeightsToPeer is UNIMPLEMENTED.
  void SetPeerSender(PeerSender* sender) { peer_sender_ = sender; }

 private:
  // Checks the key and, for a `control` call, the admin lease; then runs `fn` on the admin
  // executor and finishes the call with its status (RESOURCE_EXHAUSTED at once when the
  // executor is full). The lease's holder renews it with every call.
  grpc::ServerUnaryReactor* RunAsync(Ctx* context, absl::string_view method,
                                     absl::AnyInvocable<absl::Status() &&> fn, bool control = true);
  // The call's lease claim (its headers); InvalidArgument for bad ones.
  static absl::StatusOr<LeaseClaim> ClaimOf(const Ctx& context);
  // The key and the admin lease of a streaming control call (UpdateWeightsFromTensor), checked
  // once at its start; the router's LeaseKeeper renews the lease while the stream runs.
  absl::Status AdmitStream(const Ctx& context, absl::string_view method);
  // A read-only call: the holder's claim renews the lease.
  void RenewLease(const Ctx& context);

  AdminLease lease_;

  GenerateHost& host_;
  WorkerControl& control_;
  WeightUpdates& weights_;
  BoundedExecutor& executor_;
  const BearerAuth& auth_;
  const bool allow_non_finite_weights_;
  PeerSender* peer_sender_ = nullptr;
};

}  // namespace rl::worker
