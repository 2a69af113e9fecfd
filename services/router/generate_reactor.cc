#include "services/router/generate_reactor.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "common/write_queue_reactor.h"
#include "grpcpp/alarm.h"
#include "services/router/cache/cache_store.h"

namespace rl::router {
namespace {

using rl::v1::GenerateResponse;

class RouterGenerateReactor;

// One worker call of one attempt; the reactor holds it (shared) until the call is done.
class WorkerCall final : public grpc::ClientReadReactor<GenerateResponse> {
 public:
  WorkerCall(RouterGenerateReactor* parent, Worker* worker, rl::v1::GenerateRequest request,
             const std::optional<std::string>& authorization, int64_t min_weight_version,
             int64_t fleet_weight_version, bool fleet_running)
      : parent_(parent), worker_(worker), request_(std::move(request)) {
    if (authorization) ctx_.AddMetadata("authorization", *authorization);
    // A worker restarted faster than the health checks notice refuses instead of serving its
    // start-up weights, and one whose version changed behind the router's back (an update sent
    // to it alone) refuses instead of serving another version beside the fleet's
    // (worker_service.cc).
    if (min_weight_version >= 0) {
      ctx_.AddMetadata("rl-min-weight-version", std::to_string(min_weight_version));
    }
    if (fleet_weight_version >= 0) {
      ctx_.AddMetadata("rl-fleet-weight-version", std::to_string(fleet_weight_version));
    }
    // A worker paused behind the router's back (directly, or by a pause the router never
    // recorded) since its last health check refuses instead of holding the request until a
    // continue nobody sends; the health check that follows takes it out of routing.
    if (fleet_running) ctx_.AddMetadata("rl-fleet-running", "1");
  }

  void Start() {
    // Cancelled by the pool when it marks the worker dead (worker_pool.h).
    guard_.emplace(&worker_->calls(), &ctx_);
    worker_->data_stub().async()->Generate(&ctx_, &request_, this);
    AddHold();  // released when reading stops: a message may be handled off this call's thread
    StartRead(&msg_);
    StartCall();
  }
  // After a message was handled: reads the next one, or stops reading (and cancels the call).
  void ReadNext() { StartRead(&msg_); }
  void StopReading() {
    ctx_.TryCancel();
    RemoveHold();
  }
  void Cancel() { ctx_.TryCancel(); }

  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& s) override;

 private:
  RouterGenerateReactor* parent_;
  Worker* worker_;
  grpc::ClientContext ctx_;
  std::optional<CallGuard> guard_;  // destroyed before ctx_
  rl::v1::GenerateRequest request_;
  GenerateResponse msg_;
};

// The client id for fair admission: the rl-client-id header, else the peer.
absl::StatusOr<std::string> ClientKey(const grpc::CallbackServerContext& context) {
  const auto& md = context.client_metadata();
  auto it = md.find(kClientIdHeader);
  if (it == md.end()) return context.peer();
  if (it->second.size() > kMaxClientIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat(kClientIdHeader, ": ", it->second.size(),
                                                   " bytes is more than ", kMaxClientIdBytes));
  }
  return absl::StrCat("id:", absl::string_view(it->second.data(), it->second.size()));
}

// The request with the rl-routing-key header as its routing_key, when the field is empty (its
// length is checked with the request's).
rl::v1::GenerateRequest WithRoutingKey(const grpc::CallbackServerContext& context,
                                       const rl::v1::GenerateRequest& request) {
  rl::v1::GenerateRequest out = request;
  if (!out.routing_key().empty()) return out;
  const auto& md = context.client_metadata();
  auto it = md.find(kRoutingKeyHeader);
  if (it != md.end()) out.set_routing_key(std::string(it->second.data(), it->second.size()));
  return out;
}

// UNAVAILABLE naming the store while it has failed (its trajectories would not be durable).
absl::Status CheckStore(const CacheStore* store) {
  if (store == nullptr) return absl::OkStatus();
  const CacheStoreStats stats = store->GetStats();
  if (!stats.failed) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "the router's durable store ", store->path(), " failed (", stats.failure,
      "): a trajectory would not be on disk, so text prompts are refused until it recovers "
      "(retried every ",
      stats.retry_interval_ms, " ms; free disk space); retry later"));
}

// One Router.Generate stream: admission, then the Generation's steps driven by worker call
// reactions and alarms. References: gRPC's, and the producer's, held by whichever step is
// pending (admission wait, blocking task, alarm, worker call) and dropped in Done.
class RouterGenerateReactor final : public WriteQueueReactor<GenerateResponse>,
                                    public Admission::Waiter {
 public:
  RouterGenerateReactor(const GenerateContext* deps, grpc::CallbackServerContext* context,
                        const rl::v1::GenerateRequest& request)
      : WriteQueueReactor(deps->max_stream_buffer_bytes),
        deps_(deps),
        request_(WithRoutingKey(*context, request)) {
    deps_->live->Enter();
    absl::Status s = deps_->data_auth->Check(*context);
    if (s.ok() && deps_->drain != nullptr) s = deps_->drain->Check("Generate");
    if (s.ok()) s = Generation::CheckRequest(request_, deps_->env->limits);
    if (s.ok() && deps_->refuse_when_store_failed &&
        request_.prompt_case() == rl::v1::GenerateRequest::kText) {
      s = CheckStore(deps_->env->cache->store());
    }
    absl::StatusOr<std::string> client = s.ok() ? ClientKey(*context) : s;
    if (!client.ok()) {
      EndAndRelease(client.status(), /*holds_slot=*/false);
      return;
    }
    // In the table of requests in flight from now on: Router.Abort reaches it while queued.
    registration_ = Generation::Register(request_, deps_->env->requests);
    client_ = *std::move(client);
    authorization_ = AuthorizationHeader(*context);
    deadline_ = context->deadline();
    {
      absl::MutexLock lock(&mu_);
      state_ = State::kQueued;
    }
    absl::StatusOr<Admission::Result> admitted = deps_->admission->Admit(client_, this);
    if (!admitted.ok()) {
      {
        absl::MutexLock lock(&mu_);
        state_ = State::kDone;
      }
      deps_->metrics->RecordRejected();
      EndAndRelease(admitted.status(), /*holds_slot=*/false);
      return;
    }
    if (*admitted == Admission::Result::kAdmitted) {
      {
        absl::MutexLock lock(&mu_);
        state_ = State::kRunning;
      }
      Begin();
    }
  }

  void Admitted(const absl::Status& status) override {
    bool gone;
    {
      absl::MutexLock lock(&mu_);
      state_ = status.ok() ? State::kRunning : State::kDone;
      gone = gone_;
    }
    if (!status.ok()) {
      deps_->metrics->RecordRejected();
      EndAndRelease(status, /*holds_slot=*/false);
    } else if (gone) {
      EndAndRelease(absl::CancelledError("client cancelled"), /*holds_slot=*/true);
    } else {
      // Called from another generation's Release: begin on the pool, so a chain of requests
      // that end at once never nests on one stack.
      absl::AnyInvocable<void()&&> begin = [this] { Begin(); };
      if (!deps_->blocking->Submit(std::move(begin))) std::move(begin)();
    }
  }

  ~RouterGenerateReactor() override {
    generation_.reset();  // its RequestTable handle points into the service
    registration_ = {};
    alarm_.reset();
    deps_->live->Leave();  // the service may be gone after this
  }

  void OnWorkerMessage(std::shared_ptr<WorkerCall> call, GenerateResponse msg) {
    if (!generation_->FinalBlocks(msg)) {
      HandleMessage(call, std::move(msg));
      return;
    }
    // The cache insert: off the callback thread (inline only when the pool is full).
    absl::AnyInvocable<void()&&> task = [this, call, msg = std::move(msg)]() mutable {
      HandleMessage(call, std::move(msg));
    };
    if (!deps_->blocking->Submit(std::move(task))) std::move(task)();
  }

  void OnWorkerCallDone(const grpc::Status& s, std::optional<std::string> pool_reason) {
    std::shared_ptr<WorkerCall> call;
    {
      absl::MutexLock lock(&mu_);
      call = std::move(call_);
    }
    generation_->EndAttempt(FromGrpcStatus(s), std::move(pool_reason));
    call.reset();  // may delete the WorkerCall, whose OnDone is still on the stack: nothing
                   // of it is touched after this
    Step();
  }

  std::shared_ptr<WorkerCall> current_call() {
    absl::MutexLock lock(&mu_);
    return call_;
  }

 private:
  enum class State { kNew, kQueued, kRunning, kDone };

  void OnClientGone(const grpc::Status& why) override {
    if (why.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) deps_->metrics->RecordOverflow();
    bool withdrawn = false;
    std::shared_ptr<WorkerCall> call;
    {
      absl::MutexLock lock(&mu_);
      gone_ = true;
      if (state_ == State::kQueued && deps_->admission->Withdraw(client_, this)) {
        state_ = State::kDone;
        withdrawn = true;
      }
      if (generation_ != nullptr) generation_->Cancel();
      call = call_;
    }
    if (call != nullptr) call->Cancel();
    if (withdrawn) EndAndRelease(absl::CancelledError("client cancelled"), false);
  }

  // Admitted: resolve the prompt here, or on the blocking pool when it is long.
  void Begin() {
    if (!Generation::PromptBlocks(request_)) {
      Resolve();
      return;
    }
    if (!deps_->blocking->Submit([this] { Resolve(); })) {
      EndAndRelease(deps_->blocking->BusyError(), /*holds_slot=*/true);
    }
  }

  void Resolve() {
    absl::StatusOr<std::unique_ptr<Generation>> g =
        Generation::Create(request_, deps_->env, &registration_);
    if (!g.ok()) {
      EndAndRelease(g.status(), /*holds_slot=*/true);
      return;
    }
    deps_->metrics->RecordStarted();
    {
      absl::MutexLock lock(&mu_);
      generation_ = *std::move(g);
      generation_->SetDeadline(deadline_);
      if (gone_) generation_->Cancel();
    }
    Step();
  }

  // Does what the generation says next.
  void Step() {
    Generation::Step step = generation_->Next();
    switch (step.kind) {
      case Generation::Step::Kind::kCall: {
        // With a fleet version recorded, the worker must serve exactly it (with none, the
        // version the router routes to is the newest it has seen, which may lag a worker's).
        const int64_t fleet_version = deps_->pool->fleet_version();
        auto call = std::make_shared<WorkerCall>(this, step.worker, generation_->WorkerRequest(),
                                                 authorization_, fleet_version, fleet_version,
                                                 !deps_->pool->fleet_paused());
        bool gone;
        {
          absl::MutexLock lock(&mu_);
          call_ = call;
          gone = gone_;
        }
        call->Start();
        if (gone) call->Cancel();
        return;
      }
      case Generation::Step::Kind::kWait:
        // A fresh alarm per wait: the one whose callback runs now may be destroyed here.
        alarm_ = std::make_unique<grpc::Alarm>();
        alarm_->Set(std::chrono::system_clock::now() + step.wait, [this](bool) { Step(); });
        return;
      case Generation::Step::Kind::kDone:
        deps_->metrics->RecordEnded(/*failed=*/!step.status.ok());
        EndAndRelease(step.status, /*holds_slot=*/true);
        return;
    }
  }

  void HandleMessage(const std::shared_ptr<WorkerCall>& call, GenerateResponse msg) {
    std::vector<GenerateResponse> out;
    const bool go_on = generation_->OnMessage(std::move(msg), &out);
    const uint64_t ticket = generation_->TakeDurableTicket();
    CacheStore* store = deps_->env->cache->store();
    if (ticket == 0 || store == nullptr) {
      Send(call, std::move(out), go_on);
      return;
    }
    // The final goes out once its trajectory is on disk (the worker call waits unread, and holds
    // this reactor, meanwhile); if the store failed instead, the final says so.
    store->WhenDurable(ticket, [this, call, out = std::move(out), go_on](absl::Status s) mutable {
      if (!s.ok()) {
        for (GenerateResponse& m : out) {
          if (m.has_final()) {
            m.mutable_final()->set_cache_history_unknown(true);
            m.mutable_final()->set_trajectory_not_durable(true);
          }
        }
      }
      Send(call, std::move(out), go_on);
    });
  }

  void Send(const std::shared_ptr<WorkerCall>& call, std::vector<GenerateResponse> out,
            bool go_on) {
    for (GenerateResponse& m : out) {
      if (!Enqueue(std::move(m))) {
        go_on = false;
        break;
      }
    }
    if (go_on) {
      call->ReadNext();
    } else {
      call->StopReading();
    }
  }

  // The end of the producer's work: frees the admission slot when held, ends the stream with
  // `status` (after what is queued) and drops the producer's reference.
  void EndAndRelease(const absl::Status& status, bool holds_slot) {
    if (holds_slot) deps_->admission->Release();
    EndStream(status);
    Unref();
  }

  const GenerateContext* const deps_;
  const rl::v1::GenerateRequest request_;
  std::string client_;
  std::optional<std::string> authorization_;
  std::chrono::system_clock::time_point deadline_ = std::chrono::system_clock::time_point::max();
  // Taken before admission; moved into the Generation once it is created.
  Generation::Registration registration_;
  std::unique_ptr<grpc::Alarm> alarm_;  // the pending wait (producer's steps only)

  absl::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kNew;
  bool gone_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<Generation> generation_;  // set once under mu_, then stepped by the producer
  std::shared_ptr<WorkerCall> call_ ABSL_GUARDED_BY(mu_);
};

void WorkerCall::OnReadDone(bool ok) {
  if (!ok) {
    RemoveHold();
    return;
  }
  parent_->OnWorkerMessage(parent_->current_call(), std::move(msg_));
}

void WorkerCall::OnDone(const grpc::Status& s) {
  std::optional<std::string> pool_reason;
  if (!s.ok() && guard_->cancelled_by_pool()) pool_reason = guard_->reason();
  guard_.reset();  // while the attempt's lease still keeps the worker alive
  parent_->OnWorkerCallDone(s, std::move(pool_reason));
}

}  // namespace

void LiveGenerations::Enter() {
  absl::MutexLock lock(&mu_);
  ++live_;
}

void LiveGenerations::Leave() {
  absl::MutexLock lock(&mu_);
  --live_;
}

void LiveGenerations::WaitForNone() {
  absl::MutexLock lock(&mu_);
  auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return live_ == 0; };
  mu_.Await(absl::Condition(&none));
}

bool LiveGenerations::WaitForNoneFor(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return live_ == 0; };
  return mu_.AwaitWithTimeout(absl::Condition(&none), timeout);
}

grpc::ServerWriteReactor<rl::v1::GenerateResponse>* StartGenerate(
    const GenerateContext* ctx, grpc::CallbackServerContext* context,
    const rl::v1::GenerateRequest& request) {
  return new RouterGenerateReactor(ctx, context, request);
}

}  // namespace rl::router
