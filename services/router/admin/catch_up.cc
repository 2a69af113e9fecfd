#include "services/router/admin/catch_up.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace rl::router::admin {
namespace {

constexpr std::chrono::milliseconds kFirstBackoff{500};
constexpr std::chrono::milliseconds kMaxBackoff{30000};
// Peer catch-up: peers tried per attempt, and the wait before the next one (doubling).
constexpr size_t kMaxPeersPerAttempt = 3;
constexpr std::chrono::milliseconds kFirstPeerBackoff{200};

// The router's own pause (retract) and continue of one worker.
void PauseRetract(Worker& w, size_t, grpc::ClientContext* ctx, rl::v1::AdminResponse* out,
                  Done done) {
  rl::v1::PauseGenerationRequest req;
  req.set_mode(rl::v1::PAUSE_MODE_RETRACT);
  CallOwning(w, &AsyncAdmin::PauseGeneration, std::move(req), ctx, out, std::move(done));
}

void Continue(Worker& w, size_t, grpc::ClientContext* ctx, rl::v1::AdminResponse* out, Done done) {
  CallOwning(w, &AsyncAdmin::ContinueGeneration, rl::v1::ContinueGenerationRequest(), ctx, out,
             std::move(done));
}

// `plan.what` and the worker's status as an absl::Status.
absl::Status Check(const Plan& plan, const Result& r) {
  if (r.status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(r.status.error_code()),
                      absl::StrCat(plan.what, ": ", r.status.error_message()));
}

}  // namespace

CatchUp::CatchUp(WorkerPool* pool, Broadcaster* broadcaster)
    : pool_(pool), broadcaster_(broadcaster) {
  thread_ = std::thread([this] { Loop(); });
  pool_->SetCatchUpHandler([this](std::shared_ptr<Worker> w) { Enqueue(std::move(w)); });
}

CatchUp::~CatchUp() {
  pool_->SetCatchUpHandler(nullptr);
  {
    absl::MutexLock lock(&own_call_mu_);
    stopping_ = true;
    if (own_call_ != nullptr) own_call_->TryCancel();
  }
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
  absl::MutexLock lock(&mu_);
  for (const auto& w : queue_) pool_->FinishSync(w.get());
}

void CatchUp::Enqueue(std::shared_ptr<Worker> w) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(w));
}

void CatchUp::Loop() {
  while (true) {
    std::shared_ptr<Worker> w;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      w = std::move(queue_.front());
      queue_.pop_front();
    }
    const auto now = std::chrono::steady_clock::now();
    auto it = backoff_.find(w->address());
    if (it == backoff_.end() || now >= it->second.first) {
      absl::Status s = Run(w);
      if (s.ok()) {
        backoff_.erase(w->address());
      } else {
        spdlog::warn("catch-up of {} failed: {}", w->address(), std::string(s.message()));
        const std::chrono::milliseconds delay =
            it == backoff_.end() ? kFirstBackoff : std::min(it->second.second * 2, kMaxBackoff);
        backoff_[w->address()] = {std::chrono::steady_clock::now() + delay, delay};
      }
    }
    // Health checks hand the worker over again while it is still behind.
    pool_->FinishSync(w.get());
  }
}

bool CatchUp::BeginOwnCall(grpc::ClientContext* ctx) {
  absl::MutexLock lock(&own_call_mu_);
  if (stopping_) return false;
  own_call_ = ctx;
  return true;
}

void CatchUp::EndOwnCall() {
  absl::MutexLock lock(&own_call_mu_);
  own_call_ = nullptr;
}

Result CatchUp::CallOwn(const Plan& plan, const std::shared_ptr<Worker>& w, const WorkerCall& call,
                        Worker* also) {
  WorkerCallState c;
  // Cancelled too when `also` (the receiver of a peer's send) is marked dead.
  std::optional<CallGuard> also_guard;
  if (also != nullptr) also_guard.emplace(&also->calls(), &c.ctx);
  if (!BeginOwnCall(&c.ctx)) {
    c.result.status = grpc::Status(grpc::StatusCode::CANCELLED, "the router is shutting down");
    return std::move(c.result);
  }
  absl::Notification done;
  broadcaster_->StartOne(plan, /*caller=*/nullptr, w, 0, call, &c, [&done] { done.Notify(); });
  done.WaitForNotification();
  EndOwnCall();
  return std::move(c.result);
}

absl::Status CatchUp::Run(const std::shared_ptr<Worker>& w) {
  RETURN_IF_ERROR(broadcaster_->lock().Acquire("catch-up"));
  pool_->BeginHold();  // requests that find no routable worker wait for it instead of failing
  absl::Status status = [&]() -> absl::Status {
    const FleetWeights fleet = pool_->fleet_weights();
    const bool fleet_paused = broadcaster_->fleet_paused();
    if (!pool_->Behind(w.get())) return ReconcilePause(w, fleet_paused);
    if (!fleet.replayable()) return FromPeer(w, fleet, fleet_paused);
    absl::Status s = FromDisk(w, fleet, fleet_paused);
    // No folder of the record applies to the version it holds (a delta chain older than the
    // record, a folder gone from disk): a live peer at the fleet's version sends it.
    if (!s.ok() && !absl::IsCancelled(s) && !pool_->PeersAt(fleet.version, w.get()).empty()) {
      spdlog::warn("catch-up of {} from disk failed ({}); trying a live peer", w->address(),
                   std::string(s.message()));
      return FromPeer(w, fleet, fleet_paused);
    }
    return s;
  }();
  pool_->EndHold();
  broadcaster_->lock().Release();
  return status;
}

absl::Status CatchUp::FromDisk(const std::shared_ptr<Worker>& w, const FleetWeights& fleet,
                               bool fleet_paused) {
  // The fleet's folder, after the disk updates before it: when the last one is a delta whose
  // parent `w` does not hold, the worker refuses it (FAILED_PRECONDITION, nothing applied), and
  // the replay starts one folder further back, down to one it can load (a full checkpoint, or a
  // delta of the version it serves), then applies every later folder in order.
  std::vector<FleetWeights::DiskStep> steps = fleet.chain;
  steps.push_back({fleet.version, fleet.path});
  spdlog::info("catching up {} to weight_version {} from {}", w->address(), fleet.version,
               fleet.path);
  Plan plan;
  plan.what = "catch-up PauseGeneration";
  RETURN_IF_ERROR(Check(plan, CallOwn(plan, w, &PauseRetract)));
  plan.deadline = Deadline::kLoad;
  auto load = [&](const FleetWeights::DiskStep& step) {
    plan.what = "catch-up UpdateWeightsFromDisk";
    return Check(plan, CallOwn(plan, w,
                               [&step](Worker& worker, size_t, grpc::ClientContext* ctx,
                                       rl::v1::AdminResponse* out, Done done) {
                                 rl::v1::UpdateWeightsFromDiskRequest req;
                                 req.set_model_path(step.path);
                                 req.set_weight_version(step.version);
                                 req.set_keep_pause(true);
                                 CallOwning(worker, &AsyncAdmin::UpdateWeightsFromDisk,
                                            std::move(req), ctx, out, std::move(done));
                               }));
  };
  size_t first = steps.size() - 1;
  absl::Status s = load(steps[first]);
  while (absl::IsFailedPrecondition(s) && first > 0) {
    spdlog::info("catch-up of {}: {}; replaying from the folder before it", w->address(),
                 std::string(s.message()));
    --first;
    s = load(steps[first]);
  }
  RETURN_IF_ERROR(s);
  for (size_t i = first + 1; i < steps.size(); ++i) RETURN_IF_ERROR(load(steps[i]));
  if (!fleet_paused) {
    plan.what = "catch-up ContinueGeneration";
    plan.deadline = Deadline::kControl;
    RETURN_IF_ERROR(Check(plan, CallOwn(plan, w, &Continue)));
  }
  pool_->Probe(w);  // version and serving state fresh before it is routed
  spdlog::info("caught up {} to weight_version {} ({} folder(s) replayed)", w->address(),
               fleet.version, steps.size() - first);
  return absl::OkStatus();
}

absl::Status CatchUp::ReconcilePause(const std::shared_ptr<Worker>& w, bool fleet_paused) {
  if (!pool_->IsEnabled(w->address())) return absl::OkStatus();  // operator's or partial
  rl::v1::GetServerInfoResponse info;
  {
    grpc::ClientContext ctx;
    broadcaster_->Prepare(nullptr, &ctx, broadcaster_->options().control_timeout);
    if (!BeginOwnCall(&ctx)) return absl::CancelledError("the router is shutting down");
    CallGuard guard(&w->calls(), &ctx);
    grpc::Status s = w->admin_stub().GetServerInfo(&ctx, rl::v1::GetServerInfoRequest(), &info);
    EndOwnCall();
    if (!s.ok()) return FromGrpcStatus(s);
  }
  if (info.asleep() || info.paused() == fleet_paused) return absl::OkStatus();
  // A call it missed while it was out (marked dead) left it paused or running against the
  // fleet: e.g. a pause that reached it late, or a continue it never got.
  Plan plan;
  plan.what = fleet_paused ? "rejoin PauseGeneration" : "rejoin ContinueGeneration";
  Result r = CallOwn(plan, w, fleet_paused ? &PauseRetract : &Continue);
  if (!r.status.ok()) return FromGrpcStatus(r.status);
  spdlog::info("{} rejoined {}; matched the fleet's pause state", w->address(),
               fleet_paused ? "running" : "paused");
  return absl::OkStatus();
}

absl::Status CatchUp::FromPeer(const std::shared_ptr<Worker>& w, const FleetWeights& fleet,
                               bool fleet_paused) {
  std::vector<std::shared_ptr<Worker>> peers = pool_->PeersAt(fleet.version, w.get());
  if (peers.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no live worker serves weight_version ", fleet.version, " (from ", fleet.Describe(),
        ") to send it; resync it: rlctl workers resync ", w->address(), " --from-disk DIR"));
  }
  if (peers.size() > kMaxPeersPerAttempt) peers.resize(kMaxPeersPerAttempt);
  // Out of routing until it serves the peer's weights, whatever its health checks see.
  pool_->Hold(w.get());
  absl::Status status = [&]() -> absl::Status {
    Plan plan;
    plan.what = "catch-up PauseGeneration";
    RETURN_IF_ERROR(Check(plan, CallOwn(plan, w, &PauseRetract)));
    std::vector<std::string> failures;
    std::chrono::milliseconds delay = kFirstPeerBackoff;
    bool done = false;
    for (size_t i = 0; i < peers.size() && !done; ++i) {
      if (i > 0) {
        if (!SleepUnlessStopping(delay)) return absl::CancelledError("the router is shutting down");
        delay *= 2;
        const std::optional<WorkerState> st = pool_->StateOf(w->address());
        if (!st.has_value() || !st->live()) {
          failures.push_back("the worker itself went away");
          break;
        }
      }
      const std::shared_ptr<Worker>& peer = peers[i];
      spdlog::info("catching up {} to weight_version {} from peer {}", w->address(), fleet.version,
                   peer->address());
      absl::Status s = SendFrom(peer, w, fleet.version);
      if (s.ok()) {
        done = true;
      } else {
        spdlog::warn("catch-up of {} from peer {} failed: {}", w->address(), peer->address(),
                     std::string(s.message()));
        failures.push_back(absl::StrCat(peer->address(), ": ", s.message()));
        // A digest or version that differs after the apply: the worker may serve the version
        // with other weights; never route it, whatever happens next.
        if (s.code() == absl::StatusCode::kDataLoss) {
          pool_->DisablePartial(w.get(), std::string(s.message()));
          return s;
        }
      }
    }
    if (!done) {
      return absl::UnavailableError(
          absl::StrCat("catch-up from a peer failed on every peer tried (", failures.size(),
                       "): ", absl::StrJoin(failures, "; ")));
    }
    if (!fleet_paused) {
      plan.what = "catch-up ContinueGeneration";
      plan.deadline = Deadline::kControl;
      RETURN_IF_ERROR(Check(plan, CallOwn(plan, w, &Continue)));
    }
    return absl::OkStatus();
  }();
  pool_->Release(w.get());
  pool_->Probe(w);  // version and serving state fresh before it is routed
  if (status.ok()) {
    spdlog::info("caught up {} to weight_version {} from a peer", w->address(), fleet.version);
  }
  return status;
}

absl::Status CatchUp::SendFrom(const std::shared_ptr<Worker>& peer,
                               const std::shared_ptr<Worker>& w, int64_t version) {
  Plan plan;
  plan.what = "catch-up SendWeightsToPeer";
  plan.deadline = Deadline::kLoad;
  const int64_t timeout_ms = broadcaster_->Timeout(Deadline::kLoad).count();
  Result r = CallOwn(
      plan, peer,
      [&](Worker& sender, size_t, grpc::ClientContext* ctx, rl::v1::AdminResponse* out, Done done) {
        rl::v1::SendWeightsToPeerRequest req;
        req.set_target(w->address());
        req.set_weight_version(version);
        req.set_keep_pause(true);
        req.set_timeout_ms(static_cast<int32_t>(std::min<int64_t>(timeout_ms, 3600000)));
        CallOwning(sender, &AsyncAdmin::SendWeightsToPeer, std::move(req), ctx, out,
                   std::move(done));
      },
      w.get());
  RETURN_IF_ERROR(Check(plan, r));
  const std::string& sent = r.resp.weights_sha256();
  if (sent.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("peer ", peer->address(), " reported no digest of what it sent"));
  }
  // The worker's own account of what it serves now: its version and its checksum, computed
  // from its served weights (it is paused and out of routing, so the hashing costs no request).
  // It applied the send (the receiver verified the stream's digest before it did); when it does
  // not answer here it died or hangs: marked dead, so the health checks decide (a restart comes
  // back behind and is caught up again; a worker that answers again rejoins with the fleet's
  // pause state).
  auto unverified = [&](const grpc::Status& s) {
    const std::string why =
        absl::StrCat("catch-up could not check its weights after the send from ", peer->address(),
                     ": ", s.error_message());
    pool_->MarkDead(w.get(), why);
    return absl::UnavailableError(why);
  };
  rl::v1::WeightsCheckerRequest creq;
  creq.set_action(rl::v1::WEIGHTS_CHECKER_ACTION_CHECKSUM);
  rl::v1::WeightsCheckerResponse checksum;
  rl::v1::GetServerInfoResponse info;
  {
    grpc::ClientContext ctx;
    broadcaster_->Prepare(nullptr, &ctx, broadcaster_->Timeout(Deadline::kLoad));
    if (!BeginOwnCall(&ctx)) return absl::CancelledError("the router is shutting down");
    CallGuard guard(&w->calls(), &ctx);
    grpc::Status s = w->admin_stub().WeightsChecker(&ctx, creq, &checksum);
    EndOwnCall();
    if (!s.ok()) return unverified(s);
  }
  {
    grpc::ClientContext ctx;
    broadcaster_->Prepare(nullptr, &ctx, broadcaster_->options().control_timeout);
    if (!BeginOwnCall(&ctx)) return absl::CancelledError("the router is shutting down");
    CallGuard guard(&w->calls(), &ctx);
    grpc::Status s = w->admin_stub().GetServerInfo(&ctx, rl::v1::GetServerInfoRequest(), &info);
    EndOwnCall();
    if (!s.ok()) return unverified(s);
  }
  // Asked after the checksum: a process that restarted in between answers its start-up version.
  if (info.weight_version() != version) {
    return absl::UnavailableError(absl::StrCat("after the send from ", peer->address(),
                                               " it serves weight_version ", info.weight_version(),
                                               ", not ", version, " (it restarted meanwhile?)"));
  }
  if (checksum.rank_sha256() != sent) {
    return absl::DataLossError(absl::StrCat(
        "after the send from ", peer->address(), " it serves weight_version ", version,
        " with checksum ", checksum.rank_sha256(), ", but the peer sent checksum ", sent));
  }
  pool_->ReportVersion(w.get(), version);
  return absl::OkStatus();
}

bool CatchUp::SleepUnlessStopping(std::chrono::milliseconds delay) {
  absl::MutexLock lock(&mu_);
  auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
  return !mu_.AwaitWithTimeout(absl::Condition(&stop), absl::FromChrono(delay));
}

}  // namespace rl::router::admin
