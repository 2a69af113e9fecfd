#include "services/worker/admin_service.h"

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "services/worker/admin_convert.h"
#include "services/worker/proto_convert.h"
#include "services/worker/tensor_update_reactor.h"

namespace rl::worker {
namespace {

// The delta a group receive names (PrepareWeightsUpdate / ReceiveWeights with parent_version,
// and optionally manifest_json), or nullopt for a dense receive.
template <typename Request>
absl::StatusOr<std::optional<GroupDelta>> GroupDeltaOf(const Request& req) {
  if (!req.has_parent_version() && req.manifest_json().empty()) return std::nullopt;
  if (!req.has_parent_version()) {
    return absl::InvalidArgumentError(
        "manifest_json: a group receive verifies a delta (set parent_version)");
  }
  ASSIGN_OR_RETURN(GroupDelta delta,
                   GroupDeltaFrom(req.buckets(), req.parent_version(), req.manifest_json()));
  return delta;
}

}  // namespace

absl::Status AdminService::ExecutorFull(absl::string_view method, const BoundedExecutor& executor) {
  return absl::ResourceExhaustedError(
      absl::StrCat(method, ": the worker's admin executor is full (", executor.num_threads(),
                   " calls running and ", executor.max_queued(),
                   " waiting: the engine is stuck or receives are slow); retry later"));
}

absl::StatusOr<LeaseClaim> AdminService::ClaimOf(const Ctx& context) {
  const auto& md = context.client_metadata();
  std::string owner, ttl;
  auto it = md.find(kLeaseOwnerHeader);
  const bool has_owner = it != md.end();
  if (has_owner) owner.assign(it->second.data(), it->second.size());
  it = md.find(kLeaseTtlHeader);
  const bool has_ttl = it != md.end();
  if (has_ttl) ttl.assign(it->second.data(), it->second.size());
  return ParseLeaseClaim(has_owner ? &owner : nullptr, has_ttl ? &ttl : nullptr);
}

void AdminService::RenewLease(const Ctx& context) {
  if (absl::StatusOr<LeaseClaim> claim = ClaimOf(context); claim.ok()) lease_.Renew(*claim);
}

absl::Status AdminService::AdmitStream(const Ctx& context, absl::string_view method) {
  RETURN_IF_ERROR(auth_.Check(context));
  ASSIGN_OR_RETURN(LeaseClaim claim, ClaimOf(context));
  return lease_.Acquire(claim, method);
}

grpc::ServerUnaryReactor* AdminService::RunAsync(Ctx* context, absl::string_view method,
                                                 absl::AnyInvocable<absl::Status() &&> fn,
                                                 bool control) {
  if (absl::Status s = auth_.Check(*context); !s.ok()) return FinishUnary(context, s);
  absl::StatusOr<LeaseClaim> claim = ClaimOf(*context);
  if (!claim.ok()) return FinishUnary(context, claim.status());
  if (control) {
    if (absl::Status s = lease_.Acquire(*claim, method); !s.ok()) return FinishUnary(context, s);
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // Submit takes the task only when it accepts it; a refused call is answered here.
  if (!executor_.Submit([this, reactor, claim = *std::move(claim), fn = std::move(fn)]() mutable {
        const absl::Status s = std::move(fn)();
        lease_.Renew(claim);  // the holder's lease counts from the end of its call
        reactor->Finish(ToGrpcStatus(s));
      })) {
    reactor->Finish(ToGrpcStatus(ExecutorFull(method, executor_)));
  }
  return reactor;
}

grpc::ServerUnaryReactor* AdminService::PauseGeneration(Ctx* c,
                                                        const rl::v1::PauseGenerationRequest* req,
                                                        rl::v1::AdminResponse* resp) {
  return RunAsync(c, "PauseGeneration", [this, req, resp]() -> absl::Status {
    ASSIGN_OR_RETURN(engine::PauseMode mode, FromProto(req->mode()));
    if (mode == engine::PauseMode::kDrain) {
      ASSIGN_OR_RETURN(absl::Duration timeout, DrainTimeoutFrom(*req));
      return FillFrom(control_.Drain(timeout), resp);
    }
    return FillFrom(control_.Pause(mode), resp);
  });
}

grpc::ServerUnaryReactor* AdminService::ContinueGeneration(Ctx* c,
                                                           const rl::v1::ContinueGenerationRequest*,
                                                           rl::v1::AdminResponse* resp) {
  return RunAsync(c, "ContinueGeneration",
                  [this, resp] { return FillFrom(control_.Continue(), resp); });
}

grpc::ServerUnaryReactor* AdminService::FlushCache(Ctx* c, const rl::v1::FlushCacheRequest*,
                                                   rl::v1::AdminResponse* resp) {
  return RunAsync(c, "FlushCache", [this, resp] { return FillFrom(control_.FlushCache(), resp); });
}

grpc::ServerUnaryReactor* AdminService::UpdateWeightsFromDisk(
    Ctx* c, const rl::v1::UpdateWeightsFromDiskRequest* req, rl::v1::AdminResponse* resp) {
  return RunAsync(c, "UpdateWeightsFromDisk", [this, req, resp] {
    return FillFrom(weights_.UpdateWeightsFromDisk(req->model_path(), PolicyFrom(*req)), resp);
  });
}

grpc::ServerReadReactor<rl::v1::UpdateWeightsFromTensorRequest>*
AdminService::UpdateWeightsFromTensor(Ctx* c, rl::v1::AdminResponse* resp) {
  return new TensorUpdateReactor(weights_, host_.limits(), executor_,
                                 AdmitStream(*c, "UpdateWeightsFromTensor"),
                                 allow_non_finite_weights_, c, resp);
}

grpc::ServerUnaryReactor* AdminService::InitWeightsUpdateGroup(
    Ctx* c, const rl::v1::InitWeightsUpdateGroupRequest* req, rl::v1::AdminResponse* resp) {
  return RunAsync(c, "InitWeightsUpdateGroup", [this, req, resp] {
    const std::string default_backend =
        control_.model_identity().backend == "cuda" ? "nccl" : "tcp";
    return FillFrom(weights_.InitWeightsUpdateGroup(GroupRequestFrom(*req, default_backend)), resp);
  });
}

grpc::ServerUnaryReactor* AdminService::UpdateWeightsFromDistributed(
    Ctx* c, const rl::v1::UpdateWeightsFromDistributedRequest* req, rl::v1::AdminResponse* resp) {
  return RunAsync(c, "UpdateWeightsFromDistributed", [this, req, resp]() -> absl::Status {
    ASSIGN_OR_RETURN(std::vector<model::TensorInfo> specs, SpecsFrom(*req));
    return FillFrom(weights_.UpdateWeightsFromDistributed(req->group_name(), std::move(specs),
                                                          PolicyFrom(*req)),
                    resp);
  });
}

grpc::ServerUnaryReactor* AdminService::PrepareWeightsUpdate(
    Ctx* c, const rl::v1::PrepareWeightsUpdateRequest* req, rl::v1::AdminResponse* resp) {
  return RunAsync(c, "PrepareWeightsUpdate", [this, req, resp]() -> absl::Status {
    ASSIGN_OR_RETURN(WeightBuckets buckets, BucketsFrom(req->buckets()));
    ASSIGN_OR_RETURN(std::optional<GroupDelta> delta, GroupDeltaOf(*req));
    if (delta.has_value()) {
      return FillFrom(weights_.PrepareDeltaWeightsUpdate(req->group_name(), std::move(buckets),
                                                         *std::move(delta)),
                      resp);
    }
    return FillFrom(weights_.PrepareWeightsUpdate(req->group_name(), std::move(buckets)), resp);
  });
}

grpc::ServerUnaryReactor* AdminService::CompleteWeightsUpdate(
    Ctx* c, const rl::v1::CompleteWeightsUpdateRequest* req, rl::v1::AdminResponse* resp) {
  return RunAsync(c, "CompleteWeightsUpdate", [this, req, resp]() -> absl::Status {
    const UpdatePolicy policy = PolicyFrom(*req);
    if (req->stage()) {
      RETURN_IF_ERROR(CheckStagePolicy(policy));
      return FillFrom(
          weights_.CompleteWeightsUpdateStaged(req->group_name(), policy.weight_version), resp);
    }
    return FillFrom(weights_.CompleteWeightsUpdate(req->group_name(), policy), resp);
  });
}

grpc::ServerUnaryReactor* AdminService::ReceiveWeights(Ctx* c,
                                                       const rl::v1::ReceiveWeightsRequest* req,
                                                       rl::v1::AdminResponse* resp) {
  return RunAsync(c, "ReceiveWeights", [this, req, resp]() -> absl::Status {
    ASSIGN_OR_RETURN(WeightBuckets buckets, BucketsFrom(req->buckets()));
    const UpdatePolicy policy = PolicyFrom(*req);
    if (req->stage()) RETURN_IF_ERROR(CheckStagePolicy(policy));
    ASSIGN_OR_RETURN(std::optional<GroupDelta> delta, GroupDeltaOf(*req));
    if (delta.has_value()) {
      return FillFrom(weights_.ReceiveDeltaWeights(req->group_name(), std::move(buckets),
                                                   *std::move(delta), policy, req->stage()),
                      resp);
    }
    if (req->stage()) {
      return FillFrom(weights_.ReceiveWeightsStaged(req->group_name(), std::move(buckets),
                                                    policy.weight_version),
                      resp);
    }
    return FillFrom(weights_.ReceiveWeights(req->group_name(), std::move(buckets), policy), resp);
  });
}

grpc::ServerUnaryReactor* AdminService::DestroyWeightsUpdateGroup(
    Ctx* c, const rl::v1::DestroyWeightsUpdateGroupRequest* req, rl::v1::AdminResponse* resp) {
  return RunAsync(c, "DestroyWeightsUpdateGroup", [this, req, resp] {
    return FillFrom(weights_.DestroyWeightsUpdateGroup(req->group_name()), resp);
  });
}

grpc::ServerUnaryReactor* AdminService::GetModelInfo(Ctx* c, const rl::v1::GetModelInfoRequest*,
                                                     rl::v1::GetModelInfoResponse* resp) {
  if (absl::Status s = auth_.Check(*c); !s.ok()) return FinishUnary(c, s);
  RenewLease(*c);
  FillModelInfo(host_.engine().model_config(), control_.model_identity(), host_.weight_version(),
                resp);
  return FinishUnary(c, absl::OkStatus());
}

grpc::ServerUnaryReactor* AdminService::GetServerInfo(Ctx* c, const rl::v1::GetServerInfoRequest*,
                                                      rl::v1::GetServerInfoResponse* resp) {
  if (absl::Status s = auth_.Check(*c); !s.ok()) return FinishUnary(c, s);
  RenewLease(*c);
  FillServerInfo(host_.engine().GetServerInfo(), control_.worker_info(), resp);
  const AdminLease::State lease = lease_.state();
  resp->set_admin_lease_owner(lease.owner);
  resp->set_admin_lease_expires_in_ms(lease.expires_in_ms);
  return FinishUnary(c, absl::OkStatus());
}

grpc::ServerUnaryReactor* AdminService::ListWeights(Ctx* c, const rl::v1::ListWeightsRequest*,
                                                    rl::v1::ListWeightsResponse* resp) {
  return RunAsync(
      c, "ListWeights",
      [this, resp]() -> absl::Status {
        ASSIGN_OR_RETURN(std::vector<model::TensorInfo> weights, weights_.ListWeights());
        ToProto(weights, resp);
        return absl::OkStatus();
      },
      /*control=*/false);
}

grpc::ServerUnaryReactor* AdminService::WeightsChecker(Ctx* c,
                                                       const rl::v1::WeightsCheckerRequest* req,
                                                       rl::v1::WeightsCheckerResponse* resp) {
  return RunAsync(c, "WeightsChecker", [this, req, resp]() -> absl::Status {
    ASSIGN_OR_RETURN(CheckerAction action, FromProto(req->action()));
    ASSIGN_OR_RETURN(CheckerResult r, control_.CheckWeights(action));
    ToProto(r, resp);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AdminService::ReleaseMemory(Ctx* c, const rl::v1::ReleaseMemoryRequest*,
                                                      rl::v1::AdminResponse* resp) {
  return RunAsync(c, "ReleaseMemory",
                  [this, resp] { return FillFrom(control_.ReleaseMemory(), resp); });
}

grpc::ServerUnaryReactor* AdminService::StageWeights(Ctx* c, const rl::v1::StageWeightsRequest* req,
                                                     rl::v1::AdminResponse* resp) {
  return RunAsync(c, "StageWeights", [this, req, resp] {
    std::optional<int64_t> version;
    if (req->has_weight_version()) version = req->weight_version();
    return FillFrom(weights_.StageWeightsFromDisk(req->model_path(), version), resp);
  });
}

grpc::ServerUnaryReactor* AdminService::ActivateWeights(Ctx* c,
                                                        const rl::v1::ActivateWeightsRequest* req,
                                                        rl::v1::AdminResponse* resp) {
  return RunAsync(c, "ActivateWeights", [this, req, resp] {
    return FillFrom(weights_.ActivateStagedWeights(PolicyFrom(*req)), resp);
  });
}

grpc::ServerUnaryReactor* AdminService::DropStagedWeights(Ctx* c,
                                                          const rl::v1::DropStagedWeightsRequest*,
                                                          rl::v1::AdminResponse* resp) {
  return RunAsync(c, "DropStagedWeights",
                  [this, resp] { return FillFrom(weights_.DropStagedWeights(), resp); });
}

grpc::ServerUnaryReactor* AdminService::ResumeMemory(Ctx* c, const rl::v1::ResumeMemoryRequest*,
                                                     rl::v1::AdminResponse* resp) {
  return RunAsync(c, "ResumeMemory",
                  [this, resp] { return FillFrom(control_.ResumeMemory(), resp); });
}

grpc::ServerUnaryReactor* AdminService::SendWeightsToPeer(
    Ctx* c, const rl::v1::SendWeightsToPeerRequest* req, rl::v1::AdminResponse* resp) {
  PeerSender::Request r;
  r.target = req->target();
  r.weight_version = req->weight_version();
  r.chunk_bytes = req->chunk_bytes();
  r.abort_all_requests = req->abort_all_requests();
  r.keep_pause = req->keep_pause();
  r.timeout = std::chrono::milliseconds(req->timeout_ms());
  // The receiver is fenced and keyed like this worker: the caller's headers go on.
  for (const char* key : {"authorization", kLeaseOwnerHeader, kLeaseTtlHeader}) {
    auto it = c->client_metadata().find(key);
    if (it != c->client_metadata().end()) {
      r.metadata.emplace_back(key, std::string(it->second.data(), it->second.size()));
    }
  }
  return RunAsync(c, "SendWeightsToPeer", [this, c, r = std::move(r), resp]() -> absl::Status {
    if (peer_sender_ == nullptr) {
      return absl::UnimplementedError("SendWeightsToPeer: this worker cannot send its weights");
    }
    ASSIGN_OR_RETURN(PeerSender::Outcome out,
                     peer_sender_->Send(r, [c] { return c->IsCancelled(); }));
    RETURN_IF_ERROR(FillFrom(out.admin, resp));
    resp->set_weights_sha256(out.rank_sha256);
    return absl::OkStatus();
  });
}

}  // namespace rl::worker
