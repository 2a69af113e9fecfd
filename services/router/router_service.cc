#include "services/router/router_service.h"

#include <cmath>
#include <deque>
#include <limits>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "common/tokenizer/stream_decoder.h"
#include "spdlog/spdlog.h"

namespace rl::router {
namespace {

constexpr float kUnknownLogprob = std::numeric_limits<float>::quiet_NaN();

// The prompt as the model will see it: cached prefix tokens plus the tokenized remainder.
struct Prompt {
  std::vector<int32_t> ids;
  std::vector<uint32_t> ends;  // byte end of each token in the text (text prompts)
  std::vector<uint8_t> mask;
  std::vector<float> logprobs;
  int32_t cached_tokens = 0;  // from the router's text cache
  bool from_text = false;
};

absl::StatusOr<Prompt> ResolvePrompt(const rl::v1::GenerateRequest& req, TextCache* cache,
                                     const tokenizer::Tokenizer* tok) {
  Prompt p;
  if (req.prompt_case() == rl::v1::GenerateRequest::kInputIds) {
    p.ids.assign(req.input_ids().ids().begin(), req.input_ids().ids().end());
    if (p.ids.empty()) return absl::InvalidArgumentError("input_ids: must not be empty");
    return p;
  }
  if (req.prompt_case() != rl::v1::GenerateRequest::kText) {
    return absl::InvalidArgumentError("prompt: set text or input_ids");
  }
  if (req.text().empty()) return absl::InvalidArgumentError("text: must not be empty");
  p.from_text = true;
  const std::string& text = req.text();
  CacheMatch m = cache->Match(text);
  p.ids = std::move(m.tokens);
  p.ends = std::move(m.token_end_offsets);
  p.mask = std::move(m.loss_mask);
  p.logprobs = std::move(m.logprobs);
  p.cached_tokens = static_cast<int32_t>(p.ids.size());
  if (m.matched_bytes < text.size()) {
    const std::string rest = text.substr(m.matched_bytes);
    auto enc = tok->Encode(rest, /*add_special_tokens=*/m.matched_bytes == 0);
    if (!enc.ok()) return Annotate(enc.status(), "text");
    for (size_t i = 0; i < enc->ids.size(); ++i) {
      p.ids.push_back(enc->ids[i]);
      uint32_t end = static_cast<uint32_t>(m.matched_bytes) + enc->offsets[i].end;
      if (enc->offsets[i].end == 0 && enc->offsets[i].begin == 0) end = m.matched_bytes;  // BOS
      if (!p.ends.empty()) end = std::max(end, p.ends.back());
      p.ends.push_back(end);
      p.mask.push_back(0);
      p.logprobs.push_back(kUnknownLogprob);
    }
  }
  if (p.ids.empty()) return absl::InvalidArgumentError("text: encodes to no token");
  return p;
}

// One Router.Generate stream: a thread runs the worker call (with retries) and feeds a write
// queue; gRPC's reference and the thread's reference keep the object alive.
class RouterGenerateReactor final : public grpc::ServerWriteReactor<rl::v1::GenerateResponse> {
 public:
  RouterGenerateReactor(RouterService* svc, grpc::CallbackServerContext* context,
                        const rl::v1::GenerateRequest& request, const BearerAuth* auth)
      : svc_(svc), request_(request) {
    absl::Status s = auth->Check(*context);
    if (s.ok()) {
      if (svc_->tokenizer() == nullptr) {
        s = absl::FailedPreconditionError("the router has no tokenizer");
      } else {
        auto prompt = ResolvePrompt(request_, svc_->cache(), svc_->tokenizer());
        if (prompt.ok()) {
          prompt_ = *std::move(prompt);
        } else {
          s = prompt.status();
        }
      }
    }
    if (!s.ok()) {
      {
        absl::MutexLock lock(&mu_);
        thread_ref_ = false;
        finished_ = true;
      }
      Finish(ToGrpcStatus(s));
      return;
    }
    authorization_ = AuthorizationHeader(*context);
    svc_->requests_total->Inc();
    svc_->in_flight->Add(1);
    std::thread([this] { Run(); }).detach();
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) Cancel();
    }
    Pump();
  }

  void OnCancel() override {
    {
      absl::MutexLock lock(&mu_);
      Cancel();
    }
    Pump();
  }

  void OnDone() override {
    bool last;
    {
      absl::MutexLock lock(&mu_);
      grpc_ref_ = false;
      last = !thread_ref_;
    }
    if (last) delete this;
  }

 private:
  void Cancel() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    cancelled_ = true;
    if (worker_ctx_ != nullptr) worker_ctx_->TryCancel();
  }

  void Push(rl::v1::GenerateResponse msg) {
    {
      absl::MutexLock lock(&mu_);
      queue_.push_back(std::move(msg));
      sent_any_ = true;
    }
    Pump();
  }

  void Pump() {
    enum { kNothing, kWrite, kFinish } action = kNothing;
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || writing_) return;
      if (cancelled_ && !done_) {
        // Wait for the worker call to wind down; Run() finishes the stream.
      } else if (!queue_.empty() && !cancelled_) {
        current_ = std::move(queue_.front());
        queue_.pop_front();
        writing_ = true;
        action = kWrite;
      } else if (done_) {
        finished_ = true;
        action = kFinish;
        status = cancelled_ ? grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled")
                            : final_status_;
      }
    }
    if (action == kWrite) StartWrite(&current_);
    if (action == kFinish) Finish(status);
  }

  // Worker thread body: attempts with backoff, then marks the stream done.
  void Run() {
    absl::Status status = RunAttempts();
    svc_->in_flight->Add(-1);
    if (!status.ok()) svc_->failures_total->Inc();
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      final_status_ = ToGrpcStatus(status);
    }
    Pump();
    bool last;
    {
      absl::MutexLock lock(&mu_);
      thread_ref_ = false;
      last = !grpc_ref_;
    }
    if (last) delete this;
  }

  absl::Status RunAttempts() {
    const RetryOptions& retry = svc_->retry();
    std::set<std::string> tried;
    std::chrono::milliseconds backoff = retry.backoff;
    absl::Status last = absl::UnavailableError("no live, enabled, serving worker");
    const auto hold_deadline = std::chrono::steady_clock::now() + retry.hold_wait;
    for (int attempt = 1; attempt <= retry.max_attempts; ++attempt) {
      {
        absl::MutexLock lock(&mu_);
        if (cancelled_) return absl::CancelledError("client cancelled");
      }
      if (attempt > 1) {
        svc_->retries_total->Inc();
        std::this_thread::sleep_for(backoff);
        backoff = std::min(backoff * 2, retry.max_backoff);
      }
      Lease lease = PickWorker(tried);
      // An admin broadcast has the workers out of routing: wait for it (not an attempt).
      while (!lease && svc_->pool()->held() && std::chrono::steady_clock::now() < hold_deadline) {
        {
          absl::MutexLock lock(&mu_);
          if (cancelled_) return absl::CancelledError("client cancelled");
        }
        std::this_thread::sleep_for(retry.hold_poll);
        lease = PickWorker(tried);
      }
      if (!lease) {
        last = absl::UnavailableError("no live, enabled, serving worker");
        continue;
      }
      tried.insert(lease->address());
      bool retriable = false;
      last = Attempt(lease, attempt, &retriable);
      if (last.ok() || !retriable) return last;
      spdlog::info("retrying request on another worker after: {}", std::string(last.message()));
    }
    return last;
  }

  // A worker not tried yet, else any routable one (every worker was tried); empty when none.
  Lease PickWorker(const std::set<std::string>& tried) {
    Lease lease = svc_->pool()->Pick(tried);
    if (!lease) lease = svc_->pool()->Pick();
    return lease;
  }

  // One worker call. Sets `retriable` when nothing reached the client and the failure may go
  // away on another worker (UNAVAILABLE, or the worker aborted the request).
  absl::Status Attempt(Lease& lease, int attempt, bool* retriable) {
    rl::v1::GenerateRequest req = request_;
    req.clear_text();
    req.mutable_input_ids()->mutable_ids()->Assign(prompt_.ids.begin(), prompt_.ids.end());
    req.set_return_logprob(true);  // the cache keeps rollout logprobs
    req.set_stream(true);
    req.clear_return_trajectory();
    grpc::ClientContext ctx;
    if (authorization_) ctx.AddMetadata("authorization", *authorization_);
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) return absl::CancelledError("client cancelled");
      worker_ctx_ = &ctx;
    }
    const int n = req.sampling_params().has_n() ? req.sampling_params().n() : 1;
    std::vector<Completion> completions(static_cast<size_t>(std::max(n, 1)));
    for (Completion& c : completions) c.decoder.emplace(*svc_->tokenizer(), false);
    for (Completion& c : completions) (void)c.decoder->Step(prompt_.ids);  // context only
    const bool stream = !request_.has_stream() || request_.stream();
    auto reader = lease->worker_stub().Generate(&ctx, req);
    rl::v1::GenerateResponse msg;
    bool aborted_before_output = false;
    while (reader->Read(&msg)) {
      if (msg.index() < 0 || msg.index() >= static_cast<int>(completions.size())) continue;
      Completion& c = completions[static_cast<size_t>(msg.index())];
      if (msg.has_chunk()) {
        rl::v1::GenerateChunk* chunk = msg.mutable_chunk();
        for (int32_t id : chunk->token_ids()) {
          auto delta = c.decoder->Step(id);
          c.text += delta.ok() ? *delta : "";
          c.ends.push_back(static_cast<uint32_t>(c.text.size()));
        }
        if (!stream) continue;
        chunk->set_text(c.text.substr(c.streamed_bytes));
        c.streamed_bytes = c.text.size();
        if (!request_.return_logprob()) chunk->clear_logprobs();
        Push(std::move(msg));
        continue;
      }
      if (!msg.has_final()) continue;
      rl::v1::GenerateFinal* f = msg.mutable_final();
      bool sent;
      {
        absl::MutexLock lock(&mu_);
        sent = sent_any_;
      }
      if (f->finish_reason() == rl::v1::FINISH_REASON_ABORT && !sent) {
        aborted_before_output = true;
        ctx.TryCancel();
        break;
      }
      CompleteFinal(lease, attempt, c, f);
      if (stream && c.streamed_bytes < c.text.size()) {
        rl::v1::GenerateResponse tail;
        tail.set_request_id(msg.request_id());
        tail.set_index(msg.index());
        tail.mutable_chunk()->set_text(c.text.substr(c.streamed_bytes));
        c.streamed_bytes = c.text.size();
        Push(std::move(tail));
      }
      Push(std::move(msg));
    }
    grpc::Status s = reader->Finish();
    {
      absl::MutexLock lock(&mu_);
      worker_ctx_ = nullptr;
      if (cancelled_) return absl::CancelledError("client cancelled");
      *retriable = !sent_any_;
    }
    if (aborted_before_output) return absl::AbortedError("the worker aborted the request");
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) svc_->pool()->ReportFailure(lease.get());
    if (s.ok()) return absl::OkStatus();
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE) *retriable = false;
    return FromGrpcStatus(s);
  }

  struct Completion {
    std::optional<tokenizer::StreamDecoder> decoder;
    std::string text;            // completion text decoded in the prompt's context
    std::vector<uint32_t> ends;  // per output token, byte end within `text`
    size_t streamed_bytes = 0;
  };

  // Finishes the final message: in-context text, router fields, the cache insert and the
  // trajectory.
  void CompleteFinal(Lease& lease, int attempt, Completion& c, rl::v1::GenerateFinal* f) {
    auto rest = c.decoder->Flush();
    if (rest.ok()) c.text += *rest;
    if (!c.ends.empty()) c.ends.back() = static_cast<uint32_t>(c.text.size());
    f->set_text(c.text);
    f->set_worker(lease->address());
    f->set_attempts(attempt);
    svc_->pool()->ReportVersion(lease.get(), f->weight_version());
    const int num_out = f->output_ids_size();
    std::vector<int32_t> tokens = prompt_.ids;
    tokens.insert(tokens.end(), f->output_ids().begin(), f->output_ids().end());
    std::vector<uint8_t> mask = prompt_.mask;
    mask.resize(prompt_.ids.size(), 0);
    mask.insert(mask.end(), static_cast<size_t>(num_out), 1);
    std::vector<float> logprobs = prompt_.logprobs;
    logprobs.resize(prompt_.ids.size(), kUnknownLogprob);
    for (int i = 0; i < num_out; ++i) {
      logprobs.push_back(i < f->output_logprobs_size() ? f->output_logprobs(i).logprob()
                                                       : kUnknownLogprob);
    }
    if (prompt_.from_text && f->finish_reason() != rl::v1::FINISH_REASON_ABORT && num_out > 0 &&
        static_cast<int>(c.ends.size()) == num_out) {
      const std::string full = request_.text() + c.text;
      std::vector<uint32_t> ends = prompt_.ends;
      const uint32_t base = static_cast<uint32_t>(request_.text().size());
      for (uint32_t e : c.ends) ends.push_back(base + e);
      absl::Status s =
          svc_->cache()->Insert(full, tokens, ends, mask, logprobs, f->weight_version());
      if (!s.ok()) spdlog::warn("text cache insert failed: {}", std::string(s.message()));
    }
    if (request_.return_trajectory()) {
      rl::v1::Trajectory* t = f->mutable_trajectory();
      t->mutable_tokens()->Assign(tokens.begin(), tokens.end());
      for (uint8_t m : mask) t->add_loss_mask(m);
      t->mutable_rollout_logp()->Assign(logprobs.begin(), logprobs.end());
      t->set_weight_version(f->weight_version());
    }
    if (!request_.return_logprob()) {
      f->clear_output_logprobs();
      f->clear_prompt_logprobs();
    }
  }

  RouterService* svc_;
  const rl::v1::GenerateRequest request_;
  Prompt prompt_;
  std::optional<std::string> authorization_;

  absl::Mutex mu_;
  std::deque<rl::v1::GenerateResponse> queue_ ABSL_GUARDED_BY(mu_);
  rl::v1::GenerateResponse current_;
  grpc::ClientContext* worker_ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool sent_any_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
  bool grpc_ref_ ABSL_GUARDED_BY(mu_) = true;
  bool thread_ref_ ABSL_GUARDED_BY(mu_) = true;
};

}  // namespace

RouterService::RouterService(WorkerPool* pool, TextCache* cache,
                             const tokenizer::Tokenizer* tokenizer, const BearerAuth* data_auth,
                             const BearerAuth* admin_auth, MetricsRegistry* metrics,
                             RetryOptions retry)
    : pool_(pool),
      cache_(cache),
      tokenizer_(tokenizer),
      data_auth_(data_auth),
      admin_auth_(admin_auth),
      metrics_(metrics),
      retry_(retry) {
  requests_total = metrics->GetCounter("rl_router_requests_total", "Generate requests accepted.");
  retries_total = metrics->GetCounter("rl_router_retries_total", "Generate attempts retried.");
  failures_total =
      metrics->GetCounter("rl_router_failures_total", "Generate requests that failed.");
  in_flight = metrics->GetGauge("rl_router_in_flight_requests", "Generate requests in flight.");
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
  };
  for (const CacheGauge& g : kCacheGauges) {
    metrics->SetGaugeCallback(g.name, g.help, {},
                              [cache, get = g.get] { return get(cache->GetStats()); });
  }
  metrics->SetGaugeCallback("rl_router_live_workers", "Live workers.", {},
                            [pool] { return double(pool->LiveWorkers().size()); });
  metrics->SetGaugeCallback("rl_router_weight_version_mismatch",
                            "1 when live workers report different weight versions.", {},
                            [pool] { return pool->VersionMismatch() ? 1.0 : 0.0; });
}

grpc::ServerWriteReactor<rl::v1::GenerateResponse>* RouterService::Generate(
    grpc::CallbackServerContext* context, const rl::v1::GenerateRequest* request) {
  return new RouterGenerateReactor(this, context, *request, data_auth_);
}

grpc::ServerUnaryReactor* RouterService::RetrieveFromText(
    grpc::CallbackServerContext* context, const rl::v1::RetrieveFromTextRequest* request,
    rl::v1::RetrieveFromTextResponse* response) {
  if (absl::Status s = data_auth_->Check(*context); !s.ok()) return FinishUnary(context, s);
  if (request->text().empty())
    return FinishUnary(context, absl::InvalidArgumentError("text: must not be empty"));
  CacheRetrieval r = cache_->Retrieve(request->text());
  rl::v1::Trajectory* t = response->mutable_trajectory();
  t->mutable_tokens()->Assign(r.tokens.begin(), r.tokens.end());
  for (uint8_t m : r.loss_mask) t->add_loss_mask(m);
  t->mutable_rollout_logp()->Assign(r.rollout_logp.begin(), r.rollout_logp.end());
  t->set_weight_version(cache_->Match(request->text()).weight_version);
  response->set_matched_bytes(static_cast<int64_t>(r.matched_bytes));
  response->set_cached_tokens(static_cast<int32_t>(r.tokens.size()));
  if (request->tokenize_remainder() && r.matched_bytes < request->text().size()) {
    if (tokenizer_ == nullptr)
      return FinishUnary(context, absl::FailedPreconditionError("no tokenizer"));
    auto enc = tokenizer_->Encode(request->text().substr(r.matched_bytes), r.matched_bytes == 0);
    if (!enc.ok()) return FinishUnary(context, Annotate(enc.status(), "text"));
    for (int32_t id : enc->ids) {
      t->add_tokens(id);
      t->add_loss_mask(0);
      t->add_rollout_logp(kUnknownLogprob);
    }
  }
  return FinishUnary(context, absl::OkStatus());
}

namespace {
void FillList(WorkerPool* pool, rl::v1::WorkerListResponse* out) {
  for (auto& s : pool->List()) *out->add_workers() = std::move(s);
}
}  // namespace

grpc::ServerUnaryReactor* RouterService::AddWorker(grpc::CallbackServerContext* context,
                                                   const rl::v1::AddWorkerRequest* request,
                                                   rl::v1::WorkerListResponse* response) {
  if (absl::Status s = admin_auth_->Check(*context); !s.ok()) return FinishUnary(context, s);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // Add checks the worker once (a network round trip): off the callback thread.
  std::thread([this, reactor, address = request->address(), response] {
    absl::Status s = pool_->Add(address);
    if (s.ok()) FillList(pool_, response);
    reactor->Finish(ToGrpcStatus(s));
  }).detach();
  return reactor;
}

grpc::ServerUnaryReactor* RouterService::RemoveWorker(grpc::CallbackServerContext* context,
                                                      const rl::v1::RemoveWorkerRequest* request,
                                                      rl::v1::WorkerListResponse* response) {
  if (absl::Status s = admin_auth_->Check(*context); !s.ok()) return FinishUnary(context, s);
  absl::Status s = pool_->Remove(request->address());
  if (s.ok()) FillList(pool_, response);
  return FinishUnary(context, s);
}

grpc::ServerUnaryReactor* RouterService::ListWorkers(grpc::CallbackServerContext* context,
                                                     const rl::v1::ListWorkersRequest*,
                                                     rl::v1::WorkerListResponse* response) {
  if (absl::Status s = admin_auth_->Check(*context); !s.ok()) return FinishUnary(context, s);
  FillList(pool_, response);
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* RouterService::SetWorkerEnabled(
    grpc::CallbackServerContext* context, const rl::v1::SetWorkerEnabledRequest* request,
    rl::v1::WorkerListResponse* response) {
  if (absl::Status s = admin_auth_->Check(*context); !s.ok()) return FinishUnary(context, s);
  absl::Status s = pool_->SetEnabled(request->address(), request->enabled());
  if (s.ok()) FillList(pool_, response);
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
