#include "services/router/admin/admin_service.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "services/router/admin/tensor_fanout.h"

namespace rl::router::admin {

namespace {

// FAILED_PRECONDITION naming every staged digest and the workers that staged it ("" shown as
// "unknown"): two workers staged different contents, so none activates.
absl::Status StagedDigestsDiffer(absl::string_view what,
                                 const std::map<std::string, std::vector<std::string>>& digests,
                                 absl::string_view note = "") {
  std::vector<std::string> parts;
  for (const auto& [sha, workers] : digests) {
    parts.push_back(absl::StrCat(sha.empty() ? std::string("unknown") : sha, " on ",
                                 absl::StrJoin(workers, ", ")));
  }
  return absl::FailedPreconditionError(
      absl::StrCat(what, ": the live workers staged different contents (staged_weights_sha256: ",
                   absl::StrJoin(parts, "; "), "), so none activates", note));
}

std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

}  // namespace

AdminService::AdminService(WorkerPool* pool, const BearerAuth* auth, AdminOptions options)
    : pool_(pool),
      auth_(auth),
      executor_(options.executor),
      limits_(options.limits),
      drain_(options.drain),
      broadcaster_(pool, std::move(options.broadcast)),
      catch_up_(std::make_unique<CatchUp>(pool, &broadcaster_)),
      lease_keeper_(std::make_unique<LeaseKeeper>(&broadcaster_)) {}

AdminService::~AdminService() {
  lease_keeper_.reset();
  catch_up_.reset();
}

grpc::ServerUnaryReactor* AdminService::Run(Ctx* c, std::function<absl::Status()> fn) {
  if (absl::Status s = auth_->Check(*c); !s.ok()) return FinishUnary(c, s);
  if (drain_ != nullptr) {
    if (absl::Status s = drain_->Check("admin call"); !s.ok()) return FinishUnary(c, s);
  }
  grpc::ServerUnaryReactor* reactor = c->DefaultReactor();
  if (!executor_->Submit([reactor, fn = std::move(fn)] { reactor->Finish(ToGrpcStatus(fn())); })) {
    reactor->Finish(ToGrpcStatus(executor_->BusyError()));
  }
  return reactor;
}

template <typename Request>
grpc::ServerUnaryReactor* AdminService::Forward(
    Ctx* c, const Request* req, rl::v1::AdminResponse* resp, Plan plan,
    AsyncMethod<Request, rl::v1::AdminResponse> method) {
  return Run(c, [this, c, req, resp, plan = std::move(plan), method] {
    return broadcaster_.Broadcast(
        plan, c,
        [req, method](Worker& w, size_t, grpc::ClientContext* ctx, rl::v1::AdminResponse* r,
                      Done done) {
          (w.admin_stub().async()->*method)(ctx, req, r, std::move(done));
        },
        resp);
  });
}

template <typename Request>
grpc::ServerUnaryReactor* AdminService::ForwardStage(
    Ctx* c, const Request* req, rl::v1::AdminResponse* resp, const char* what,
    AsyncMethod<Request, rl::v1::AdminResponse> method) {
  return Run(c, [this, c, req, resp, what, method] {
    RETURN_IF_ERROR(broadcaster_.lock().Acquire(what));
    absl::Status s = broadcaster_.BroadcastLocked(
        {.what = what, .deadline = Deadline::kLoad}, c,
        [req, method](Worker& w, size_t, grpc::ClientContext* ctx, rl::v1::AdminResponse* r,
                      Done done) {
          (w.admin_stub().async()->*method)(ctx, req, r, std::move(done));
        },
        resp);
    if (s.ok()) DropUnlessAllStagedLocked(c, what, resp);
    broadcaster_.lock().Release();
    return s;
  });
}

// ---- calls that change fleet state: broadcasts under the admin lock ----

grpc::ServerUnaryReactor* AdminService::PauseGeneration(Ctx* c,
                                                        const rl::v1::PauseGenerationRequest* req,
                                                        rl::v1::AdminResponse* resp) {
  Plan plan{.what = "PauseGeneration", .hold = true, .sets_paused = true};
  if (req->mode() == rl::v1::PAUSE_MODE_DRAIN) {
    // The workers answer once drained or after drain_timeout_ms: their deadline covers it.
    // Requests arriving meanwhile wait for the hold like in any pause (bounded by their own
    // deadline and --hold-wait-ms), then queue on the paused workers until the continue.
    constexpr int32_t kDefaultDrainMs = 60000, kMaxDrainMs = 600000;
    const int32_t ms = req->has_drain_timeout_ms() ? req->drain_timeout_ms() : kDefaultDrainMs;
    if (ms < 0 || ms > kMaxDrainMs) {
      if (absl::Status s = auth_->Check(*c); !s.ok()) return FinishUnary(c, s);
      return FinishUnary(c, absl::InvalidArgumentError(absl::StrCat(
                                "drain_timeout_ms: must be in [0, ", kMaxDrainMs, "], got ", ms)));
    }
    plan.extra_timeout = std::chrono::milliseconds(ms);
  }
  return Forward(c, req, resp, std::move(plan), &AsyncAdmin::PauseGeneration);
}

grpc::ServerUnaryReactor* AdminService::ContinueGeneration(
    Ctx* c, const rl::v1::ContinueGenerationRequest* req, rl::v1::AdminResponse* resp) {
  return Forward(c, req, resp, {.what = "ContinueGeneration", .sets_paused = false},
                 &AsyncAdmin::ContinueGeneration);
}

grpc::ServerUnaryReactor* AdminService::FlushCache(Ctx* c, const rl::v1::FlushCacheRequest* req,
                                                   rl::v1::AdminResponse* resp) {
  return Forward(c, req, resp, {.what = "FlushCache"}, &AsyncAdmin::FlushCache);
}

grpc::ServerUnaryReactor* AdminService::UpdateWeightsFromDisk(
    Ctx* c, const rl::v1::UpdateWeightsFromDiskRequest* req, rl::v1::AdminResponse* resp) {
  return Run(c, [this, c, req, resp]() -> absl::Status {
    Plan plan{.what = "UpdateWeightsFromDisk",
              .deadline = Deadline::kLoad,
              .hold = true,
              .bumps_version = true,
              .source = FleetWeights::Source::kDisk,
              .path = req->model_path(),
              .sets_paused = req->keep_pause(),
              .only = {req->workers().begin(), req->workers().end()}};
    rl::v1::UpdateWeightsFromDiskRequest mine = *req;
    mine.clear_workers();
    if (!plan.only.empty()) RETURN_IF_ERROR(CheckResync(c, &mine, &plan));
    return broadcaster_.Broadcast(
        plan, c,
        [&mine](Worker& w, size_t, grpc::ClientContext* ctx, rl::v1::AdminResponse* r, Done done) {
          w.admin_stub().async()->UpdateWeightsFromDisk(ctx, &mine, r, std::move(done));
        },
        resp);
  });
}

grpc::ServerReadReactor<rl::v1::UpdateWeightsFromTensorRequest>*
AdminService::UpdateWeightsFromTensor(Ctx* c, rl::v1::AdminResponse* resp) {
  if (absl::Status s = auth_->Check(*c); !s.ok()) return NewRejectedTensorStream(s);
  if (drain_ != nullptr) {
    if (absl::Status s = drain_->Check("admin call"); !s.ok()) return NewRejectedTensorStream(s);
  }
  // Chunks are forwarded as they arrive (tensor_fanout.h), under one broadcast.
  return NewTensorRelay(
      c,
      [this, c, resp](const TensorRelayStart& start) {
        if (start.stage) return StageTensorsLocked(c, start, resp);
        Plan plan{.what = "UpdateWeightsFromTensor",
                  .deadline = Deadline::kLoad,
                  .hold = true,
                  .partial = Partial::kTensor,
                  .bumps_version = true,
                  .source = FleetWeights::Source::kTensor,
                  .sets_paused = start.keep_pause};
        plan.started = start.started;
        return broadcaster_.Broadcast(plan, c, start.call, resp);
      },
      executor_, pool_,
      TensorRelayOptions{.limits = limits_, .load_timeout = broadcaster_.options().load_timeout});
}

// A staged tensor push (issue 30): every live worker stages the stream (serving as before: no
// hold, nothing recorded); all or none: when one fails, the others drop what they staged, so a
// later ActivateWeights finds nothing to activate anywhere.
absl::Status AdminService::StageTensorsLocked(Ctx* c, const TensorRelayStart& start,
                                              rl::v1::AdminResponse* resp) {
  RETURN_IF_ERROR(broadcaster_.lock().Acquire("UpdateWeightsFromTensor (stage)"));
  Plan plan{.what = "UpdateWeightsFromTensor (stage)", .deadline = Deadline::kLoad};
  plan.started = start.started;
  absl::Status s = broadcaster_.BroadcastLocked(plan, c, start.call, resp);
  if (s.ok()) DropUnlessAllStagedLocked(c, "UpdateWeightsFromTensor (stage)", resp);
  broadcaster_.lock().Release();
  return s;
}

void AdminService::DropUnlessAllStagedLocked(Ctx* c, const char* what,
                                             rl::v1::AdminResponse* resp) {
  std::vector<std::string> ok_workers;
  for (const rl::v1::WorkerResult& r : resp->results()) {
    if (r.success()) ok_workers.push_back(r.worker());
  }
  if (ok_workers.size() == static_cast<size_t>(resp->results_size())) return;
  if (!ok_workers.empty()) {
    const rl::v1::DropStagedWeightsRequest drop;
    rl::v1::AdminResponse dropped;
    (void)broadcaster_.BroadcastLocked(
        {.what = "drop staged (a stage failed)", .only = ok_workers}, c,
        [&drop](Worker& w, size_t, grpc::ClientContext* ctx, rl::v1::AdminResponse* r, Done done) {
          w.admin_stub().async()->DropStagedWeights(ctx, &drop, r, std::move(done));
        },
        &dropped);
    for (rl::v1::WorkerResult& r : *resp->mutable_results()) {
      if (r.success())
        r.set_message(absl::StrCat(r.message(), "; dropped (not every worker staged)"));
    }
  }
  resp->set_success(false);
  resp->set_message(absl::StrCat(what, ": staging failed on ",
                                 resp->results_size() - static_cast<int>(ok_workers.size()), " of ",
                                 resp->results_size(),
                                 " workers, so nothing is staged anywhere (the staged copies were "
                                 "dropped); the fleet keeps serving its version"));
}

absl::Status AdminService::CheckResync(Ctx* c, rl::v1::UpdateWeightsFromDiskRequest* req,
                                       Plan* plan) {
  const std::set<std::string> named(plan->only.begin(), plan->only.end());
  std::set<std::string> others;
  for (const auto& w : pool_->LiveWorkers()) {
    if (!named.contains(w->address())) others.insert(w->address());
  }
  const FleetWeights fleet = pool_->fleet_weights();
  const int64_t reference = pool_->ReferenceVersion();
  // With no update recorded, the fleet serves what its workers were started with (--model, as
  // GetModelInfo reports it): the folders of the named workers and of the others.
  std::set<std::string> named_paths, other_paths;
  if (fleet.version < 0) {
    for (const auto& r :
         broadcaster_.Gather(c, rl::v1::GetModelInfoRequest(), &AsyncAdmin::GetModelInfo)) {
      if (!r.status.ok()) continue;
      (others.contains(r.worker) ? other_paths : named_paths).insert(r.resp.model_path());
    }
  }
  if (others.empty()) {
    // Every live worker: a fleet-wide update (the fleet's weights are recorded). Unset version:
    // the fleet's when the folder holds the fleet's weights as far as the router knows, else
    // a new one (a version never names two contents).
    plan->what = "UpdateWeightsFromDisk (resync of every live worker)";
    plan->whole_fleet = true;
    if (!req->has_weight_version() && reference >= 0) {
      const bool same = fleet.version >= 0
                            ? !fleet.replayable() || req->model_path() == fleet.path
                            : named_paths == std::set<std::string>{req->model_path()};
      req->set_weight_version(same ? reference : reference + 1);
    }
    return absl::OkStatus();
  }
  plan->what = "UpdateWeightsFromDisk (resync)";
  plan->sets_paused.reset();
  const std::string whole_fleet =
      absl::StrCat("update every worker instead (rlctl update-weights --from-disk ",
                   req->model_path(), "), or resync every live worker");
  if (req->has_weight_version() && req->weight_version() != reference) {
    return absl::FailedPreconditionError(
        absl::StrCat("weight_version: a resync brings workers to the fleet's version (", reference,
                     "); ", req->weight_version(), " would serve a version the other ",
                     others.size(), " live workers do not: ", whole_fleet));
  }
  if (fleet.version >= 0) {
    // The fleet's replayable folder is the only one known to hold its weights.
    if (fleet.replayable() && req->model_path() != fleet.path) {
      return absl::FailedPreconditionError(absl::StrCat(
          "model_path: the fleet's weights (version ", fleet.version, ") came from ", fleet.path,
          "; a resync from ", req->model_path(),
          " would serve other weights under that version: resync from ", fleet.path,
          " (the router also catches workers up from it by itself), or ", whole_fleet));
    }
  } else if (other_paths != std::set<std::string>{req->model_path()}) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model_path: no fleet update is recorded yet, so the fleet serves what its workers were "
        "started with (",
        other_paths.empty() ? std::string("unknown: no other live worker answered GetModelInfo")
                            : absl::StrJoin(other_paths, ", "),
        ", version ", reference, "); a resync of some workers from ", req->model_path(),
        " would serve other weights beside them: ", whole_fleet));
  }
  if (reference >= 0) req->set_weight_version(reference);
  return absl::OkStatus();
}

// Each worker joins as its own rank: the i-th live worker (by address) gets rank_offset + i.
grpc::ServerUnaryReactor* AdminService::InitWeightsUpdateGroup(
    Ctx* c, const rl::v1::InitWeightsUpdateGroupRequest* req, rl::v1::AdminResponse* resp) {
  return Run(c, [this, c, req, resp] {
    const Plan plan{.what = "InitWeightsUpdateGroup",
                    .deadline = Deadline::kLoad,
                    .hold = true,
                    .partial = Partial::kGroup};
    return broadcaster_.Broadcast(
        plan, c,
        [req](Worker& w, size_t i, grpc::ClientContext* ctx, rl::v1::AdminResponse* r, Done done) {
          rl::v1::InitWeightsUpdateGroupRequest mine = *req;
          mine.set_rank_offset(req->rank_offset() + static_cast<int32_t>(i));
          CallOwning(w, &AsyncAdmin::InitWeightsUpdateGroup, std::move(mine), ctx, r,
                     std::move(done));
        },
        resp);
  });
}

grpc::ServerUnaryReactor* AdminService::UpdateWeightsFromDistributed(
    Ctx* c, const rl::v1::UpdateWeightsFromDistributedRequest* req, rl::v1::AdminResponse* resp) {
  return Forward(c, req, resp,
                 {.what = "UpdateWeightsFromDistributed",
                  .deadline = Deadline::kLoad,
                  .hold = true,
                  .partial = Partial::kDistributed,
                  .bumps_version = true,
                  .source = FleetWeights::Source::kDistributed,
                  .sets_paused = false},
                 &AsyncAdmin::UpdateWeightsFromDistributed);
}

grpc::ServerUnaryReactor* AdminService::DestroyWeightsUpdateGroup(
    Ctx* c, const rl::v1::DestroyWeightsUpdateGroupRequest* req, rl::v1::AdminResponse* resp) {
  if (auth_->Check(*c).ok()) TakeDeltaPrepared(req->group_name());
  return Forward(c, req, resp, {.what = "DestroyWeightsUpdateGroup"},
                 &AsyncAdmin::DestroyWeightsUpdateGroup);
}

void AdminService::NotePrepared(const std::string& group, bool delta) {
  // Group names are the callers': at most kMaxGroups are remembered, the oldest forgotten
  // first (its Complete is then judged like a dense one: conservatively).
  constexpr size_t kMaxGroups = 1024;
  absl::MutexLock lock(&delta_mu_);
  ForgetLocked(group);
  if (!delta) return;
  if (delta_order_.size() >= kMaxGroups) {
    delta_prepared_.erase(delta_order_.front());
    delta_order_.pop_front();
  }
  delta_prepared_.insert(group);
  delta_order_.push_back(group);
}

bool AdminService::TakeDeltaPrepared(const std::string& group) {
  absl::MutexLock lock(&delta_mu_);
  return ForgetLocked(group);
}

bool AdminService::ForgetLocked(const std::string& group) {
  if (delta_prepared_.erase(group) == 0) return false;
  delta_order_.erase(std::find(delta_order_.begin(), delta_order_.end(), group));
  return true;
}

// Answers ready only when every worker posted its receive (the trainer broadcasts after that).
// A delta (parent_version) is refused by every worker that does not serve the parent, before it
// posts anything: the answer then says which, and the trainer broadcasts nothing.
grpc::ServerUnaryReactor* AdminService::PrepareWeightsUpdate(
    Ctx* c, const rl::v1::PrepareWeightsUpdateRequest* req, rl::v1::AdminResponse* resp) {
  // Only an authorized caller's Prepare is remembered (Forward refuses the others).
  if (auth_->Check(*c).ok()) NotePrepared(req->group_name(), req->has_parent_version());
  return Forward(c, req, resp, {.what = "PrepareWeightsUpdate", .deadline = Deadline::kLoad},
                 &AsyncAdmin::PrepareWeightsUpdate);
}

// The applying half of the two-phase receive and the single-call receive: like
// UpdateWeightsFromDistributed, and the fleet stays paused with keep_pause. Staged, all or none
// (ForwardStage). A delta (prepared with parent_version, or a ReceiveWeights naming one) is
// built whole before it is swapped in: a failed worker keeps its old weights and stays routed.
grpc::ServerUnaryReactor* AdminService::CompleteWeightsUpdate(
    Ctx* c, const rl::v1::CompleteWeightsUpdateRequest* req, rl::v1::AdminResponse* resp) {
  const bool delta = auth_->Check(*c).ok() && TakeDeltaPrepared(req->group_name());
  if (req->stage()) {
    return ForwardStage(c, req, resp, "CompleteWeightsUpdate (stage)",
                        &AsyncAdmin::CompleteWeightsUpdate);
  }
  return Forward(c, req, resp,
                 {.what = "CompleteWeightsUpdate",
                  .deadline = Deadline::kLoad,
                  .hold = true,
                  .partial = delta ? Partial::kDelta : Partial::kDistributed,
                  .bumps_version = true,
                  .source = FleetWeights::Source::kDistributed,
                  .sets_paused = req->keep_pause()},
                 &AsyncAdmin::CompleteWeightsUpdate);
}

grpc::ServerUnaryReactor* AdminService::ReceiveWeights(Ctx* c,
                                                       const rl::v1::ReceiveWeightsRequest* req,
                                                       rl::v1::AdminResponse* resp) {
  if (req->stage()) {
    return ForwardStage(c, req, resp, "ReceiveWeights (stage)", &AsyncAdmin::ReceiveWeights);
  }
  return Forward(c, req, resp,
                 {.what = "ReceiveWeights",
                  .deadline = Deadline::kLoad,
                  .hold = true,
                  .partial = req->has_parent_version() ? Partial::kDelta : Partial::kDistributed,
                  .bumps_version = true,
                  .source = FleetWeights::Source::kDistributed,
                  .sets_paused = req->keep_pause()},
                 &AsyncAdmin::ReceiveWeights);
}

grpc::ServerUnaryReactor* AdminService::ReleaseMemory(Ctx* c,
                                                      const rl::v1::ReleaseMemoryRequest* req,
                                                      rl::v1::AdminResponse* resp) {
  return Forward(c, req, resp, {.what = "ReleaseMemory", .deadline = Deadline::kLoad, .hold = true},
                 &AsyncAdmin::ReleaseMemory);
}

grpc::ServerUnaryReactor* AdminService::ResumeMemory(Ctx* c, const rl::v1::ResumeMemoryRequest* req,
                                                     rl::v1::AdminResponse* resp) {
  return Forward(c, req, resp, {.what = "ResumeMemory", .deadline = Deadline::kLoad, .probe = true},
                 &AsyncAdmin::ResumeMemory);
}

// ---- read-only calls: gathered from every live worker, no lock ----

grpc::ServerUnaryReactor* AdminService::GetModelInfo(Ctx* c, const rl::v1::GetModelInfoRequest* req,
                                                     rl::v1::GetModelInfoResponse* resp) {
  return Run(c, [this, c, req, resp]() -> absl::Status {
    const auto replies = broadcaster_.Gather(c, *req, &AsyncAdmin::GetModelInfo);
    if (replies.empty()) return absl::UnavailableError("GetModelInfo: no live worker");
    const Reply<rl::v1::GetModelInfoResponse>* first = nullptr;
    for (const auto& r : replies) {
      if (r.status.ok() && first == nullptr) first = &r;
    }
    if (first == nullptr) return FromGrpcStatus(replies[0].status);
    *resp = first->resp;
    // Every worker, those that did not answer with why (rlctl then exits 1).
    for (const auto& r : replies) {
      rl::v1::WorkerModelInfo* w = resp->add_workers();
      w->set_worker(r.worker);
      if (r.status.ok()) {
        *w->mutable_info() = r.resp;
      } else {
        w->set_error(absl::StrCat(CodeName(r.status.error_code()), ": ", r.status.error_message()));
      }
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AdminService::GetServerInfo(Ctx* c,
                                                      const rl::v1::GetServerInfoRequest* req,
                                                      rl::v1::GetServerInfoResponse* resp) {
  return Run(c, [this, c, req, resp]() -> absl::Status {
    // Totals over the workers; paused when any worker is.
    for (const auto& r : broadcaster_.Gather(c, *req, &AsyncAdmin::GetServerInfo)) {
      if (!r.status.ok()) {  // listed with why (rlctl then exits 1)
        rl::v1::WorkerServerInfo* w = resp->add_workers();
        w->set_worker(r.worker);
        w->set_error(absl::StrCat(CodeName(r.status.error_code()), ": ", r.status.error_message()));
        continue;
      }
      const auto& info = r.resp;
      resp->set_paused(resp->paused() || info.paused());
      resp->set_num_running(resp->num_running() + info.num_running());
      resp->set_num_waiting(resp->num_waiting() + info.num_waiting());
      resp->set_kv_tokens_total(resp->kv_tokens_total() + info.kv_tokens_total());
      resp->set_kv_tokens_available(resp->kv_tokens_available() + info.kv_tokens_available());
      resp->set_num_finished(resp->num_finished() + info.num_finished());
      resp->set_update_failed(resp->update_failed() || info.update_failed());
      resp->set_weight_version(std::max(resp->weight_version(), info.weight_version()));
      rl::v1::WorkerServerInfo* w = resp->add_workers();
      w->set_worker(r.worker);
      *w->mutable_info() = info;
    }
    return absl::OkStatus();
  });
}

// One worker answers (every worker serves the same tensors).
grpc::ServerUnaryReactor* AdminService::ListWeights(Ctx* c, const rl::v1::ListWeightsRequest* req,
                                                    rl::v1::ListWeightsResponse* resp) {
  return Run(c, [this, c, req, resp]() -> absl::Status {
    auto targets = pool_->LiveWorkers();
    if (targets.empty()) return absl::UnavailableError("ListWeights: no live worker");
    grpc::ClientContext ctx;
    broadcaster_.Prepare(c, &ctx, broadcaster_.options().control_timeout);
    CallGuard guard(&targets.front()->calls(), &ctx);
    return FromGrpcStatus(targets.front()->admin_stub().ListWeights(&ctx, *req, resp));
  });
}

grpc::ServerUnaryReactor* AdminService::WeightsChecker(Ctx* c,
                                                       const rl::v1::WeightsCheckerRequest* req,
                                                       rl::v1::WeightsCheckerResponse* resp) {
  return Run(c, [this, c, req, resp]() -> absl::Status {
    const auto replies = broadcaster_.Gather(c, *req, &AsyncAdmin::WeightsChecker);
    if (replies.empty()) return absl::UnavailableError("WeightsChecker: no live worker");
    bool all_ok = true;
    for (const auto& r : replies) {
      rl::v1::WorkerWeightsChecker* w = resp->add_workers();
      w->set_worker(r.worker);
      if (r.status.ok()) {
        *w->mutable_result() = r.resp;
        all_ok = all_ok && r.resp.success();
      } else {
        w->mutable_result()->set_success(false);
        w->mutable_result()->set_message(r.status.error_message());
        all_ok = false;
      }
    }
    resp->set_success(all_ok);
    resp->set_message(absl::StrCat(replies.size(), " workers"));
    return absl::OkStatus();
  });
}

// ---- staged refits ----

grpc::ServerUnaryReactor* AdminService::StageWeights(Ctx* c, const rl::v1::StageWeightsRequest* req,
                                                     rl::v1::AdminResponse* resp) {
  // Staging does not disturb serving: no hold, no version recorded.
  return Forward(c, req, resp, {.what = "StageWeights", .deadline = Deadline::kLoad},
                 &AsyncAdmin::StageWeights);
}

grpc::ServerUnaryReactor* AdminService::DropStagedWeights(
    Ctx* c, const rl::v1::DropStagedWeightsRequest* req, rl::v1::AdminResponse* resp) {
  return Forward(c, req, resp, {.what = "DropStagedWeights"}, &AsyncAdmin::DropStagedWeights);
}

grpc::ServerUnaryReactor* AdminService::ActivateWeights(Ctx* c,
                                                        const rl::v1::ActivateWeightsRequest* req,
                                                        rl::v1::AdminResponse* resp) {
  return Run(c, [this, c, req, resp]() -> absl::Status {
    RETURN_IF_ERROR(broadcaster_.lock().Acquire("ActivateWeights"));
    // All or none: every live worker must have a staged version (the one asked for, when named;
    // else one version for all), checked under the lock so nothing stages or drops meanwhile.
    std::vector<std::string> missing, targets;
    std::set<int64_t> versions;
    std::set<std::string> sources;
    std::map<std::string, std::vector<std::string>> digests;  // staged sha256 -> workers
    for (const auto& r :
         broadcaster_.Gather(c, rl::v1::GetServerInfoRequest(), &AsyncAdmin::GetServerInfo)) {
      targets.push_back(r.worker);
      if (!r.status.ok()) {
        missing.push_back(absl::StrCat(r.worker, " (", r.status.error_message(), ")"));
      } else if (!r.resp.has_staged_weights()) {
        missing.push_back(absl::StrCat(r.worker, " (nothing staged)"));
      } else if (req->has_weight_version() &&
                 r.resp.staged_weight_version() != req->weight_version()) {
        missing.push_back(
            absl::StrCat(r.worker, " (staged version ", r.resp.staged_weight_version(), ")"));
      } else {
        versions.insert(r.resp.staged_weight_version());
        sources.insert(r.resp.staged_source());
        digests[r.resp.staged_weights_sha256()].push_back(r.worker);
      }
    }
    constexpr absl::string_view kDiskPrefix = "disk:";
    absl::Status s;
    if (!missing.empty()) {
      s = absl::FailedPreconditionError(
          absl::StrCat("ActivateWeights: not every live worker has the version staged, so none "
                       "activates: ",
                       absl::StrJoin(missing, "; ")));
    } else if (versions.size() > 1) {
      s = absl::FailedPreconditionError(absl::StrCat(
          "ActivateWeights: the live workers staged different versions (",
          absl::StrJoin(versions, ", "), "), so none activates; name one with weight_version"));
    } else if (sources.size() != 1) {
      s = absl::FailedPreconditionError(
          absl::StrCat("ActivateWeights: the live workers staged from different sources (",
                       absl::StrJoin(sources, ", "), "), so none activates"));
    } else if (digests.size() > 1) {
      s = StagedDigestsDiffer("ActivateWeights", digests);
    } else {
      // A staged folder is replayable (catch-up reads it); a staged tensor push or group
      // receive exists only in memory, recorded like its one-call update.
      const bool disk = absl::StartsWith(*sources.begin(), kDiskPrefix);
      Plan plan{.what = "ActivateWeights",
                .deadline = Deadline::kLoad,
                .hold = true,
                .bumps_version = true,
                .source = disk ? FleetWeights::Source::kDisk
                          : absl::StartsWith(*sources.begin(), "group:")
                              ? FleetWeights::Source::kDistributed
                              : FleetWeights::Source::kTensor,
                .path = disk ? sources.begin()->substr(kDiskPrefix.size()) : std::string(),
                .sets_paused = req->keep_pause(),
                .only = targets,
                .whole_fleet = true};
      s = broadcaster_.BroadcastLocked(
          plan, c,
          [req](Worker& w, size_t, grpc::ClientContext* ctx, rl::v1::AdminResponse* r, Done done) {
            w.admin_stub().async()->ActivateWeights(ctx, req, r, std::move(done));
          },
          resp);
    }
    broadcaster_.lock().Release();
    return s;
  });
}

grpc::ServerUnaryReactor* AdminService::RefitWeights(Ctx* c, const rl::v1::RefitWeightsRequest* req,
                                                     rl::v1::AdminResponse* resp) {
  return Run(c, [this, c, req, resp]() -> absl::Status {
    if (req->model_path().empty()) return absl::InvalidArgumentError("model_path: must be set");
    if (req->has_weight_version() && req->weight_version() < 0) {
      return absl::InvalidArgumentError("weight_version: must be >= 0");
    }
    RETURN_IF_ERROR(broadcaster_.lock().Acquire("RefitWeights"));
    absl::Status s = RefitLocked(c, *req, resp);
    broadcaster_.lock().Release();
    return s;
  });
}

absl::Status AdminService::RefitLocked(Ctx* c, const rl::v1::RefitWeightsRequest& req,
                                       rl::v1::AdminResponse* resp) {
  const int64_t before = pool_->ReferenceVersion();
  const int64_t version =
      req.has_weight_version() ? req.weight_version() : std::max<int64_t>(before, 0) + 1;
  // 1. Stage on every live worker, serving as before (no hold).
  rl::v1::StageWeightsRequest stage;
  stage.set_model_path(req.model_path());
  stage.set_weight_version(version);
  rl::v1::AdminResponse staged;
  RETURN_IF_ERROR(broadcaster_.BroadcastLocked(
      {.what = "RefitWeights (stage)", .deadline = Deadline::kLoad}, c,
      [&stage](Worker& w, size_t, grpc::ClientContext* ctx, rl::v1::AdminResponse* r, Done done) {
        w.admin_stub().async()->StageWeights(ctx, &stage, r, std::move(done));
      },
      &staged));
  std::vector<std::string> ok_workers;
  size_t num_failed = 0;
  for (const rl::v1::WorkerResult& r : staged.results()) {
    if (r.success()) {
      ok_workers.push_back(r.worker());
    } else {
      ++num_failed;
    }
  }
  if (num_failed > 0) {
    // 2a. Someone could not stage: none activates; what was staged is dropped.
    rl::v1::AdminResponse dropped;
    const rl::v1::DropStagedWeightsRequest drop;
    if (!ok_workers.empty()) {
      (void)broadcaster_.BroadcastLocked(
          {.what = "RefitWeights (drop)", .only = ok_workers}, c,
          [&drop](Worker& w, size_t, grpc::ClientContext* ctx, rl::v1::AdminResponse* r,
                  Done done) {
            w.admin_stub().async()->DropStagedWeights(ctx, &drop, r, std::move(done));
          },
          &dropped);
    }
    resp->set_success(false);
    resp->set_weight_version(before);
    *resp->mutable_results() = staged.results();  // each worker's stage outcome, with reasons
    for (rl::v1::WorkerResult& r : *resp->mutable_results()) {
      if (r.success()) r.set_message(absl::StrCat(r.message(), "; dropped (not activated)"));
    }
    resp->set_message(absl::StrCat("RefitWeights: staging version ", version, " failed on ",
                                   num_failed, " of ", staged.results_size(),
                                   " workers, so none activated and the staged copies were "
                                   "dropped; the fleet keeps serving version ",
                                   before));
    return absl::OkStatus();
  }
  // 2b. Every live worker staged: their staged digests must agree (one version, one content),
  // else none activates and the staged copies are dropped.
  std::map<std::string, std::vector<std::string>> digests;
  for (const auto& r :
       broadcaster_.Gather(c, rl::v1::GetServerInfoRequest(), &AsyncAdmin::GetServerInfo)) {
    if (std::find(ok_workers.begin(), ok_workers.end(), r.worker) == ok_workers.end()) continue;
    digests[r.status.ok() ? r.resp.staged_weights_sha256() : std::string("(unreachable)")]
        .push_back(r.worker);
  }
  if (digests.size() > 1) {
    rl::v1::AdminResponse dropped;
    const rl::v1::DropStagedWeightsRequest drop;
    (void)broadcaster_.BroadcastLocked(
        {.what = "RefitWeights (drop)", .only = ok_workers}, c,
        [&drop](Worker& w, size_t, grpc::ClientContext* ctx, rl::v1::AdminResponse* r, Done done) {
          w.admin_stub().async()->DropStagedWeights(ctx, &drop, r, std::move(done));
        },
        &dropped);
    return StagedDigestsDiffer(
        "RefitWeights", digests,
        absl::StrCat("; the staged copies were dropped and the fleet keeps serving version ",
                     before));
  }
  // 2c. Activate them all (the short call: swap + flush). A worker that fails now (it died) is
  // behind the fleet's new version and is caught up from the folder.
  rl::v1::ActivateWeightsRequest activate;
  activate.set_weight_version(version);
  activate.set_abort_all_requests(req.abort_all_requests());
  activate.set_keep_pause(req.keep_pause());
  activate.set_keep_kv(req.keep_kv());
  Plan plan{.what = "RefitWeights (activate)",
            .deadline = Deadline::kLoad,
            .hold = true,
            .bumps_version = true,
            .source = FleetWeights::Source::kDisk,
            .path = req.model_path(),
            .sets_paused = req.keep_pause(),
            .only = ok_workers,
            .whole_fleet = true};
  RETURN_IF_ERROR(broadcaster_.BroadcastLocked(
      plan, c,
      [&activate](Worker& w, size_t, grpc::ClientContext* ctx, rl::v1::AdminResponse* r,
                  Done done) {
        w.admin_stub().async()->ActivateWeights(ctx, &activate, r, std::move(done));
      },
      resp));
  resp->set_message(absl::StrCat("RefitWeights: version ", version, " staged on all ",
                                 ok_workers.size(), " workers; ", resp->message()));
  return absl::OkStatus();
}

}  // namespace rl::router::admin
