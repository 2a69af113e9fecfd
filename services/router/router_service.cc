#include "services/router/router_service.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "common/write_queue_reactor.h"
#include "grpcpp/alarm.h"

namespace rl::router {
namespace {

using rl::v1::GenerateResponse;

class RouterGenerateReactor;

// One worker call of one attempt; the reactor holds it (shared) until the call is done.
class WorkerCall final : public grpc::ClientReadReactor<GenerateResponse> {
 public:
  WorkerCall(RouterGenerateReactor* parent, Worker* worker, rl::v1::GenerateRequest request,
             const std::optional<std::string>& authorization, int64_t min_weight_version)
      : parent_(parent), worker_(worker), request_(std::move(request)) {
    if (authorization) ctx_.AddMetadata("authorization", *authorization);
    // A worker restarted faster than the health checks notice refuses instead of serving its
    // start-up weights (worker_service.cc).
    if (min_weight_version >= 0) {
      ctx_.AddMetadata("rl-min-weight-version", std::to_string(min_weight_version));
    }
  }

  void Start() {
    // Cancelled by the pool when it marks the worker dead (worker_pool.h).
    guard_.emplace(worker_, &ctx_);
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

// One Router.Generate stream: admission, then the Generation's steps driven by worker call
// reactions and alarms. References: gRPC's, and the producer's, held by whichever step is
// pending (admission wait, blocking task, alarm, worker call) and dropped in Done.
class RouterGenerateReactor final : public WriteQueueReactor<GenerateResponse>,
                                    public Admission::Waiter {
 public:
  RouterGenerateReactor(RouterService* svc, grpc::CallbackServerContext* context,
                        const rl::v1::GenerateRequest& request)
      : WriteQueueReactor(svc->options().max_stream_buffer_bytes), svc_(svc), request_(request) {
    svc_->EnterGeneration();
    absl::Status s = svc_->data_auth()->Check(*context);
    if (s.ok()) s = Generation::CheckRequest(request_, svc_->env()->limits);
    absl::StatusOr<std::string> client = s.ok() ? ClientKey(*context) : s;
    if (!client.ok()) {
      EndAndRelease(client.status(), /*holds_slot=*/false);
      return;
    }
    // In the table of requests in flight from now on: Router.Abort reaches it while queued.
    registration_ = Generation::Register(request_, svc_->env()->requests);
    client_ = *std::move(client);
    authorization_ = AuthorizationHeader(*context);
    {
      absl::MutexLock lock(&mu_);
      state_ = State::kQueued;
    }
    absl::StatusOr<Admission::Result> admitted = svc_->admission()->Admit(client_, this);
    if (!admitted.ok()) {
      {
        absl::MutexLock lock(&mu_);
        state_ = State::kDone;
      }
      svc_->rejected_total->Inc();
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
      svc_->rejected_total->Inc();
      EndAndRelease(status, /*holds_slot=*/false);
    } else if (gone) {
      EndAndRelease(absl::CancelledError("client cancelled"), /*holds_slot=*/true);
    } else {
      // Called from another generation's Release: begin on the pool, so a chain of requests
      // that end at once never nests on one stack.
      absl::AnyInvocable<void() &&> begin = [this] { Begin(); };
      if (!svc_->options().blocking->Submit(std::move(begin))) std::move(begin)();
    }
  }

  ~RouterGenerateReactor() override {
    generation_.reset();  // its RequestTable handle points into the service
    registration_ = {};
    alarm_.reset();
    svc_->LeaveGeneration();  // the service may be gone after this
  }

  void OnWorkerMessage(std::shared_ptr<WorkerCall> call, GenerateResponse msg) {
    if (!generation_->FinalBlocks(msg)) {
      HandleMessage(call, std::move(msg));
      return;
    }
    // The cache insert: off the callback thread (inline only when the pool is full).
    absl::AnyInvocable<void() &&> task = [this, call, msg = std::move(msg)]() mutable {
      HandleMessage(call, std::move(msg));
    };
    if (!svc_->options().blocking->Submit(std::move(task))) std::move(task)();
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
    if (why.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) svc_->overflows_total->Inc();
    bool withdrawn = false;
    std::shared_ptr<WorkerCall> call;
    {
      absl::MutexLock lock(&mu_);
      gone_ = true;
      if (state_ == State::kQueued && svc_->admission()->Withdraw(client_, this)) {
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
    if (!svc_->options().blocking->Submit([this] { Resolve(); })) {
      EndAndRelease(svc_->options().blocking->BusyError(), /*holds_slot=*/true);
    }
  }

  void Resolve() {
    absl::StatusOr<std::unique_ptr<Generation>> g =
        Generation::Create(request_, svc_->env(), &registration_);
    if (!g.ok()) {
      EndAndRelease(g.status(), /*holds_slot=*/true);
      return;
    }
    svc_->requests_total->Inc();
    svc_->in_flight->Add(1);
    {
      absl::MutexLock lock(&mu_);
      generation_ = *std::move(g);
      if (gone_) generation_->Cancel();
    }
    Step();
  }

  // Does what the generation says next.
  void Step() {
    Generation::Step step = generation_->Next();
    switch (step.kind) {
      case Generation::Step::Kind::kCall: {
        auto call = std::make_shared<WorkerCall>(this, step.worker, generation_->WorkerRequest(),
                                                 authorization_,
                                                 svc_->pool()->fleet_version());
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
        svc_->in_flight->Add(-1);
        if (!step.status.ok()) svc_->failures_total->Inc();
        EndAndRelease(step.status, /*holds_slot=*/true);
        return;
    }
  }

  void HandleMessage(const std::shared_ptr<WorkerCall>& call, GenerateResponse msg) {
    std::vector<GenerateResponse> out;
    bool go_on = generation_->OnMessage(std::move(msg), &out);
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
    if (holds_slot) svc_->admission()->Release();
    EndStream(status);
    Unref();
  }

  RouterService* svc_;
  const rl::v1::GenerateRequest request_;
  std::string client_;
  std::optional<std::string> authorization_;
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

RouterService::RouterService(WorkerPool* pool, TextCache* cache,
                             const tokenizer::Tokenizer* tokenizer, const BearerAuth* data_auth,
                             const BearerAuth* admin_auth, MetricsRegistry* metrics,
                             const RouterServiceOptions& options)
    : pool_(pool),
      cache_(cache),
      tokenizer_(tokenizer),
      data_auth_(data_auth),
      admin_auth_(admin_auth),
      metrics_(metrics),
      options_(options),
      admission_(options.admission) {
  env_.workers = pool;
  env_.cache = cache;
  env_.tokenizer = tokenizer;
  env_.seam_counters = &seam_counters_;
  env_.requests = &requests_;
  env_.limits = options.limits;
  env_.retry = options.retry;
  requests_total = metrics->GetCounter("rl_router_requests_total", "Generate requests accepted.");
  retries_total = metrics->GetCounter("rl_router_retries_total", "Generate attempts retried.");
  failures_total =
      metrics->GetCounter("rl_router_failures_total", "Generate requests that failed.");
  in_flight = metrics->GetGauge("rl_router_in_flight_requests", "Generate requests in flight.");
  env_.retries_total = retries_total;
  rejected_total = metrics->GetCounter(
      "rl_router_rejected_total",
      "Generate requests refused RESOURCE_EXHAUSTED by admission (--max-in-flight, --max-queued).");
  overflows_total = metrics->GetCounter(
      "rl_router_stream_overflows_total",
      "Generate streams cancelled because the client did not read (--max-stream-buffer-bytes).");
  Admission* admission = &admission_;
  metrics->SetGaugeCallback("rl_router_admission_queued",
                            "Generate requests waiting for an in-flight slot.", {},
                            [admission] { return double(admission->queued()); });
  struct CacheGauge {
    const char* name;
    const char* help;
    double (*get)(const TextCacheStats&);
  };
  static const CacheGauge kCacheGauges[] = {
      {"rl_router_cache_entries", "Nodes in the text cache.",
       [](const TextCacheStats& s) { return double(s.entries); }},
      {"rl_router_cache_hits_total", "Queries that matched cached tokens.",
       [](const TextCacheStats& s) { return double(s.hits); }},
      {"rl_router_cache_misses_total", "Queries that matched nothing.",
       [](const TextCacheStats& s) { return double(s.misses); }},
      {"rl_router_cache_hit_ratio", "hits / (hits + misses).",
       [](const TextCacheStats& s) { return s.hit_rate; }},
      {"rl_router_cache_size_tokens", "Cached tokens.",
       [](const TextCacheStats& s) { return double(s.size_tokens); }},
      {"rl_router_cache_size_bytes", "Cached text bytes.",
       [](const TextCacheStats& s) { return double(s.size_bytes); }},
      {"rl_router_cache_gc_runs_total", "Garbage collections.",
       [](const TextCacheStats& s) { return double(s.gc_runs); }},
      {"rl_router_cache_gc_removed_tokens_total", "Tokens removed by garbage collection.",
       [](const TextCacheStats& s) { return double(s.gc_removed_tokens); }},
      {"rl_router_cache_weight_version", "Newest weight version in the cache.",
       [](const TextCacheStats& s) { return double(s.current_version); }},
      {"rl_router_cache_max_cache_size", "GC runs when the cache holds more tokens than this.",
       [](const TextCacheStats& s) { return double(s.max_cache_size); }},
      {"rl_router_cache_gc_threshold_k", "GC removes versions <= current - this.",
       [](const TextCacheStats& s) { return double(s.gc_threshold_k); }},
  };
  for (const CacheGauge& g : kCacheGauges) {
    metrics->SetGaugeCallback(g.name, g.help, {},
                              [cache, get = g.get] { return get(cache->GetStats()); });
  }
  SeamCounters* seam = &seam_counters_;
  metrics->SetGaugeCallback(
      "rl_router_seam_continuations_total",
      "Text prompts whose rest after the last cached generated token was encoded as a "
      "continuation (the full-text encoding has no token boundary there).",
      {}, [seam] { return double(seam->seam_continuations.load()); });
  metrics->SetGaugeCallback(
      "rl_router_whole_text_fallbacks_total",
      "Text prompts whose tokens could not decode to the text exactly: served with the "
      "whole-text encoding, nothing reused.",
      {}, [seam] { return double(seam->whole_text_fallbacks.load()); });
  metrics->SetGaugeCallback("rl_router_live_workers", "Live workers.", {},
                            [pool] { return double(pool->LiveWorkers().size()); });
  metrics->SetGaugeCallback("rl_router_weight_version_mismatch",
                            "1 when live workers report different weight versions.", {},
                            [pool] { return pool->VersionMismatch() ? 1.0 : 0.0; });
}

RouterService::~RouterService() { WaitForGenerations(); }

void RouterService::EnterGeneration() {
  absl::MutexLock lock(&live_mu_);
  ++live_generations_;
}

void RouterService::LeaveGeneration() {
  absl::MutexLock lock(&live_mu_);
  --live_generations_;
}

void RouterService::WaitForGenerations() {
  absl::MutexLock lock(&live_mu_);
  auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(live_mu_) { return live_generations_ == 0; };
  live_mu_.Await(absl::Condition(&none));
}

grpc::ServerWriteReactor<rl::v1::GenerateResponse>* RouterService::Generate(
    grpc::CallbackServerContext* context, const rl::v1::GenerateRequest* request) {
  return new RouterGenerateReactor(this, context, *request);
}

grpc::ServerUnaryReactor* RouterService::RetrieveFromText(
    grpc::CallbackServerContext* context, const rl::v1::RetrieveFromTextRequest* request,
    rl::v1::RetrieveFromTextResponse* response) {
  if (absl::Status s = data_auth_->Check(*context); !s.ok()) return FinishUnary(context, s);
  if (request->text().empty())
    return FinishUnary(context, absl::InvalidArgumentError("text: must not be empty"));
  if (static_cast<int64_t>(request->text().size()) > limits_.max_prompt_bytes) {
    return FinishUnary(context, absl::InvalidArgumentError(absl::StrCat(
                                    "text: ", request->text().size(),
                                    " bytes is more than --max-prompt-bytes (",
                                    limits_.max_prompt_bytes, ")")));
  }
  if (request->tokenize_remainder()) {
    if (tokenizer_ == nullptr)
      return FinishUnary(context, absl::FailedPreconditionError("no tokenizer"));
    if (request->text().size() <= kInlinePromptBytes) {
      return FinishUnary(context, ResolveForRetrieve(request->text(), response));
    }
    // A long text's tokenization runs on the blocking pool, off the callback thread.
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (!options_.blocking->Submit([this, reactor, request, response] {
          reactor->Finish(ToGrpcStatus(ResolveForRetrieve(request->text(), response)));
        })) {
      reactor->Finish(ToGrpcStatus(options_.blocking->BusyError()));
    }
    return reactor;
  }
  rl::v1::Trajectory* t = response->mutable_trajectory();
  CacheRetrieval r = cache_->Retrieve(request->text());
  t->mutable_tokens()->Assign(r.tokens.begin(), r.tokens.end());
  for (uint8_t m : r.loss_mask) t->add_loss_mask(m);
  t->mutable_rollout_logp()->Assign(r.rollout_logp.begin(), r.rollout_logp.end());
  t->mutable_token_weight_versions()->Assign(r.token_versions.begin(), r.token_versions.end());
  t->set_weight_version(r.weight_version);
  response->set_matched_bytes(static_cast<int64_t>(r.matched_bytes));
  response->set_cached_tokens(static_cast<int32_t>(r.tokens.size()));
  return FinishUnary(context, absl::OkStatus());
}

absl::Status RouterService::ResolveForRetrieve(const std::string& text,
                                              rl::v1::RetrieveFromTextResponse* response) {
  // The tokens a Generate of this text would send: one cache lookup, one hit or miss.
  ASSIGN_OR_RETURN(ResolvedPrompt r, ResolveTextPrompt(text, *cache_, *tokenizer_, &seam_counters_));
  const int64_t current = cache_->GetStats().current_version;
  std::vector<int64_t> versions = r.versions;
  versions.resize(r.ids.size(), current);
  rl::v1::Trajectory* t = response->mutable_trajectory();
  t->mutable_tokens()->Assign(r.ids.begin(), r.ids.end());
  for (uint8_t m : r.mask) t->add_loss_mask(m);
  t->mutable_rollout_logp()->Assign(r.logprobs.begin(), r.logprobs.end());
  t->mutable_token_weight_versions()->Assign(versions.begin(), versions.end());
  int64_t newest = 0;
  for (int64_t v : versions) newest = std::max(newest, v);
  t->set_weight_version(newest);
  response->set_matched_bytes(r.cached_tokens > 0 ? r.ends[r.cached_tokens - 1] : 0);
  response->set_cached_tokens(r.cached_tokens);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* RouterService::AddWorker(grpc::CallbackServerContext* context,
                                                   const rl::v1::AddWorkerRequest* request,
                                                   rl::v1::WorkerListResponse* response) {
  if (absl::Status s = admin_auth_->Check(*context); !s.ok()) return FinishUnary(context, s);
  if (absl::Status s = CheckAddress(request->address(), limits_); !s.ok()) {
    return FinishUnary(context, s);
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // Add checks the worker once (a network round trip): off the callback thread.
  if (!options_.admin->Submit([this, reactor, address = request->address(), response] {
        absl::Status s = pool_->Add(address);
        if (s.ok()) pool_->FillList(response);
        reactor->Finish(ToGrpcStatus(s));
      })) {
    reactor->Finish(ToGrpcStatus(options_.admin->BusyError()));
  }
  return reactor;
}

grpc::ServerUnaryReactor* RouterService::RemoveWorker(grpc::CallbackServerContext* context,
                                                      const rl::v1::RemoveWorkerRequest* request,
                                                      rl::v1::WorkerListResponse* response) {
  if (absl::Status s = admin_auth_->Check(*context); !s.ok()) return FinishUnary(context, s);
  if (absl::Status s = CheckAddress(request->address(), limits_); !s.ok()) {
    return FinishUnary(context, s);
  }
  absl::Status s = pool_->Remove(request->address());
  if (s.ok()) pool_->FillList(response);
  return FinishUnary(context, s);
}

grpc::ServerUnaryReactor* RouterService::ListWorkers(grpc::CallbackServerContext* context,
                                                     const rl::v1::ListWorkersRequest*,
                                                     rl::v1::WorkerListResponse* response) {
  if (absl::Status s = admin_auth_->Check(*context); !s.ok()) return FinishUnary(context, s);
  pool_->FillList(response);
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* RouterService::SetWorkerEnabled(
    grpc::CallbackServerContext* context, const rl::v1::SetWorkerEnabledRequest* request,
    rl::v1::WorkerListResponse* response) {
  if (absl::Status s = admin_auth_->Check(*context); !s.ok()) return FinishUnary(context, s);
  if (absl::Status s = CheckAddress(request->address(), limits_); !s.ok()) {
    return FinishUnary(context, s);
  }
  absl::Status s = pool_->SetEnabled(request->address(), request->enabled());
  if (s.ok()) pool_->FillList(response);
  return FinishUnary(context, s);
}

void RouterService::FillMetrics(rl::v1::GetMetricsResponse* out) const {
  const std::vector<rl::v1::WorkerStatus> workers = pool_->List();
  int32_t active = 0;
  int64_t in_flight_total = 0;
  for (const auto& w : workers) {
    if (w.state() == rl::v1::WORKER_STATE_LIVE && w.enabled()) ++active;
    in_flight_total += w.in_flight();
    *out->add_workers() = w;
  }
  out->set_active_workers(active);
  out->set_total_workers(static_cast<int32_t>(workers.size()));
  out->set_in_flight(in_flight_total);
  out->set_requests_total(static_cast<int64_t>(requests_total->value()));
  out->set_retries_total(static_cast<int64_t>(retries_total->value()));
  out->set_failures_total(static_cast<int64_t>(failures_total->value()));
  out->set_weight_version_mismatch(pool_->VersionMismatch());
  const TextCacheStats s = cache_->GetStats();
  rl::v1::CacheMetrics* c = out->mutable_cache();
  c->set_entries(s.entries);
  c->set_hits(s.hits);
  c->set_misses(s.misses);
  c->set_hit_rate(s.hit_rate);
  c->set_size_tokens(s.size_tokens);
  c->set_size_bytes(s.size_bytes);
  c->set_gc_runs(s.gc_runs);
  c->set_gc_removed_tokens(s.gc_removed_tokens);
  c->set_current_weight_version(s.current_version);
  c->set_max_cache_size(s.max_cache_size);
  c->set_gc_threshold_k(s.gc_threshold_k);
  c->set_seam_continuations(seam_counters_.seam_continuations.load());
  c->set_whole_text_fallbacks(seam_counters_.whole_text_fallbacks.load());
  out->set_prometheus_text(metrics_->RenderPrometheus());
}

grpc::ServerUnaryReactor* RouterService::GetMetrics(grpc::CallbackServerContext* context,
                                                    const rl::v1::GetMetricsRequest*,
                                                    rl::v1::GetMetricsResponse* response) {
  if (absl::Status s = admin_auth_->Check(*context); !s.ok()) return FinishUnary(context, s);
  FillMetrics(response);
  return FinishUnary(context, absl::OkStatus());
}

}  // namespace rl::router
