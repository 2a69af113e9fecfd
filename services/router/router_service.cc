#include "services/router/router_service.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "common/tokenizer/stream_decoder.h"
#include "spdlog/spdlog.h"

namespace rl::router {
namespace {

constexpr float kUnknownLogprob = std::numeric_limits<float>::quiet_NaN();

// The prompt as the model will see it: cached tokens reused exactly plus the new ones.
// input_ids prompts fill `ids` only.
struct Prompt : ResolvedPrompt {
  bool from_text = false;
};

absl::StatusOr<Prompt> ResolvePrompt(const rl::v1::GenerateRequest& req, TextCache* cache,
                                     const tokenizer::Tokenizer* tok, SeamCounters* counters) {
  Prompt p;
  if (req.prompt_case() == rl::v1::GenerateRequest::kInputIds) {
    p.ids.assign(req.input_ids().ids().begin(), req.input_ids().ids().end());
    if (p.ids.empty()) return absl::InvalidArgumentError("input_ids: must not be empty");
    return p;
  }
  if (req.prompt_case() != rl::v1::GenerateRequest::kText) {
    return absl::InvalidArgumentError("prompt: set text or input_ids");
  }
  ASSIGN_OR_RETURN(ResolvedPrompt r, ResolveTextPrompt(req.text(), *cache, *tok, counters));
  static_cast<ResolvedPrompt&>(p) = std::move(r);
  p.from_text = true;
  if (p.ids.empty()) return absl::InvalidArgumentError("text: encodes to no token");
  return p;
}

// Per-output-token weight versions from the final's run-length segments; every token gets
// the final's weight_version when the segments do not cover the output exactly.
std::vector<int64_t> OutputVersions(const rl::v1::GenerateFinal& f) {
  std::vector<int64_t> out;
  for (const rl::v1::VersionSegment& seg : f.weight_version_segments()) {
    if (seg.num_tokens() < 0 || out.size() + static_cast<size_t>(seg.num_tokens()) >
                                  static_cast<size_t>(f.output_ids_size())) {
      out.clear();
      break;
    }
    out.insert(out.end(), static_cast<size_t>(seg.num_tokens()), seg.weight_version());
  }
  if (out.size() != static_cast<size_t>(f.output_ids_size())) {
    out.assign(static_cast<size_t>(f.output_ids_size()), f.weight_version());
  }
  return out;
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
      } else if (s = CheckGenerateRequest(request_, svc_->limits()); s.ok()) {
        absl::StatusOr<Prompt> prompt =
            absl::StartsWith(request_.request_id(), kRouterRequestIdPrefix)
                ? absl::InvalidArgumentError(absl::StrCat(
                      "request_id: the prefix '", kRouterRequestIdPrefix,
                      "' is reserved for ids the router assigns (leave request_id empty "
                      "to get one)"))
                : ResolvePrompt(request_, svc_->cache(), svc_->tokenizer(),
                                svc_->seam_counters());
        if (prompt.ok()) {
          prompt_ = *std::move(prompt);
          s = CheckPromptTokens(static_cast<int64_t>(prompt_.ids.size()), svc_->limits());
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
    request_id_ = request_.request_id().empty() ? RequestTable::NewId() : request_.request_id();
    request_handle_ = svc_->requests()->Add(request_id_);
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
    request_handle_ = RequestTable::Handle();
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
      if (request_handle_.aborted()) return absl::AbortedError("aborted by Router.Abort");
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
        if (request_handle_.aborted()) return absl::AbortedError("aborted by Router.Abort");
        std::this_thread::sleep_for(retry.hold_poll);
        lease = PickWorker(tried);
      }
      if (!lease) {
        last = absl::UnavailableError("no live, enabled, serving worker");
        continue;
      }
      tried.insert(lease->address());
      bool retriable = false;
      last = Attempt(lease, attempt, attempt == retry.max_attempts, &retriable);
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
  // away on another worker (UNAVAILABLE, or the worker aborted the request). On the last
  // attempt a worker abort is passed on as the final message (partial output kept).
  absl::Status Attempt(Lease& lease, int attempt, bool last_attempt, bool* retriable) {
    rl::v1::GenerateRequest req = request_;
    req.clear_text();
    req.mutable_input_ids()->mutable_ids()->Assign(prompt_.ids.begin(), prompt_.ids.end());
    req.set_return_logprob(true);  // the cache keeps rollout logprobs
    req.set_stream(true);
    req.clear_return_trajectory();
    req.set_request_id(request_id_);
    request_handle_.SetWorker(lease->address());
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
    for (Completion& c : completions) (void)c.decoder->Prime(prompt_.ids);  // context only
    const bool stream = !request_.has_stream() || request_.stream();
    // Cancelled by the pool when it marks the worker dead (worker_pool.h).
    CallGuard guard(lease.get(), &ctx);
    auto reader = lease->worker_stub().Generate(&ctx, req);
    rl::v1::GenerateResponse msg;
    bool aborted_before_output = false;
    size_t num_finals = 0;
    while (reader->Read(&msg)) {
      if (msg.index() < 0 || msg.index() >= static_cast<int>(completions.size())) continue;
      Completion& c = completions[static_cast<size_t>(msg.index())];
      if (msg.has_chunk()) {
        rl::v1::GenerateChunk* chunk = msg.mutable_chunk();
        for (int32_t id : chunk->token_ids()) {
          auto delta = c.decoder->Step(id);
          AppendCompletionDelta(delta.ok() ? *delta : "", &c.text, &c.ends);
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
      // An abort the worker chose is retried (unless this was the last attempt, whose final
      // is returned as is); one asked for through Router.Abort is final.
      if (f->finish_reason() == rl::v1::FINISH_REASON_ABORT && !sent && !last_attempt &&
          !request_handle_.aborted()) {
        aborted_before_output = true;
        ctx.TryCancel();
        break;
      }
      CompleteFinal(lease, attempt, c, f);
      ++num_finals;
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
    request_handle_.SetWorker("");
    {
      absl::MutexLock lock(&mu_);
      worker_ctx_ = nullptr;
      if (cancelled_) return absl::CancelledError("client cancelled");
      *retriable = !sent_any_;
    }
    if (aborted_before_output) return absl::AbortedError("the worker aborted the request");
    // Every completion got its final message: the request is done, whatever happened to the
    // call after that (e.g. the pool cancelled it because the worker was just marked dead).
    if (num_finals == completions.size()) return absl::OkStatus();
    if (!s.ok() && guard.cancelled_by_pool()) {
      // The pool knows already: not reported as a failure again.
      return absl::UnavailableError(absl::StrCat(
          "worker ", lease->address(), " was marked dead mid-generation (", guard.reason(), ")",
          *retriable ? "" : "; output was already streamed, so it is not retried"));
    }
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
    std::fill(c.ends.begin() + static_cast<std::ptrdiff_t>(PendingFrom(c.ends)), c.ends.end(),
              static_cast<uint32_t>(c.text.size()));
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
    // Cached tokens keep their versions; new prompt tokens get the version at dispatch.
    std::vector<int64_t> versions = prompt_.versions;
    versions.resize(prompt_.ids.size(), f->dispatch_weight_version());
    const std::vector<int64_t> out_versions = OutputVersions(*f);
    versions.insert(versions.end(), out_versions.begin(), out_versions.end());
    if (prompt_.from_text && f->finish_reason() != rl::v1::FINISH_REASON_ABORT && num_out > 0 &&
        static_cast<int>(c.ends.size()) == num_out) {
      const std::string full = request_.text() + c.text;
      std::vector<uint32_t> ends = prompt_.ends;
      const uint32_t base = static_cast<uint32_t>(request_.text().size());
      for (uint32_t e : c.ends) ends.push_back(base + e);
      absl::Status s =
          svc_->cache()->Insert(full, tokens, ends, mask, logprobs, f->weight_version(), versions);
      if (!s.ok()) spdlog::warn("text cache insert failed: {}", std::string(s.message()));
    }
    if (request_.return_trajectory()) {
      rl::v1::Trajectory* t = f->mutable_trajectory();
      t->mutable_tokens()->Assign(tokens.begin(), tokens.end());
      for (uint8_t m : mask) t->add_loss_mask(m);
      t->mutable_rollout_logp()->Assign(logprobs.begin(), logprobs.end());
      t->set_weight_version(f->weight_version());
      t->mutable_token_weight_versions()->Assign(versions.begin(), versions.end());
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
  std::string request_id_;  // the client's, or one the router made up
  RequestTable::Handle request_handle_;

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
  if (static_cast<int64_t>(request->text().size()) > limits_.max_prompt_bytes) {
    return FinishUnary(context, absl::InvalidArgumentError(absl::StrCat(
                                    "text: ", request->text().size(),
                                    " bytes is more than --max-prompt-bytes (",
                                    limits_.max_prompt_bytes, ")")));
  }
  rl::v1::Trajectory* t = response->mutable_trajectory();
  if (request->tokenize_remainder()) {
    // The tokens a Generate of this text would send: one cache lookup, one hit or miss.
    if (tokenizer_ == nullptr)
      return FinishUnary(context, absl::FailedPreconditionError("no tokenizer"));
    absl::StatusOr<ResolvedPrompt> r =
        ResolveTextPrompt(request->text(), *cache_, *tokenizer_, &seam_counters_);
    if (!r.ok()) return FinishUnary(context, r.status());
    const int64_t current = cache_->GetStats().current_version;
    std::vector<int64_t> versions = r->versions;
    versions.resize(r->ids.size(), current);
    t->mutable_tokens()->Assign(r->ids.begin(), r->ids.end());
    for (uint8_t m : r->mask) t->add_loss_mask(m);
    t->mutable_rollout_logp()->Assign(r->logprobs.begin(), r->logprobs.end());
    t->mutable_token_weight_versions()->Assign(versions.begin(), versions.end());
    int64_t newest = 0;
    for (int64_t v : versions) newest = std::max(newest, v);
    t->set_weight_version(newest);
    response->set_matched_bytes(r->cached_tokens > 0 ? r->ends[r->cached_tokens - 1] : 0);
    response->set_cached_tokens(r->cached_tokens);
    return FinishUnary(context, absl::OkStatus());
  }
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

grpc::ServerUnaryReactor* RouterService::AddWorker(grpc::CallbackServerContext* context,
                                                   const rl::v1::AddWorkerRequest* request,
                                                   rl::v1::WorkerListResponse* response) {
  if (absl::Status s = admin_auth_->Check(*context); !s.ok()) return FinishUnary(context, s);
  if (absl::Status s = CheckAddress(request->address(), limits_); !s.ok()) {
    return FinishUnary(context, s);
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // Add checks the worker once (a network round trip): off the callback thread.
  std::thread([this, reactor, address = request->address(), response] {
    absl::Status s = pool_->Add(address);
    if (s.ok()) pool_->FillList(response);
    reactor->Finish(ToGrpcStatus(s));
  }).detach();
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
