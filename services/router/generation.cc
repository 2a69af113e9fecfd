#include "services/router/generation.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "services/router/cache/cache_store.h"
#include "spdlog/spdlog.h"

namespace rl::router {
namespace {

constexpr float kUnknownLogprob = std::numeric_limits<float>::quiet_NaN();

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

}  // namespace

bool Generation::PromptBlocks(const rl::v1::GenerateRequest& request) {
  return request.prompt_case() == rl::v1::GenerateRequest::kText &&
         request.text().size() > kInlinePromptBytes;
}

absl::Status Generation::CheckRequest(const rl::v1::GenerateRequest& request,
                                      const RequestLimits& limits) {
  RETURN_IF_ERROR(CheckGenerateRequest(request, limits));
  if (request.routing_key().size() > kMaxRoutingKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("routing_key (or the rl-routing-key header): ", request.routing_key().size(),
                     " bytes is more than ", kMaxRoutingKeyBytes));
  }
  if (request.group_id().size() > kMaxRoutingKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("group_id: ", request.group_id().size(),
                                                   " bytes is more than ", kMaxRoutingKeyBytes));
  }
  if (absl::StartsWith(request.request_id(), kRouterRequestIdPrefix)) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id: the prefix '", kRouterRequestIdPrefix,
                     "' is reserved for ids the router assigns (leave request_id empty to get "
                     "one)"));
  }
  if (!request.episode_id().empty()) RETURN_IF_ERROR(ValidateEpisodeId(request.episode_id()));
  return absl::OkStatus();
}

Generation::Registration Generation::Register(const rl::v1::GenerateRequest& request,
                                              RequestTable* requests) {
  Registration r;
  r.request_id = request.request_id().empty() ? RequestTable::NewId() : request.request_id();
  r.handle = requests->Add(r.request_id, request.group_id());
  return r;
}

absl::StatusOr<std::unique_ptr<Generation>> Generation::Create(
    const rl::v1::GenerateRequest& request, const GenerationEnv* env, Registration* registered) {
  if (env->tokenizer == nullptr)
    return absl::FailedPreconditionError("the router has no tokenizer");
  if (registered == nullptr) RETURN_IF_ERROR(CheckRequest(request, env->limits));
  ASSIGN_OR_RETURN(rl::v1::GenerateRequest effective, ResolveResume(request, env->resume_store));
  std::unique_ptr<Generation> g(new Generation(effective, env));
  if (request.has_resume_from()) g->resumed_from_id_ = request.resume_from().request_id();
  ASSIGN_OR_RETURN(g->prompt_,
                   ResolvePrompt(g->request_, env->cache, env->tokenizer, env->seam_counters));
  RETURN_IF_ERROR(CheckPromptTokens(static_cast<int64_t>(g->prompt_.ids.size()), env->limits));
  for (const CacheHolder& h : g->prompt_.holders) {
    g->holders_.push_back({h.worker, static_cast<int32_t>(h.tokens)});
  }
  Registration own;
  if (registered == nullptr) {
    own = Register(request, env->requests);
    registered = &own;
  }
  g->request_id_ = std::move(registered->request_id);
  g->request_handle_ = std::move(registered->handle);
  g->backoff_ = env->retry.backoff;
  g->hold_poll_ = env->retry.hold_poll;
  g->hold_deadline_ = std::chrono::steady_clock::now() + env->retry.hold_wait;
  g->version_deadline_ = std::chrono::steady_clock::now() + env->retry.version_wait;
  g->version_poll_ = env->retry.version_poll;
  g->last_ = absl::UnavailableError("no live, enabled, serving worker");
  return g;
}

void Generation::SetDeadline(std::chrono::system_clock::time_point deadline) {
  const auto now = std::chrono::system_clock::now();
  if (deadline >= now + env_->retry.version_wait) return;  // infinite or later than the cap
  // The answer must reach the client before its deadline does (on a loaded host timers and
  // threads lag): stop a quarter of the time left (at most 1 s) early.
  auto left = std::max(deadline - now, std::chrono::system_clock::duration::zero());
  left -= std::min<std::chrono::system_clock::duration>(left / 4, std::chrono::seconds(1));
  version_deadline_ = std::min(
      version_deadline_, std::chrono::steady_clock::now() +
                             std::chrono::duration_cast<std::chrono::steady_clock::duration>(left));
}

Lease Generation::PickWorker() {
  PickRequest pick;
  pick.versions = versions_;
  pick.exclude = &tried_;
  if (prompt_.from_text) pick.text = request_.text();
  pick.prompt_ids = prompt_.ids;
  pick.routing_key = request_.routing_key();
  // An agent episode's turns go where its earlier turns went (their KV is there).
  if (pick.routing_key.empty() && !request_.episode_id().empty()) {
    pick.routing_key = absl::StrCat("episode:", request_.episode_id());
  }
  pick.group_id = request_.group_id();
  pick.units = request_.sampling_params().has_n() ? std::max(request_.sampling_params().n(), 1) : 1;
  pick.prefix_holders = holders_;
  pick.trajectory_tokens = prompt_.cached_tokens;
  Lease lease = env_->workers->Pick(pick);
  if (!lease) {
    pick.exclude = nullptr;  // every worker was tried: any will do
    lease = env_->workers->Pick(pick);
  }
  return lease;
}

Generation::Step Generation::Next() {
  const RetryOptions& retry = env_->retry;
  Step step;
  for (;;) {
    if (phase_ == Phase::kDone) {
      request_handle_ = RequestTable::Handle();  // no longer abortable
      step.status = done_status_;
      return step;
    }
    if (cancelled_) {
      done_status_ = absl::CancelledError("client cancelled");
      phase_ = Phase::kDone;
      continue;
    }
    if (request_handle_.aborted()) {
      done_status_ = absl::AbortedError("aborted by Router.Abort");
      phase_ = Phase::kDone;
      continue;
    }
    if (phase_ == Phase::kStartAttempt) {
      if (++attempt_ > retry.max_attempts) {
        done_status_ = last_;
        phase_ = Phase::kDone;
        continue;
      }
      phase_ = Phase::kPick;
      if (attempt_ > 1) {
        if (env_->retries_total != nullptr) env_->retries_total->Inc();
        step.kind = Step::Kind::kWait;
        step.wait = backoff_;
        backoff_ = std::min(backoff_ * 2, retry.max_backoff);
        return step;
      }
    }
    // kPick (kInCall is never seen here: EndAttempt moves on).
    lease_ = PickWorker();
    if (lease_) {
      tried_.insert(lease_->address());
      phase_ = Phase::kInCall;
      step.kind = Step::Kind::kCall;
      step.worker = lease_.get();
      return step;
    }
    // An admin broadcast has the workers out of routing: wait for it (not an attempt).
    if (env_->workers->held() && std::chrono::steady_clock::now() < hold_deadline_) {
      step.kind = Step::Kind::kWait;
      step.wait = hold_poll_;
      hold_poll_ = std::min(hold_poll_ * 2, retry.hold_poll * 8);
      return step;
    }
    if (versions_.any()) {
      last_ = absl::UnavailableError("no live, enabled, serving worker");
      phase_ = Phase::kStartAttempt;
      continue;
    }
    // No worker serves a version the request accepts: wait for one (an update in progress, a
    // worker catching up) until its deadline, not counted as an attempt; then a retryable
    // UNAVAILABLE naming what it asked for and what there is.
    if (const auto now = std::chrono::steady_clock::now(); now < version_deadline_) {
      step.kind = Step::Kind::kWait;
      // Never past the deadline: the answer is due then.
      step.wait = std::min(version_poll_,
                           std::chrono::ceil<std::chrono::milliseconds>(version_deadline_ - now));
      version_poll_ = std::min(version_poll_ * 2, env_->retry.version_poll * 8);
      return step;
    }
    const std::vector<int64_t> available = env_->workers->RoutableVersions();
    done_status_ = absl::UnavailableError(absl::StrCat(
        "no worker serves a weight version this request accepts: it asked for ",
        versions_.Describe(), "; the routable workers serve ",
        available.empty() ? "none (no routable worker)"
                          : absl::StrCat("version(s) ", absl::StrJoin(available, ", ")),
        " (retryable: retry once the fleet reaches the version)"));
    phase_ = Phase::kDone;
  }
}

rl::v1::GenerateRequest Generation::WorkerRequest() {
  rl::v1::GenerateRequest req = request_;
  req.clear_text();
  req.mutable_input_ids()->mutable_ids()->Assign(prompt_.ids.begin(), prompt_.ids.end());
  req.set_return_logprob(true);  // the cache keeps rollout logprobs
  req.set_stream(true);
  req.set_skip_detokenize(true);  // the router decodes the ids itself (OnMessage)
  req.clear_return_trajectory();
  // Issue 34: the fleet's staleness bound for a request that sets none.
  if (!req.has_max_version_lag() && env_->max_version_lag >= 0) {
    req.set_max_version_lag(env_->max_version_lag);
  }
  req.clear_routing_key();  // the router's business only
  req.clear_group_id();
  req.set_request_id(request_id_);
  request_handle_.SetWorker(lease_->address());
  const int n = req.sampling_params().has_n() ? req.sampling_params().n() : 1;
  completions_.clear();
  completions_.resize(static_cast<size_t>(std::max(n, 1)));
  for (Completion& c : completions_) {
    c.decoder.emplace(*env_->tokenizer, false);
    (void)c.decoder->Prime(prompt_.ids);  // context only
    PrimeResumed(&c);
  }
  num_finals_ = 0;
  aborted_before_output_ = false;
  return req;
}

bool Generation::FinalBlocks(const rl::v1::GenerateResponse& msg) const {
  return msg.has_final() && prompt_.from_text;
}

bool Generation::OnMessage(rl::v1::GenerateResponse msg,
                           std::vector<rl::v1::GenerateResponse>* out) {
  if (msg.index() < 0 || msg.index() >= static_cast<int>(completions_.size())) return true;
  Completion& c = completions_[static_cast<size_t>(msg.index())];
  const bool stream = !request_.has_stream() || request_.stream();
  if (msg.has_chunk()) {
    rl::v1::GenerateChunk* chunk = msg.mutable_chunk();
    for (int32_t id : chunk->token_ids()) {
      auto delta = c.decoder->Step(id);
      AppendCompletionDelta(delta.ok() ? *delta : "", &c.text, &c.ends);
    }
    if (!stream) return true;
    chunk->set_text(c.text.substr(c.streamed_bytes));
    c.streamed_bytes = c.text.size();
    if (!request_.return_logprob()) chunk->clear_logprobs();
    out->push_back(std::move(msg));
    sent_any_ = true;
    return true;
  }
  if (!msg.has_final()) return true;
  rl::v1::GenerateFinal* f = msg.mutable_final();
  // An abort the worker chose is retried (unless this was the last attempt, whose final is
  // returned as is); one asked for through Router.Abort is final. FINISH_REASON_STALE (the
  // request's max_version_lag was crossed) is final too: never retried.
  if (f->finish_reason() == rl::v1::FINISH_REASON_ABORT && !sent_any_ &&
      attempt_ < env_->retry.max_attempts && !request_handle_.aborted()) {
    aborted_before_output_ = true;
    return false;
  }
  CompleteFinal(static_cast<size_t>(msg.index()), f);
  ++num_finals_;
  if (stream && c.streamed_bytes < c.text.size()) {
    rl::v1::GenerateResponse tail;
    tail.set_request_id(msg.request_id());
    tail.set_index(msg.index());
    tail.mutable_chunk()->set_text(c.text.substr(c.streamed_bytes));
    c.streamed_bytes = c.text.size();
    out->push_back(std::move(tail));
  }
  out->push_back(std::move(msg));
  sent_any_ = true;
  return true;
}

namespace {

// A transport-level failure of a worker call ("recvmsg:Connection reset by peer") with the
// worker named; the worker's own answers pass unchanged.
absl::Status NameWorker(const absl::Status& status, const std::string& address, bool retriable) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kAborted:
      break;
    default:
      return status;  // the worker's own answer to the request (a bad field, a full queue)
  }
  if (absl::StrContains(status.message(), address)) return status;
  return absl::Status(status.code(),
                      absl::StrCat("worker ", address, ": ", status.message(),
                                   retriable ? "" : " (output was already streamed: not retried)"));
}

}  // namespace

void Generation::EndAttempt(const absl::Status& status, std::optional<std::string> pool_reason) {
  Lease lease = std::move(lease_);
  request_handle_.SetWorker("");
  phase_ = Phase::kDone;
  const bool retriable = !sent_any_;
  if (cancelled_) {
    done_status_ = absl::CancelledError("client cancelled");
    return;
  }
  absl::Status result;
  bool may_retry = retriable;
  if (aborted_before_output_) {
    result = absl::AbortedError("the worker aborted the request");
  } else if (num_finals_ == completions_.size()) {
    // Every completion got its final message: the request is done, whatever happened to the
    // call after that (e.g. the pool cancelled it because the worker was just marked dead).
    result = absl::OkStatus();
  } else if (!status.ok() && pool_reason.has_value()) {
    // The pool knows already: not reported as a failure again.
    result = absl::UnavailableError(
        absl::StrCat("worker ", lease->address(), " was marked dead mid-generation (", *pool_reason,
                     ")", retriable ? "" : "; output was already streamed, so it is not retried"));
  } else {
    if (status.code() == absl::StatusCode::kUnavailable) env_->workers->ReportFailure(lease.get());
    // CANCELLED from the worker (not from our client: cancelled_ above) is a worker that went
    // away mid-call, e.g. a SIGTERMed one whose gRPC server cancelled what was left: retried
    // like UNAVAILABLE while nothing was sent.
    if (status.code() != absl::StatusCode::kUnavailable &&
        status.code() != absl::StatusCode::kCancelled) {
      may_retry = false;
    }
    result = NameWorker(status, lease->address(), retriable);
  }
  if (result.ok() || !may_retry || attempt_ >= env_->retry.max_attempts) {
    done_status_ = result;
    return;
  }
  last_ = result;
  spdlog::info("retrying request on another worker after: {}", std::string(result.message()));
  phase_ = Phase::kStartAttempt;
}

void Generation::CompleteFinal(size_t index, rl::v1::GenerateFinal* f) {
  Completion& c = completions_[index];
  auto rest = c.decoder->Flush();
  if (rest.ok()) c.text += *rest;
  std::fill(c.ends.begin() + static_cast<std::ptrdiff_t>(PendingFrom(c.ends)), c.ends.end(),
            static_cast<uint32_t>(c.text.size()));
  f->set_text(c.text);
  f->set_worker(lease_->address());
  f->set_attempts(attempt_);
  env_->workers->ReportVersion(lease_.get(), f->weight_version());
  if (f->finish_reason() != rl::v1::FINISH_REASON_ABORT) {
    lease_->RecordPrefix(f->prompt_tokens(), f->cached_tokens());
    if (env_->record_prefix) {
      env_->record_prefix(lease_->address(), f->prompt_tokens(), f->cached_tokens());
    }
  }
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
  bool inserted = false;
  if (prompt_.from_text && f->finish_reason() != rl::v1::FINISH_REASON_ABORT && num_out > 0 &&
      static_cast<int>(c.ends.size()) == num_out) {
    const std::string full = request_.text() + c.text;
    std::vector<uint32_t> ends = prompt_.ends;
    const uint32_t base = static_cast<uint32_t>(request_.text().size());
    for (uint32_t e : c.ends) ends.push_back(base + e);
    size_t cached = 0;
    absl::Status s = env_->cache->Insert(full, tokens, ends, mask, logprobs, f->weight_version(),
                                         versions, &cached, lease_->address());
    if (!s.ok()) spdlog::warn("text cache insert failed: {}", std::string(s.message()));
    inserted = s.ok() && cached == tokens.size();
  }
  if (prompt_.from_text) {
    // Durability (docs/text-cache.md): the final waits for the store to hold everything the
    // cache changed up to now (this insert and any it reused), or says it is not durable.
    CacheStore* store = env_->cache->store();
    const bool durable = store != nullptr && !store->GetStats().failed;
    if (store != nullptr) durable_ticket_ = std::max(durable_ticket_, store->last_ticket());
    if (!durable) {
      f->set_cache_history_unknown(true);
      if (env_->history_unknown_total != nullptr) env_->history_unknown_total->Inc();
    }
    f->set_trajectory_not_durable(!durable || !inserted);
  }
  if (!request_.episode_id().empty() && env_->episodes != nullptr &&
      f->finish_reason() != rl::v1::FINISH_REASON_ABORT) {
    EpisodeTurnRecord turn;
    turn.request_id = request_id_;
    turn.index = static_cast<int32_t>(index);
    turn.worker = lease_->address();
    turn.tokens = tokens;
    turn.mask = mask;
    turn.logprobs = logprobs;
    turn.versions = versions;
    turn.prompt_tokens = static_cast<int32_t>(prompt_.ids.size());
    turn.weight_version = f->weight_version();
    turn.finish_reason = f->finish_reason();
    turn.matched_token_id = f->matched_token_id();
    // R3: the routing the worker computed for this turn, over the same positions as `tokens`.
    if (f->has_routed_experts()) turn.routing = f->routed_experts();
    absl::Status s = env_->episodes->Record(request_.episode_id(), std::move(turn));
    if (!s.ok()) spdlog::warn("episode turn not recorded: {}", std::string(s.message()));
  }
  OnResumeFinal(index, f);
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

}  // namespace rl::router
