#include "services/admin/admin_fanout.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace rl::admin {
namespace {

using Ctx = grpc::CallbackServerContext;
using router::FleetWeights;

std::string CodeName(grpc::StatusCode code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

// Starts `method` with a request the call owns until its callback.
template <typename Req>
void CallOwning(router::Worker& w, AsyncMethod<Req, rl::v1::AdminResponse> method, Req req,
                grpc::ClientContext* ctx, rl::v1::AdminResponse* out,
                std::function<void(grpc::Status)> done) {
  auto owned = std::make_shared<Req>(std::move(req));
  (w.admin_stub().async()->*method)(
      ctx, owned.get(), out,
      [owned, done = std::move(done)](grpc::Status s) { done(std::move(s)); });
}

// Replays a buffered client stream of tensor chunks to one worker; deletes itself when done.
class TensorWriter final : public grpc::ClientWriteReactor<rl::v1::UpdateWeightsFromTensorRequest> {
 public:
  TensorWriter(const std::vector<rl::v1::UpdateWeightsFromTensorRequest>* messages,
               std::function<void(grpc::Status)> done)
      : messages_(messages), done_(std::move(done)) {}

  void Start(router::Worker& w, grpc::ClientContext* ctx, rl::v1::AdminResponse* resp) {
    w.admin_stub().async()->UpdateWeightsFromTensor(ctx, resp, this);
    WriteNext();
    StartCall();
  }
  // A failed write ends the call; OnDone reports why.
  void OnWriteDone(bool ok) override {
    if (ok) WriteNext();
  }
  void OnDone(const grpc::Status& s) override {
    done_(s);
    delete this;
  }

 private:
  void WriteNext() {
    if (next_ < messages_->size()) {
      StartWrite(&(*messages_)[next_++]);
    } else {
      StartWritesDone();
    }
  }

  const std::vector<rl::v1::UpdateWeightsFromTensorRequest>* messages_;
  std::function<void(grpc::Status)> done_;
  size_t next_ = 0;
};

// The router's own pause (retract) and continue of one worker (catch-up, rejoin).
void PauseRetract(router::Worker& w, size_t, grpc::ClientContext* ctx, rl::v1::AdminResponse* out,
                  std::function<void(grpc::Status)> done) {
  rl::v1::PauseGenerationRequest req;
  req.set_mode(rl::v1::PAUSE_MODE_RETRACT);
  CallOwning(w, &AsyncAdmin::PauseGeneration, std::move(req), ctx, out, std::move(done));
}

void Continue(router::Worker& w, size_t, grpc::ClientContext* ctx, rl::v1::AdminResponse* out,
              std::function<void(grpc::Status)> done) {
  CallOwning(w, &AsyncAdmin::ContinueGeneration, rl::v1::ContinueGenerationRequest(), ctx, out,
             std::move(done));
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

}  // namespace

AdminFanout::AdminFanout(router::WorkerPool* pool, router::TextCache* cache, const BearerAuth* auth,
                         FanoutOptions options)
    : pool_(pool), cache_(cache), auth_(auth), options_(std::move(options)) {
  catch_up_thread_ = std::thread([this] { CatchUpLoop(); });
  pool_->SetCatchUpHandler([this](std::shared_ptr<router::Worker> w) { EnqueueCatchUp(w); });
}

AdminFanout::~AdminFanout() {
  pool_->SetCatchUpHandler(nullptr);
  {
    absl::MutexLock lock(&own_call_mu_);
    stopping_ = true;
    if (own_call_ != nullptr) own_call_->TryCancel();
  }
  {
    absl::MutexLock lock(&catch_up_mu_);
    stop_ = true;
  }
  catch_up_thread_.join();
  absl::MutexLock lock(&catch_up_mu_);
  for (const auto& w : catch_up_queue_) pool_->FinishSync(w.get());
}

std::chrono::milliseconds AdminFanout::Timeout(Deadline d) const {
  return d == Deadline::kControl ? options_.control_timeout : options_.load_timeout;
}

struct AdminFanout::Call {
  grpc::ClientContext ctx;
  std::optional<router::CallGuard> guard;  // destroyed before ctx
  std::chrono::system_clock::time_point deadline;
  Result result;
};

template <typename Req, typename Resp>
std::vector<Reply<Resp>> AdminFanout::Gather(Ctx* caller, const Req& req,
                                             AsyncMethod<Req, Resp> method) const {
  const auto targets = pool_->LiveWorkers();
  std::vector<Reply<Resp>> out(targets.size());
  auto calls = std::make_unique<Call[]>(targets.size());
  absl::BlockingCounter pending(static_cast<int>(targets.size()));
  for (size_t i = 0; i < targets.size(); ++i) {
    out[i].worker = targets[i]->address();
    Prepare(caller, &calls[i].ctx, options_.control_timeout);
    calls[i].guard.emplace(targets[i].get(), &calls[i].ctx);
    (targets[i]->admin_stub().async()->*method)(&calls[i].ctx, &req, &out[i].resp,
                                                [r = &out[i], &pending](grpc::Status s) {
                                                  r->status = std::move(s);
                                                  pending.DecrementCount();
                                                });
  }
  pending.Wait();
  return out;
}

void AdminFanout::Prepare(Ctx* caller, grpc::ClientContext* ctx,
                          std::chrono::milliseconds timeout) const {
  ctx->set_deadline(std::chrono::system_clock::now() + timeout);
  if (caller != nullptr) {
    if (auto header = AuthorizationHeader(*caller)) ctx->AddMetadata("authorization", *header);
  } else if (!options_.worker_admin_key.empty()) {
    ctx->AddMetadata("authorization", "Bearer " + options_.worker_admin_key);
  }
}

grpc::ServerUnaryReactor* AdminFanout::Run(Ctx* c, std::function<absl::Status()> fn) {
  if (absl::Status s = auth_->Check(*c); !s.ok()) return FinishUnary(c, s);
  grpc::ServerUnaryReactor* reactor = c->DefaultReactor();
  if (!options_.executor->Submit(
          [reactor, fn = std::move(fn)] { reactor->Finish(ToGrpcStatus(fn())); })) {
    reactor->Finish(ToGrpcStatus(options_.executor->BusyError()));
  }
  return reactor;
}

absl::Status AdminFanout::LockAdmin(const char* what) {
  absl::MutexLock lock(&admin_mu_);
  auto free = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(admin_mu_) { return !admin_busy_; };
  if (!admin_mu_.AwaitWithTimeout(absl::Condition(&free),
                                  absl::FromChrono(options_.lock_timeout))) {
    return absl::UnavailableError(
        absl::StrCat(what, ": another admin operation holds the admin lock (waited ",
                     options_.lock_timeout.count(), " ms); try again later"));
  }
  admin_busy_ = true;
  return absl::OkStatus();
}

void AdminFanout::UnlockAdmin() {
  absl::MutexLock lock(&admin_mu_);
  admin_busy_ = false;
}

bool AdminFanout::BeginOwnCall(grpc::ClientContext* ctx) {
  absl::MutexLock lock(&own_call_mu_);
  if (stopping_) return false;
  own_call_ = ctx;
  return true;
}

void AdminFanout::EndOwnCall() {
  absl::MutexLock lock(&own_call_mu_);
  own_call_ = nullptr;
}

void AdminFanout::StartOne(const Plan& plan, Ctx* caller, const std::shared_ptr<router::Worker>& w,
                           size_t index, const WorkerCall& call, Call* c,
                           std::function<void()> finished) {
  const std::chrono::milliseconds timeout = Timeout(plan.deadline);
  c->deadline = std::chrono::system_clock::now() + timeout;
  Prepare(caller, &c->ctx, timeout);
  c->guard.emplace(w.get(), &c->ctx);
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

AdminFanout::Result AdminFanout::CallOne(const Plan& plan, Ctx* caller,
                                         const std::shared_ptr<router::Worker>& w, size_t index,
                                         const WorkerCall& call) {
  Call c;
  if (caller == nullptr && !BeginOwnCall(&c.ctx)) {
    c.result.status = grpc::Status(grpc::StatusCode::CANCELLED, "the router is shutting down");
    return std::move(c.result);
  }
  absl::Notification done;
  StartOne(plan, caller, w, index, call, &c, [&done] { done.Notify(); });
  done.WaitForNotification();
  if (caller == nullptr) EndOwnCall();
  return std::move(c.result);
}

void AdminFanout::Settle(const Plan& plan, const std::shared_ptr<router::Worker>& w, Result* r,
                         std::function<void()> settled) {
  const grpc::StatusCode code = r->status.error_code();
  if (r->status.ok()) {
    pool_->ReportVersion(w.get(), r->resp.weight_version());
    // A resync replaced whatever partial weights the worker had.
    if (!plan.only.empty() && plan.bumps_version) pool_->ClearPartial(w.get());
  } else {
    bool partial = false;
    switch (plan.partial) {
      case Partial::kNever:
        break;
      case Partial::kTensor:  // validated before any change: a refusal or a bad stream is safe
        partial = !Refused(code) && code != grpc::StatusCode::INVALID_ARGUMENT;
        break;
      case Partial::kDistributed:  // a failure after the pause leaves the engine paused
        partial = !Refused(code);
        break;
      case Partial::kGroup:
        partial = !Refused(code) && code != grpc::StatusCode::INVALID_ARGUMENT;
        break;
    }
    if (partial) {
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
    if (hold) pool_->SetHeld(w.get(), false);
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

absl::Status AdminFanout::Broadcast(const Plan& plan, Ctx* caller, const WorkerCall& call,
                                    rl::v1::AdminResponse* resp) {
  std::vector<std::shared_ptr<router::Worker>> targets;
  if (plan.only.empty()) {
    targets = pool_->LiveWorkers();
  } else {
    for (const std::string& address : plan.only) {
      std::shared_ptr<router::Worker> w = pool_->Find(address);
      if (w == nullptr) {
        return absl::NotFoundError(absl::StrCat("workers: no worker '", address, "'"));
      }
      targets.push_back(std::move(w));
    }
  }
  RETURN_IF_ERROR(LockAdmin(plan.what));
  if (plan.hold) {
    pool_->BeginHold();
    for (const auto& w : targets) pool_->SetHeld(w.get(), true);
  }
  auto calls = std::make_unique<Call[]>(targets.size());
  absl::BlockingCounter pending(static_cast<int>(targets.size()));
  for (size_t i = 0; i < targets.size(); ++i) {
    StartOne(plan, caller, targets[i], i, call, &calls[i],
             [this, &plan, &pending, w = targets[i], r = &calls[i].result] {
               // At once: this worker routes again while others still work.
               Settle(plan, w, r, [&pending] { pending.DecrementCount(); });
             });
  }
  pending.Wait();
  if (plan.hold) pool_->EndHold();
  bool all_ok = !targets.empty();
  bool all_ready = !targets.empty();  // PrepareWeightsUpdate: posted everywhere
  bool any_ok = false;
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
    if (r.status.ok()) {
      any_ok = true;
      version = std::max(version, r.resp.weight_version());
    }
  }
  if (plan.bumps_version && version >= 0) {
    if (plan.only.empty()) {
      FleetWeights fleet;
      fleet.version = version;
      fleet.source = plan.source;
      fleet.path = plan.path;
      pool_->SetFleetWeights(fleet);
      cache_->SetCurrentVersion(version);
    } else {
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
  }
  {
    absl::MutexLock lock(&admin_mu_);
    if (any_ok && plan.sets_paused.has_value()) fleet_paused_ = *plan.sets_paused;
  }
  UnlockAdmin();
  resp->set_success(all_ok);
  resp->set_ready(all_ready);
  resp->set_weight_version(version);
  resp->set_message(targets.empty() ? "no live worker"
                                    : absl::StrCat(plan.what, ": ",
                                                   all_ok ? "ok on all " : "failed on some of ",
                                                   targets.size(), " workers"));
  if (targets.empty()) return absl::UnavailableError(absl::StrCat(plan.what, ": no live worker"));
  return absl::OkStatus();
}

// ---- catch-up ----

void AdminFanout::EnqueueCatchUp(std::shared_ptr<router::Worker> w) {
  absl::MutexLock lock(&catch_up_mu_);
  catch_up_queue_.push_back(std::move(w));
}

void AdminFanout::CatchUpLoop() {
  while (true) {
    std::shared_ptr<router::Worker> w;
    {
      absl::MutexLock lock(&catch_up_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(catch_up_mu_) {
        return stop_ || !catch_up_queue_.empty();
      };
      catch_up_mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      w = std::move(catch_up_queue_.front());
      catch_up_queue_.pop_front();
    }
    const auto now = std::chrono::steady_clock::now();
    auto it = catch_up_backoff_.find(w->address());
    if (it == catch_up_backoff_.end() || now >= it->second.first) {
      absl::Status s = CatchUp(w);
      if (s.ok()) {
        catch_up_backoff_.erase(w->address());
      } else {
        spdlog::warn("catch-up of {} failed: {}", w->address(), std::string(s.message()));
        std::chrono::milliseconds delay =
            it == catch_up_backoff_.end()
                ? std::chrono::milliseconds(500)
                : std::min(it->second.second * 2, std::chrono::milliseconds(30000));
        catch_up_backoff_[w->address()] = {std::chrono::steady_clock::now() + delay, delay};
      }
    }
    // Health checks hand the worker over again while it is still behind.
    pool_->FinishSync(w.get());
  }
}

absl::Status AdminFanout::CatchUp(const std::shared_ptr<router::Worker>& w) {
  RETURN_IF_ERROR(LockAdmin("catch-up"));
  pool_->BeginHold();  // requests that find no routable worker wait for it instead of failing
  absl::Status status = [&]() -> absl::Status {
    const FleetWeights fleet = pool_->fleet_weights();
    bool fleet_paused;
    {
      absl::MutexLock lock(&admin_mu_);
      fleet_paused = fleet_paused_;
    }
    if (!fleet.replayable() || !pool_->Behind(w.get())) return ReconcilePause(w, fleet_paused);
    spdlog::info("catching up {} to weight_version {} from {}", w->address(), fleet.version,
                 fleet.path);
    Plan plan;
    plan.what = "catch-up PauseGeneration";
    auto check = [&](const Result& r) -> absl::Status {
      if (r.status.ok()) return absl::OkStatus();
      return absl::Status(static_cast<absl::StatusCode>(r.status.error_code()),
                          absl::StrCat(plan.what, ": ", r.status.error_message()));
    };
    Result r = CallOne(plan, nullptr, w, 0, &PauseRetract);
    RETURN_IF_ERROR(check(r));
    plan.what = "catch-up UpdateWeightsFromDisk";
    plan.deadline = Deadline::kLoad;
    r = CallOne(plan, nullptr, w, 0,
                [&fleet](router::Worker& worker, size_t, grpc::ClientContext* ctx,
                         rl::v1::AdminResponse* out, Done done) {
                  rl::v1::UpdateWeightsFromDiskRequest req;
                  req.set_model_path(fleet.path);
                  req.set_weight_version(fleet.version);
                  req.set_keep_pause(true);
                  CallOwning(worker, &AsyncAdmin::UpdateWeightsFromDisk, std::move(req), ctx, out,
                             std::move(done));
                });
    RETURN_IF_ERROR(check(r));
    if (!fleet_paused) {
      plan.what = "catch-up ContinueGeneration";
      plan.deadline = Deadline::kControl;
      r = CallOne(plan, nullptr, w, 0, &Continue);
      RETURN_IF_ERROR(check(r));
    }
    pool_->Probe(w);  // version and serving state fresh before it is routed
    spdlog::info("caught up {} to weight_version {}", w->address(), fleet.version);
    return absl::OkStatus();
  }();
  pool_->EndHold();
  UnlockAdmin();
  return status;
}

absl::Status AdminFanout::ReconcilePause(const std::shared_ptr<router::Worker>& w,
                                         bool fleet_paused) {
  if (!pool_->IsEnabled(w->address())) return absl::OkStatus();  // operator's or partial
  rl::v1::GetServerInfoResponse info;
  {
    grpc::ClientContext ctx;
    Prepare(nullptr, &ctx, options_.control_timeout);
    if (!BeginOwnCall(&ctx)) return absl::CancelledError("the router is shutting down");
    router::CallGuard guard(w.get(), &ctx);
    grpc::Status s = w->admin_stub().GetServerInfo(&ctx, rl::v1::GetServerInfoRequest(), &info);
    EndOwnCall();
    if (!s.ok()) return FromGrpcStatus(s);
  }
  if (info.asleep() || info.paused() == fleet_paused) return absl::OkStatus();
  // A call it missed while it was out (marked dead) left it paused or running against the
  // fleet: e.g. a pause that reached it late, or a continue it never got.
  Plan plan;
  plan.what = fleet_paused ? "rejoin PauseGeneration" : "rejoin ContinueGeneration";
  Result r = CallOne(plan, nullptr, w, 0, fleet_paused ? &PauseRetract : &Continue);
  if (!r.status.ok()) return FromGrpcStatus(r.status);
  spdlog::info("{} rejoined {}; matched the fleet's pause state", w->address(),
               fleet_paused ? "running" : "paused");
  return absl::OkStatus();
}

// ---- the Admin calls ----

#define RL_FANOUT_UNARY(Method, Request, ...)                                                  \
  grpc::ServerUnaryReactor* AdminFanout::Method(Ctx* c, const rl::v1::Request* req,            \
                                                rl::v1::AdminResponse* resp) {                 \
    return Run(c, [this, c, req, resp] {                                                       \
      Plan plan{__VA_ARGS__};                                                                  \
      plan.what = #Method;                                                                     \
      return Broadcast(                                                                        \
          plan, c,                                                                             \
          [req](router::Worker& w, size_t, grpc::ClientContext* ctx, rl::v1::AdminResponse* r, \
                Done done) { w.admin_stub().async()->Method(ctx, req, r, std::move(done)); },  \
          resp);                                                                               \
    });                                                                                        \
  }

RL_FANOUT_UNARY(PauseGeneration, PauseGenerationRequest, .hold = true, .sets_paused = true)
RL_FANOUT_UNARY(ContinueGeneration, ContinueGenerationRequest, .sets_paused = false)
RL_FANOUT_UNARY(FlushCache, FlushCacheRequest)
RL_FANOUT_UNARY(UpdateWeightsFromDistributed, UpdateWeightsFromDistributedRequest,
                .deadline = Deadline::kLoad, .hold = true, .partial = Partial::kDistributed,
                .bumps_version = true, .source = FleetWeights::Source::kDistributed,
                .sets_paused = false)
RL_FANOUT_UNARY(DestroyWeightsUpdateGroup, DestroyWeightsUpdateGroupRequest)
// Answers ready only when every worker posted its receive (the trainer broadcasts after that).
RL_FANOUT_UNARY(PrepareWeightsUpdate, PrepareWeightsUpdateRequest, .deadline = Deadline::kLoad)
RL_FANOUT_UNARY(ReleaseMemory, ReleaseMemoryRequest, .deadline = Deadline::kLoad, .hold = true)
RL_FANOUT_UNARY(ResumeMemory, ResumeMemoryRequest, .deadline = Deadline::kLoad, .probe = true)

#undef RL_FANOUT_UNARY

grpc::ServerUnaryReactor* AdminFanout::UpdateWeightsFromDisk(
    Ctx* c, const rl::v1::UpdateWeightsFromDiskRequest* req, rl::v1::AdminResponse* resp) {
  return Run(c, [this, c, req, resp]() -> absl::Status {
    Plan plan;
    plan.what = "UpdateWeightsFromDisk";
    plan.deadline = Deadline::kLoad;
    plan.hold = true;
    plan.bumps_version = true;
    plan.source = FleetWeights::Source::kDisk;
    plan.path = req->model_path();
    plan.sets_paused = req->keep_pause();
    plan.only.assign(req->workers().begin(), req->workers().end());
    rl::v1::UpdateWeightsFromDiskRequest mine = *req;
    mine.clear_workers();
    if (!plan.only.empty()) {
      plan.what = "UpdateWeightsFromDisk (resync)";
      plan.sets_paused.reset();
      // A resync brings the worker to the fleet's version unless told otherwise.
      const FleetWeights fleet = pool_->fleet_weights();
      if (!mine.has_weight_version() && fleet.version >= 0) mine.set_weight_version(fleet.version);
    }
    return Broadcast(
        plan, c,
        [&mine](router::Worker& w, size_t, grpc::ClientContext* ctx, rl::v1::AdminResponse* r,
                Done done) {
          w.admin_stub().async()->UpdateWeightsFromDisk(ctx, &mine, r, std::move(done));
        },
        resp);
  });
}

// The applying half of the two-phase receive and the single-call receive: like
// UpdateWeightsFromDistributed, and the fleet stays paused with keep_pause.
template <typename Request>
grpc::ServerUnaryReactor* AdminFanout::FanOutReceive(
    Ctx* c, const Request* req, rl::v1::AdminResponse* resp, const char* what,
    AsyncMethod<Request, rl::v1::AdminResponse> method) {
  return Run(c, [this, c, req, resp, what, method] {
    Plan plan;
    plan.what = what;
    plan.deadline = Deadline::kLoad;
    plan.hold = true;
    plan.partial = Partial::kDistributed;
    plan.bumps_version = true;
    plan.source = FleetWeights::Source::kDistributed;
    plan.sets_paused = req->keep_pause();
    return Broadcast(
        plan, c,
        [req, method](router::Worker& w, size_t, grpc::ClientContext* ctx, rl::v1::AdminResponse* r,
                      Done done) {
          (w.admin_stub().async()->*method)(ctx, req, r, std::move(done));
        },
        resp);
  });
}

grpc::ServerUnaryReactor* AdminFanout::CompleteWeightsUpdate(
    Ctx* c, const rl::v1::CompleteWeightsUpdateRequest* req, rl::v1::AdminResponse* resp) {
  return FanOutReceive(c, req, resp, "CompleteWeightsUpdate", &AsyncAdmin::CompleteWeightsUpdate);
}

grpc::ServerUnaryReactor* AdminFanout::ReceiveWeights(Ctx* c,
                                                      const rl::v1::ReceiveWeightsRequest* req,
                                                      rl::v1::AdminResponse* resp) {
  return FanOutReceive(c, req, resp, "ReceiveWeights", &AsyncAdmin::ReceiveWeights);
}

// Each worker joins as its own rank: the i-th live worker (by address) gets rank_offset + i.
grpc::ServerUnaryReactor* AdminFanout::InitWeightsUpdateGroup(
    Ctx* c, const rl::v1::InitWeightsUpdateGroupRequest* req, rl::v1::AdminResponse* resp) {
  return Run(c, [this, c, req, resp] {
    Plan plan;
    plan.what = "InitWeightsUpdateGroup";
    plan.deadline = Deadline::kLoad;
    plan.hold = true;
    plan.partial = Partial::kGroup;
    return Broadcast(
        plan, c,
        [req](router::Worker& w, size_t i, grpc::ClientContext* ctx, rl::v1::AdminResponse* r,
              Done done) {
          rl::v1::InitWeightsUpdateGroupRequest mine = *req;
          mine.set_rank_offset(req->rank_offset() + static_cast<int32_t>(i));
          CallOwning(w, &AsyncAdmin::InitWeightsUpdateGroup, std::move(mine), ctx, r,
                     std::move(done));
        },
        resp);
  });
}

namespace {

// Buffers a client stream of tensor chunks, then replays it to every worker.
class TensorFanoutReactor final
    : public grpc::ServerReadReactor<rl::v1::UpdateWeightsFromTensorRequest> {
 public:
  using Apply =
      std::function<absl::Status(const std::vector<rl::v1::UpdateWeightsFromTensorRequest>&)>;
  TensorFanoutReactor(Apply apply, BoundedExecutor* executor)
      : apply_(std::move(apply)), executor_(executor) {
    StartRead(&msg_);
  }

  void OnReadDone(bool ok) override {
    if (ok) {
      messages_.push_back(std::move(msg_));
      StartRead(&msg_);
      return;
    }
    if (!executor_->Submit([this] { Finish(ToGrpcStatus(apply_(messages_))); })) {
      Finish(ToGrpcStatus(executor_->BusyError()));
    }
  }
  void OnDone() override { delete this; }

 private:
  Apply apply_;
  BoundedExecutor* executor_;
  rl::v1::UpdateWeightsFromTensorRequest msg_;
  std::vector<rl::v1::UpdateWeightsFromTensorRequest> messages_;
};

class RejectReactor final : public grpc::ServerReadReactor<rl::v1::UpdateWeightsFromTensorRequest> {
 public:
  explicit RejectReactor(const absl::Status& s) { Finish(ToGrpcStatus(s)); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerReadReactor<rl::v1::UpdateWeightsFromTensorRequest>*
AdminFanout::UpdateWeightsFromTensor(Ctx* c, rl::v1::AdminResponse* resp) {
  if (absl::Status s = auth_->Check(*c); !s.ok()) return new RejectReactor(s);
  return new TensorFanoutReactor(
      [this, c, resp](const std::vector<rl::v1::UpdateWeightsFromTensorRequest>& messages) {
        Plan plan;
        plan.what = "UpdateWeightsFromTensor";
        plan.deadline = Deadline::kLoad;
        plan.hold = true;
        plan.partial = Partial::kTensor;
        plan.bumps_version = true;
        plan.source = FleetWeights::Source::kTensor;
        plan.sets_paused = !messages.empty() && messages.front().keep_pause();
        return Broadcast(
            plan, c,
            [&messages](router::Worker& w, size_t, grpc::ClientContext* ctx,
                        rl::v1::AdminResponse* r, Done done) {
              (new TensorWriter(&messages, std::move(done)))->Start(w, ctx, r);
            },
            resp);
      },
      options_.executor);
}

grpc::ServerUnaryReactor* AdminFanout::GetModelInfo(Ctx* c, const rl::v1::GetModelInfoRequest* req,
                                                    rl::v1::GetModelInfoResponse* resp) {
  return Run(c, [this, c, req, resp]() -> absl::Status {
    const auto replies = Gather(c, *req, &AsyncAdmin::GetModelInfo);
    if (replies.empty()) return absl::UnavailableError("GetModelInfo: no live worker");
    bool have = false;
    for (const auto& r : replies) {
      if (!r.status.ok()) continue;
      if (!have) {
        *resp = r.resp;
        have = true;
      }
      rl::v1::WorkerModelInfo* w = resp->add_workers();
      w->set_worker(r.worker);
      *w->mutable_info() = r.resp;
    }
    if (!have) return FromGrpcStatus(replies[0].status);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* AdminFanout::GetServerInfo(Ctx* c,
                                                     const rl::v1::GetServerInfoRequest* req,
                                                     rl::v1::GetServerInfoResponse* resp) {
  return Run(c, [this, c, req, resp]() -> absl::Status {
    // Totals over the workers; paused when any worker is.
    for (const auto& r : Gather(c, *req, &AsyncAdmin::GetServerInfo)) {
      if (!r.status.ok()) continue;
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

grpc::ServerUnaryReactor* AdminFanout::ListWeights(Ctx* c, const rl::v1::ListWeightsRequest* req,
                                                   rl::v1::ListWeightsResponse* resp) {
  return Run(c, [this, c, req, resp]() -> absl::Status {
    auto targets = pool_->LiveWorkers();
    if (targets.empty()) return absl::UnavailableError("ListWeights: no live worker");
    grpc::ClientContext ctx;
    Prepare(c, &ctx, options_.control_timeout);
    router::CallGuard guard(targets.front().get(), &ctx);
    return FromGrpcStatus(targets.front()->admin_stub().ListWeights(&ctx, *req, resp));
  });
}

grpc::ServerUnaryReactor* AdminFanout::WeightsChecker(Ctx* c,
                                                      const rl::v1::WeightsCheckerRequest* req,
                                                      rl::v1::WeightsCheckerResponse* resp) {
  return Run(c, [this, c, req, resp]() -> absl::Status {
    const auto replies = Gather(c, *req, &AsyncAdmin::WeightsChecker);
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

}  // namespace rl::admin
