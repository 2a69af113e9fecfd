#include "services/worker/admin_service.h"

#include <functional>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc_status.h"
#include "common/model_io/dtype.h"
#include "common/request_limits.h"
#include "common/status.h"
#include "services/worker/proto_convert.h"
#include "services/worker/weight_update_controller.h"
#include "services/worker/worker_server.h"

namespace rl::worker {
namespace {

using Ctx = grpc::CallbackServerContext;

// Checks the key, then runs `fn` on its own thread and finishes the call with its status.
grpc::ServerUnaryReactor* RunAsync(Ctx* context, const BearerAuth* auth,
                                   std::function<absl::Status()> fn) {
  if (absl::Status s = auth->Check(*context); !s.ok()) return FinishUnary(context, s);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  std::thread([reactor, fn = std::move(fn)] { reactor->Finish(ToGrpcStatus(fn())); }).detach();
  return reactor;
}

void Fill(const AdminOutcome& o, rl::v1::AdminResponse* resp) {
  resp->set_success(true);
  resp->set_message(o.message);
  resp->set_num_aborted(o.num_aborted);
  resp->set_weight_version(o.weight_version);
  resp->set_duration_us(o.duration_us);
  resp->set_ready(o.ready);
}

absl::Status FillFrom(absl::StatusOr<AdminOutcome> o, rl::v1::AdminResponse* resp) {
  if (!o.ok()) return o.status();
  Fill(*o, resp);
  return absl::OkStatus();
}

// The update policy of a weight-update request. Its flush_cache field is not read: every
// update flushes the prefix cache (KV computed with the old weights is never reused), whatever
// the request says (README "Semantics worth knowing"; UpdatePolicy).
template <typename Request>
UpdatePolicy PolicyFrom(const Request& req) {
  UpdatePolicy policy;
  if (req.has_weight_version()) policy.weight_version = req.weight_version();
  policy.abort_all_requests = req.abort_all_requests();
  if constexpr (requires { req.keep_pause(); }) policy.keep_pause = req.keep_pause();
  return policy;
}

// Assembles the tensors of an UpdateWeightsFromTensor stream, chunk by chunk, and applies them
// when the client half-closes. Every chunk is checked (known dtype, consistent name/dtype/shape,
// offset and size within the tensor, no overlap); a tensor must arrive complete.
class TensorUpdateReactor final : public grpc::ServerReadReactor<rl::v1::UpdateWeightsFromTensorRequest> {
 public:
  TensorUpdateReactor(const WorkerServer* server, WeightUpdateController* updates,
                      const BearerAuth* auth, Ctx* context, rl::v1::AdminResponse* response)
      : server_(server), updates_(updates), response_(response) {
    if (absl::Status s = auth->Check(*context); !s.ok()) {
      Finish(ToGrpcStatus(s));
      return;
    }
    StartRead(&msg_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // client half-closed: apply
      std::thread([this] { Finish(ToGrpcStatus(Apply())); }).detach();
      return;
    }
    if (absl::Status s = AddChunk(); !s.ok()) {
      Finish(ToGrpcStatus(s));
      return;
    }
    StartRead(&msg_);
  }

  void OnDone() override { delete this; }

 private:
  struct Pending {
    NamedTensor tensor;
    int64_t received = 0;
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
  };

  absl::Status AddChunk() {
    if (first_) {
      first_ = false;
      policy_ = PolicyFrom(msg_);
    }
    const rl::v1::TensorChunk& c = msg_.chunk();
    // The header is checked against the served weights (name, shape, bounded dtype size)
    // before anything is allocated for it; the stream's total stays under --max-update-bytes.
    int64_t total = 0;
    RETURN_IF_ERROR(CheckChunkForModel(c, server_->weight_shapes(), server_->limits(), &total));
    auto [it, inserted] = pending_.try_emplace(c.name());
    Pending& p = it->second;
    if (inserted) {
      if (total > server_->limits().max_update_bytes - allocated_) {
        pending_.erase(it);
        return absl::InvalidArgumentError(
            absl::StrCat("chunk: the stream's tensors need more than --max-update-bytes (",
                         server_->limits().max_update_bytes, ")"));
      }
      allocated_ += total;
      p.tensor.info = {c.name(), c.dtype(), std::vector<int64_t>(c.shape().begin(), c.shape().end())};
      p.tensor.bytes.resize(static_cast<size_t>(total));
    } else if (p.tensor.info.dtype != c.dtype()) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk: ", QuoteForError(c.name()), " changed dtype between chunks"));
    }
    const uint64_t begin = c.offset(), end = begin + c.data().size();
    if (end > static_cast<uint64_t>(total) || end < begin) {
      return absl::InvalidArgumentError(absl::StrCat("chunk.offset: bytes [", begin, ", ", end,
                                                     ") outside ", QuoteForError(c.name()), " (",
                                                     total, " bytes)"));
    }
    for (const auto& [b, e] : p.ranges) {
      if (begin < e && b < end) {
        return absl::InvalidArgumentError(
            absl::StrCat("chunk.offset: overlapping chunks of ", QuoteForError(c.name())));
      }
    }
    p.ranges.emplace_back(begin, end);
    std::copy(c.data().begin(), c.data().end(), p.tensor.bytes.begin() + static_cast<int64_t>(begin));
    p.received += static_cast<int64_t>(c.data().size());
    return absl::OkStatus();
  }

  absl::Status Apply() {
    std::vector<NamedTensor> tensors;
    for (auto& [name, p] : pending_) {
      if (p.received != static_cast<int64_t>(p.tensor.bytes.size())) {
        return absl::InvalidArgumentError(absl::StrCat("chunk: '", name, "' incomplete: ", p.received,
                                                       " of ", p.tensor.bytes.size(), " bytes"));
      }
      tensors.push_back(std::move(p.tensor));
    }
    pending_.clear();
    return FillFrom(updates_->UpdateWeightsFromTensors(std::move(tensors), policy_), response_);
  }

  const WorkerServer* server_;
  WeightUpdateController* updates_;
  rl::v1::AdminResponse* response_;
  rl::v1::UpdateWeightsFromTensorRequest msg_;
  bool first_ = true;
  UpdatePolicy policy_;
  std::map<std::string, Pending> pending_;
  int64_t allocated_ = 0;  // bytes of the tensors in pending_, at most --max-update-bytes
};

}  // namespace

grpc::ServerUnaryReactor* AdminService::PauseGeneration(Ctx* c,
                                                        const rl::v1::PauseGenerationRequest* req,
                                                        rl::v1::AdminResponse* resp) {
  return RunAsync(c, auth_, [this, req, resp] {
    ASSIGN_OR_RETURN(engine::PauseMode mode, FromProto(req->mode()));
    return FillFrom(server_->Pause(mode), resp);
  });
}

grpc::ServerUnaryReactor* AdminService::ContinueGeneration(Ctx* c,
                                                           const rl::v1::ContinueGenerationRequest*,
                                                           rl::v1::AdminResponse* resp) {
  return RunAsync(c, auth_, [this, resp] { return FillFrom(server_->Continue(), resp); });
}

grpc::ServerUnaryReactor* AdminService::FlushCache(Ctx* c, const rl::v1::FlushCacheRequest*,
                                                   rl::v1::AdminResponse* resp) {
  return RunAsync(c, auth_, [this, resp] { return FillFrom(server_->FlushCache(), resp); });
}

grpc::ServerUnaryReactor* AdminService::UpdateWeightsFromDisk(
    Ctx* c, const rl::v1::UpdateWeightsFromDiskRequest* req, rl::v1::AdminResponse* resp) {
  return RunAsync(c, auth_, [this, req, resp] {
    return FillFrom(updates_->UpdateWeightsFromDisk(req->model_path(), PolicyFrom(*req)), resp);
  });
}

grpc::ServerReadReactor<rl::v1::UpdateWeightsFromTensorRequest>*
AdminService::UpdateWeightsFromTensor(Ctx* c, rl::v1::AdminResponse* resp) {
  return new TensorUpdateReactor(server_, updates_, auth_, c, resp);
}

grpc::ServerUnaryReactor* AdminService::InitWeightsUpdateGroup(
    Ctx* c, const rl::v1::InitWeightsUpdateGroupRequest* req, rl::v1::AdminResponse* resp) {
  return RunAsync(c, auth_, [this, req, resp]() -> absl::Status {
    GroupRequest g;
    g.master_address = req->master_address();
    g.master_port = req->master_port();
    g.rank_offset = req->rank_offset();
    g.world_size = req->world_size();
    g.group_name = req->group_name();
    switch (req->backend()) {
      case rl::v1::GROUP_BACKEND_NCCL:
        g.backend = "nccl";
        break;
      case rl::v1::GROUP_BACKEND_TCP:
        g.backend = "tcp";
        break;
      default:
        g.backend = server_->backend_name() == "cuda" ? "nccl" : "tcp";
    }
    if (req->has_timeout_ms()) g.timeout_ms = req->timeout_ms();
    return FillFrom(updates_->InitWeightsUpdateGroup(g), resp);
  });
}

grpc::ServerUnaryReactor* AdminService::UpdateWeightsFromDistributed(
    Ctx* c, const rl::v1::UpdateWeightsFromDistributedRequest* req, rl::v1::AdminResponse* resp) {
  return RunAsync(c, auth_, [this, req, resp]() -> absl::Status {
    if (req->names_size() != req->dtypes_size() || req->names_size() != req->shapes_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "names/dtypes/shapes: lengths differ (", req->names_size(), "/", req->dtypes_size(), "/",
          req->shapes_size(), ")"));
    }
    std::vector<model::TensorInfo> specs;
    for (int i = 0; i < req->names_size(); ++i) {
      specs.push_back({req->names(i), req->dtypes(i),
                       {req->shapes(i).dims().begin(), req->shapes(i).dims().end()}});
    }
    return FillFrom(updates_->UpdateWeightsFromDistributed(req->group_name(), std::move(specs),
                                                           PolicyFrom(*req)),
                    resp);
  });
}

// The buckets of a Prepare/ReceiveWeights request; InvalidArgument when a bucket's lists differ
// in length.
absl::StatusOr<std::vector<std::vector<model::TensorInfo>>> BucketsFrom(
    const google::protobuf::RepeatedPtrField<rl::v1::WeightBucket>& in) {
  std::vector<std::vector<model::TensorInfo>> out;
  for (int b = 0; b < in.size(); ++b) {
    const rl::v1::WeightBucket& bucket = in[b];
    if (bucket.names_size() != bucket.dtypes_size() ||
        bucket.names_size() != bucket.shapes_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "buckets[", b, "]: names/dtypes/shapes lengths differ (", bucket.names_size(), "/",
          bucket.dtypes_size(), "/", bucket.shapes_size(), ")"));
    }
    std::vector<model::TensorInfo>& specs = out.emplace_back();
    for (int i = 0; i < bucket.names_size(); ++i) {
      specs.push_back({bucket.names(i),
                       bucket.dtypes(i),
                       {bucket.shapes(i).dims().begin(), bucket.shapes(i).dims().end()}});
    }
  }
  return out;
}

grpc::ServerUnaryReactor* AdminService::PrepareWeightsUpdate(
    Ctx* c, const rl::v1::PrepareWeightsUpdateRequest* req, rl::v1::AdminResponse* resp) {
  return RunAsync(c, auth_, [this, req, resp]() -> absl::Status {
    ASSIGN_OR_RETURN(auto buckets, BucketsFrom(req->buckets()));
    return FillFrom(updates_->PrepareWeightsUpdate(req->group_name(), std::move(buckets)), resp);
  });
}

grpc::ServerUnaryReactor* AdminService::CompleteWeightsUpdate(
    Ctx* c, const rl::v1::CompleteWeightsUpdateRequest* req, rl::v1::AdminResponse* resp) {
  return RunAsync(c, auth_, [this, req, resp]() -> absl::Status {
    return FillFrom(updates_->CompleteWeightsUpdate(req->group_name(), PolicyFrom(*req)), resp);
  });
}

grpc::ServerUnaryReactor* AdminService::ReceiveWeights(Ctx* c,
                                                       const rl::v1::ReceiveWeightsRequest* req,
                                                       rl::v1::AdminResponse* resp) {
  return RunAsync(c, auth_, [this, req, resp]() -> absl::Status {
    ASSIGN_OR_RETURN(auto buckets, BucketsFrom(req->buckets()));
    return FillFrom(
        updates_->ReceiveWeights(req->group_name(), std::move(buckets), PolicyFrom(*req)), resp);
  });
}

grpc::ServerUnaryReactor* AdminService::DestroyWeightsUpdateGroup(
    Ctx* c, const rl::v1::DestroyWeightsUpdateGroupRequest* req, rl::v1::AdminResponse* resp) {
  return RunAsync(c, auth_, [this, req, resp] {
    return FillFrom(updates_->DestroyWeightsUpdateGroup(req->group_name()), resp);
  });
}

grpc::ServerUnaryReactor* AdminService::GetModelInfo(Ctx* c, const rl::v1::GetModelInfoRequest*,
                                                     rl::v1::GetModelInfoResponse* resp) {
  if (absl::Status s = auth_->Check(*c); !s.ok()) return FinishUnary(c, s);
  FillModelInfo(server_->model_config(), server_->model_identity(), server_->weight_version(),
                resp);
  return FinishUnary(c, absl::OkStatus());
}

grpc::ServerUnaryReactor* AdminService::GetServerInfo(Ctx* c, const rl::v1::GetServerInfoRequest*,
                                                      rl::v1::GetServerInfoResponse* resp) {
  if (absl::Status s = auth_->Check(*c); !s.ok()) return FinishUnary(c, s);
  FillServerInfo(server_->engine().GetServerInfo(), server_->worker_info(), resp);
  return FinishUnary(c, absl::OkStatus());
}

grpc::ServerUnaryReactor* AdminService::ListWeights(Ctx* c, const rl::v1::ListWeightsRequest*,
                                                    rl::v1::ListWeightsResponse* resp) {
  return RunAsync(c, auth_, [this, resp]() -> absl::Status {
    ASSIGN_OR_RETURN(std::vector<model::TensorInfo> weights, updates_->ListWeights());
    for (const auto& w : weights) {
      rl::v1::WeightInfo* info = resp->add_weights();
      info->set_name(w.name);
      info->set_dtype(w.dtype);
      info->mutable_shape()->Assign(w.shape.begin(), w.shape.end());
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AdminService::WeightsChecker(Ctx* c,
                                                       const rl::v1::WeightsCheckerRequest* req,
                                                       rl::v1::WeightsCheckerResponse* resp) {
  return RunAsync(c, auth_, [this, req, resp]() -> absl::Status {
    WorkerServer::CheckerAction action;
    switch (req->action()) {
      case rl::v1::WEIGHTS_CHECKER_ACTION_SNAPSHOT:
        action = WorkerServer::CheckerAction::kSnapshot;
        break;
      case rl::v1::WEIGHTS_CHECKER_ACTION_RESET_TENSORS:
        action = WorkerServer::CheckerAction::kResetTensors;
        break;
      case rl::v1::WEIGHTS_CHECKER_ACTION_COMPARE:
        action = WorkerServer::CheckerAction::kCompare;
        break;
      case rl::v1::WEIGHTS_CHECKER_ACTION_CHECKSUM:
        action = WorkerServer::CheckerAction::kChecksum;
        break;
      default:
        return absl::InvalidArgumentError(
            "action: must be SNAPSHOT, RESET_TENSORS, COMPARE or CHECKSUM");
    }
    ASSIGN_OR_RETURN(CheckerResult r, server_->CheckWeights(action));
    resp->set_success(r.missing.empty() && r.unexpected.empty());
    resp->set_message(r.message);
    for (auto& s : r.missing) resp->add_missing(s);
    for (auto& s : r.unexpected) resp->add_unexpected(s);
    for (auto& s : r.changed) resp->add_changed(s);
    for (auto& [name, digest] : r.tensor_sha256) (*resp->mutable_tensor_sha256())[name] = digest;
    resp->set_rank_sha256(r.rank_sha256);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AdminService::ReleaseMemory(Ctx* c, const rl::v1::ReleaseMemoryRequest*,
                                                      rl::v1::AdminResponse* resp) {
  return RunAsync(c, auth_, [this, resp] { return FillFrom(server_->ReleaseMemory(), resp); });
}

grpc::ServerUnaryReactor* AdminService::ResumeMemory(Ctx* c, const rl::v1::ResumeMemoryRequest*,
                                                     rl::v1::AdminResponse* resp) {
  return RunAsync(c, auth_, [this, resp] { return FillFrom(server_->ResumeMemory(), resp); });
}

}  // namespace rl::worker
