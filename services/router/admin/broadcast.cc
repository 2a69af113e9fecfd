#include "services/router/admin/broadcast.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/auth.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace rl::router::admin {
namespace {

// Ids of requests still active after a drain listed in the router's answer, at most.
constexpr int kMaxListedIds = 64;

std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

// The worker refused the call before changing anything.
bool Refused(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return true;
    default:
      return false;
  }
}

// Whether a failed call of `partial` kind may have left the worker's weights partial.
bool MayBePartial(Partial partial, grpc::StatusCode code) {
  switch (partial) {
    case Partial::kNever:
      return false;
    case Partial::kTensor:
      // The worker validates the whole stream before it changes anything and never applies a
      // cut one (refused, cancelled, broken, unavailable: the old weights serve); only a failure
      // inside the apply itself may leave it partial.
      return code == grpc::StatusCode::INTERNAL || code == grpc::StatusCode::UNKNOWN ||
             code == grpc::StatusCode::DATA_LOSS;
    case Partial::kDistributed:  // a failure after the pause leaves the engine paused
      return !Refused(code);
    case Partial::kGroup:
      return !Refused(code) && code != grpc::StatusCode::INVALID_ARGUMENT;
    case Partial::kDelta:
      return code == grpc::StatusCode::INTERNAL || code == grpc::StatusCode::UNKNOWN;
  }
  return false;
}

}  // namespace

Broadcaster::Broadcaster(WorkerPool* pool, BroadcastOptions options)
    : pool_(pool), options_(std::move(options)), lock_(options_.lock_timeout) {}

std::chrono::milliseconds Broadcaster::Timeout(Deadline d) const {
  return d == Deadline::kControl ? options_.control_timeout : options_.load_timeout;
}

bool Broadcaster::fleet_paused() const { return pool_->fleet_paused(); }

void Broadcaster::Prepare(Ctx* caller, grpc::ClientContext* ctx,
                          std::chrono::milliseconds timeout) const {
  ctx->set_deadline(std::chrono::system_clock::now() + timeout);
  if (caller != nullptr) {
    if (auto header = AuthorizationHeader(*caller)) ctx->AddMetadata("authorization", *header);
  } else if (!options_.worker_admin_key.empty()) {
    ctx->AddMetadata("authorization", "Bearer " + options_.worker_admin_key);
  }
  if (!options_.lease_owner.empty()) {
    ctx->AddMetadata("rl-admin-lease-owner", options_.lease_owner);
    ctx->AddMetadata("rl-admin-lease-ttl-ms", std::to_string(options_.lease_ttl.count()));
  }
}

void Broadcaster::StartOne(const Plan& plan, Ctx* caller, const std::shared_ptr<Worker>& w,
                           size_t index, const WorkerCall& call, WorkerCallState* c,
                           std::function<void()> finished) {
  const std::chrono::milliseconds timeout = Timeout(plan.deadline) + plan.extra_timeout;
  c->deadline = std::chrono::system_clock::now() + timeout;
  Prepare(caller, &c->ctx, timeout);
  c->guard.emplace(&w->calls(), &c->ctx);
  call(*w, index, &c->ctx, &c->result.resp,
       [this, &plan, w, c, timeout, finished = std::move(finished)](grpc::Status s) {
         Result& r = c->result;
         r.status = std::move(s);
         const bool by_pool = c->guard->cancelled_by_pool();
         const std::string reason = by_pool ? c->guard->reason() : "";
         c->guard.reset();
         if (r.status.ok()) {
           // nothing to judge
         } else if (by_pool) {
           r.status = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                   absl::StrCat("the worker was marked dead during the call (",
                                                reason, "); call cancelled"));
           r.left_out = true;
         } else if (r.status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
                    std::chrono::system_clock::now() >= c->deadline) {
           // The router's deadline, not an error the worker returned.
           const std::string why = absl::StrCat(plan.what, " missed its per-worker deadline of ",
                                                timeout.count(), " ms");
           pool_->MarkDead(w.get(), why);
           r.status = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                   absl::StrCat(why, "; marked dead and left out"));
           r.left_out = true;
         } else if (r.status.error_code() == grpc::StatusCode::UNAVAILABLE) {
           pool_->ReportFailure(w.get());
         }
         finished();
       });
}

void Broadcaster::Settle(const Plan& plan, const std::shared_ptr<Worker>& w, Result* r,
                         std::function<void()> settled) {
  const grpc::StatusCode code = r->status.error_code();
  if (r->status.ok()) {
    pool_->ReportVersion(w.get(), r->resp.weight_version());
    // A resync replaced whatever partial weights the worker had.
    if (!plan.only.empty() && plan.bumps_version) pool_->ClearPartial(w.get());
  } else {
    if (MayBePartial(plan.partial, code)) {
      pool_->DisablePartial(w.get(),
                            absl::StrCat(plan.what, " failed: ", r->status.error_message()));
      r->left_out = true;
    }
    spdlog::warn("{} failed on {}: {}{}", plan.what, w->address(), r->status.error_message(),
                 r->left_out ? " (left out of routing)" : "");
  }
  const bool reachable =
      r->status.ok() || !r->left_out ||
      (code != grpc::StatusCode::UNAVAILABLE && code != grpc::StatusCode::DEADLINE_EXCEEDED);
  auto release = [this, hold = plan.hold, w, settled = std::move(settled)] {
    if (hold) pool_->Release(w.get());
    settled();
  };
  // Refresh serving state and version before the worker is routed again (a health check may
  // have seen NOT_SERVING mid-call; a worker put to sleep is not serving).
  if ((plan.hold || (plan.probe && r->status.ok())) && reachable) {
    pool_->ProbeAsync(w, std::move(release));
  } else {
    release();
  }
}

void Broadcaster::RecordFleetWeights(const Plan& plan, int64_t version) {
  if (plan.only.empty() || plan.whole_fleet) {
    const FleetWeights before = pool_->fleet_weights();
    FleetWeights fleet;
    fleet.version = version;
    fleet.source = plan.source;
    fleet.path = plan.path;
    // Disk after disk: the earlier folder joins the chain a worker behind a delta replays.
    if (fleet.source == FleetWeights::Source::kDisk && before.replayable() &&
        before.version < version) {
      fleet.chain = before.chain;
      fleet.chain.push_back({before.version, before.path});
      if (fleet.chain.size() > FleetWeights::kMaxDiskChain) {
        fleet.chain.erase(fleet.chain.begin(),
                          fleet.chain.end() - static_cast<ptrdiff_t>(FleetWeights::kMaxDiskChain));
      }
    }
    pool_->SetFleetWeights(fleet);  // observers (the text cache) follow the version
    return;
  }
  // A resync to the fleet's version from a folder makes that folder the fleet's replayable
  // source when the fleet's own source could not be replayed.
  FleetWeights fleet = pool_->fleet_weights();
  if (!fleet.replayable() && fleet.version == version &&
      plan.source == FleetWeights::Source::kDisk) {
    fleet.source = plan.source;
    fleet.path = plan.path;
    pool_->SetFleetWeights(fleet);
  }
}

absl::StatusOr<std::vector<std::shared_ptr<Worker>>> Broadcaster::Targets(const Plan& plan) const {
  if (plan.only.empty()) return pool_->LiveWorkers();
  std::vector<std::shared_ptr<Worker>> targets;
  for (const std::string& address : plan.only) {
    std::shared_ptr<Worker> w = pool_->Find(address);
    if (w == nullptr) {
      return absl::NotFoundError(absl::StrCat("workers: no worker '", address, "'"));
    }
    targets.push_back(std::move(w));
  }
  return targets;
}

absl::Status Broadcaster::Broadcast(const Plan& plan, Ctx* caller, const WorkerCall& call,
                                    rl::v1::AdminResponse* resp) {
  ASSIGN_OR_RETURN(const std::vector<std::shared_ptr<Worker>> targets, Targets(plan));
  RETURN_IF_ERROR(lock_.Acquire(plan.what));
  absl::Status s = BroadcastTo(plan, caller, call, targets, resp);
  lock_.Release();
  return s;
}

absl::Status Broadcaster::BroadcastLocked(const Plan& plan, Ctx* caller, const WorkerCall& call,
                                          rl::v1::AdminResponse* resp) {
  ASSIGN_OR_RETURN(const std::vector<std::shared_ptr<Worker>> targets, Targets(plan));
  return BroadcastTo(plan, caller, call, targets, resp);
}

absl::Status Broadcaster::BroadcastTo(const Plan& plan, Ctx* caller, const WorkerCall& call,
                                      const std::vector<std::shared_ptr<Worker>>& targets,
                                      rl::v1::AdminResponse* resp) {
  if (plan.hold) {
    pool_->BeginHold();
    for (const auto& w : targets) pool_->Hold(w.get());
  }
  auto calls = std::make_unique<WorkerCallState[]>(targets.size());
  absl::BlockingCounter pending(static_cast<int>(targets.size()));
  for (size_t i = 0; i < targets.size(); ++i) {
    StartOne(plan, caller, targets[i], i, call, &calls[i],
             [this, &plan, &pending, w = targets[i], r = &calls[i].result] {
               // At once: this worker routes again while others still work.
               Settle(plan, w, r, [&pending] { pending.DecrementCount(); });
             });
  }
  if (plan.started) plan.started(targets.size());
  pending.Wait();
  bool all_ok = !targets.empty();
  bool all_ready = !targets.empty();  // PrepareWeightsUpdate: posted everywhere
  bool any_ok = false;
  bool all_drained = !targets.empty();  // PauseGeneration(drain): drained everywhere
  int64_t version = -1;
  for (size_t i = 0; i < targets.size(); ++i) {
    const Result& r = calls[i].result;
    rl::v1::WorkerResult* out = resp->add_results();
    out->set_worker(targets[i]->address());
    out->set_success(r.status.ok());
    out->set_code(CodeName(r.status.error_code()));
    out->set_message(r.status.ok() ? r.resp.message() : r.status.error_message());
    out->set_weight_version(r.resp.weight_version());
    out->set_left_out(r.left_out);
    resp->set_num_aborted(resp->num_aborted() + r.resp.num_aborted());
    all_ok = all_ok && r.status.ok();
    all_ready = all_ready && r.status.ok() && r.resp.ready();
    all_drained = all_drained && r.status.ok() && r.resp.drained();
    resp->set_num_still_active(resp->num_still_active() + r.resp.num_still_active());
    resp->set_num_held(resp->num_held() + r.resp.num_held());
    for (const std::string& id : r.resp.still_active_ids()) {
      if (resp->still_active_ids_size() >= kMaxListedIds) break;
      resp->add_still_active_ids(absl::StrCat(targets[i]->address(), "/", id));
    }
    if (r.status.ok()) {
      any_ok = true;
      version = std::max(version, r.resp.weight_version());
    }
  }
  // Recorded before the hold ends: a request waiting for the broadcast then finds the updated
  // workers at the fleet's version (workers at another version are never routed).
  if (plan.bumps_version && version >= 0) RecordFleetWeights(plan, version);
  if (plan.hold) pool_->EndHold();
  if (any_ok && plan.sets_paused.has_value()) pool_->SetFleetPaused(*plan.sets_paused);
  size_t num_failed = 0;
  for (size_t i = 0; i < targets.size(); ++i) num_failed += calls[i].result.status.ok() ? 0 : 1;
  resp->set_success(all_ok);
  resp->set_ready(all_ready);
  resp->set_drained(all_drained);
  resp->set_weight_version(version);
  resp->set_message(targets.empty() ? std::string("no live worker")
                    : num_failed == 0
                        ? absl::StrCat(plan.what, ": ok on all ", targets.size(), " workers")
                    : num_failed == targets.size()
                        ? absl::StrCat(plan.what, ": failed on all ", targets.size(), " workers")
                        : absl::StrCat(plan.what, ": failed on ", num_failed, " of ",
                                       targets.size(), " workers"));
  if (targets.empty()) return absl::UnavailableError(absl::StrCat(plan.what, ": no live worker"));
  return absl::OkStatus();
}

}  // namespace rl::router::admin
