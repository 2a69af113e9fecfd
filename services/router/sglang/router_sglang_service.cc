#include "services/router/sglang/router_sglang_service.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "common/sglang/sglang_request.h"
#include "common/status.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/client_callback.h"
#include "services/router/generate_reactor.h"
#include "services/router/sglang/sglang_readiness.h"

namespace rl::router {
namespace {

namespace common = ::smg::grpc::common;

const char* FinishWord(rl::v1::FinishReason r) {
  switch (r) {
    case rl::v1::FINISH_REASON_STOP:
      return sglang::kFinishStop;
    case rl::v1::FINISH_REASON_LENGTH:
      return sglang::kFinishLength;
    default:
      return sglang::kFinishAbort;
  }
}

void AppendLogprobs(const google::protobuf::RepeatedPtrField<rl::v1::TokenLogprob>& in,
                    bool with_top, sgl::OutputLogProbs* out) {
  for (const rl::v1::TokenLogprob& lp : in) {
    out->add_token_logprobs(lp.logprob());
    out->add_token_ids(static_cast<uint32_t>(lp.token_id()));
    if (with_top) {
      sgl::TopLogProbs* top = out->add_top_logprobs();
      for (const rl::v1::TopLogprob& t : lp.top()) {
        top->add_values(t.logprob());
        top->add_token_ids(static_cast<uint32_t>(t.token_id()));
      }
    }
  }
}

// One gateway Generate: a server stream to the gateway and a client stream to this router's
// Router.Generate, stepped in turn (read one router message, write what it becomes, read the
// next), so at most one message waits. Deletes itself when both streams are done.
class BridgeReactor final : public grpc::ServerWriteReactor<sgl::GenerateResponse>,
                            public grpc::ClientReadReactor<rl::v1::GenerateResponse> {
 public:
  BridgeReactor(rl::v1::Router::Stub* router, const std::optional<std::string>& authorization,
                const sgl::GenerateRequest& in, rl::v1::GenerateRequest out)
      : stream_(in.stream()),
        with_logprobs_(in.return_logprob()),
        with_top_(in.return_logprob() && in.top_logprobs_num() > 0),
        prompt_tokens_(static_cast<uint32_t>(in.tokenized().input_ids_size())),
        request_(std::move(out)) {
    request_id_ = request_.request_id();
    if (authorization) ctx_.AddMetadata("authorization", *authorization);
    ctx_.AddMetadata(kClientIdHeader,
                     request_.episode_id().empty() ? kSglangClientId : request_.episode_id());
    router->async()->Generate(&ctx_, &request_, this);
    StartRead(&from_router_);
    StartCall();
  }

  // Server side.
  void OnWriteDone(bool ok) override {
    if (!ok) {
      ctx_.TryCancel();
      return;
    }
    StartRead(&from_router_);
  }
  void OnCancel() override { ctx_.TryCancel(); }
  void OnDone() override { MaybeDelete(); }

  // Client side.
  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone(status) follows
    if (Translate(from_router_, &to_gateway_)) {
      StartWrite(&to_gateway_);
    } else {
      StartRead(&from_router_);
    }
  }
  void OnDone(const grpc::Status& s) override {
    ServerWriteReactor::Finish(s);
    MaybeDelete();
  }

 private:
  // Whether `in` becomes a message for the gateway (in `out`).
  bool Translate(const rl::v1::GenerateResponse& in, sgl::GenerateResponse* out) {
    out->Clear();
    out->set_request_id(request_id_);
    const uint32_t index = static_cast<uint32_t>(in.index());
    if (in.has_chunk()) {
      if (in.chunk().token_ids().empty()) return false;  // a text tail: the gateway decodes
      completion_tokens_[index] += static_cast<uint32_t>(in.chunk().token_ids_size());
      sgl::GenerateStreamChunk* c = out->mutable_chunk();
      for (int32_t id : in.chunk().token_ids()) c->add_token_ids(static_cast<uint32_t>(id));
      c->set_prompt_tokens(prompt_tokens_);
      c->set_completion_tokens(completion_tokens_[index]);
      c->set_index(index);
      if (with_logprobs_)
        AppendLogprobs(in.chunk().logprobs(), with_top_, c->mutable_output_logprobs());
      return true;
    }
    if (!in.has_final()) return false;
    const rl::v1::GenerateFinal& f = in.final();
    sgl::GenerateComplete* c = out->mutable_complete();
    c->set_finish_reason(FinishWord(f.finish_reason()));
    c->set_prompt_tokens(static_cast<uint32_t>(f.prompt_tokens()));
    c->set_completion_tokens(static_cast<uint32_t>(f.completion_tokens()));
    c->set_cached_tokens(static_cast<uint32_t>(f.cached_tokens()));
    c->set_index(index);
    if (f.finish_reason() == rl::v1::FINISH_REASON_STOP) {
      if (!f.matched_stop().empty()) {
        c->set_matched_stop_str(f.matched_stop());
      } else if (f.matched_token_id() >= 0) {
        c->set_matched_token_id(static_cast<uint32_t>(f.matched_token_id()));
      }
    }
    if (!stream_) {
      for (int32_t id : f.output_ids()) c->add_output_ids(static_cast<uint32_t>(id));
      if (with_logprobs_)
        AppendLogprobs(f.output_logprobs(), with_top_, c->mutable_output_logprobs());
    }
    return true;
  }

  void MaybeDelete() {
    // Both callbacks may run on different threads: the second one deletes.
    if (done_count_.fetch_add(1) == 1) delete this;
  }

  const bool stream_;
  const bool with_logprobs_;
  const bool with_top_;
  const uint32_t prompt_tokens_;
  rl::v1::GenerateRequest request_;
  grpc::ClientContext ctx_;
  std::string request_id_;
  rl::v1::GenerateResponse from_router_;
  sgl::GenerateResponse to_gateway_;
  std::map<uint32_t, uint32_t> completion_tokens_;  // per index, cumulative
  std::atomic<int> done_count_{0};
};

// A unary SglangScheduler call answered by a live worker's own service.
template <typename Req, typename Resp>
using AsyncUnary = std::function<void(sgl::SglangScheduler::Stub*, grpc::ClientContext*, const Req*,
                                      Resp*, std::function<void(grpc::Status)>)>;

template <typename Req, typename Resp>
grpc::ServerUnaryReactor* ForwardToWorker(grpc::CallbackServerContext* context,
                                          std::shared_ptr<Worker> worker,
                                          const std::optional<std::string>& authorization,
                                          const Req* request, Resp* response,
                                          AsyncUnary<Req, Resp> method,
                                          std::function<void(Resp*)> adjust) {
  if (worker == nullptr) {
    return FinishUnary(context, absl::UnavailableError("rl-router: no live worker"));
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  struct Call {
    std::shared_ptr<Worker> worker;
    std::unique_ptr<sgl::SglangScheduler::Stub> stub;
    grpc::ClientContext ctx;
  };
  auto call = std::make_shared<Call>();
  call->worker = worker;
  call->stub = sgl::SglangScheduler::NewStub(worker->channel());
  if (authorization) call->ctx.AddMetadata("authorization", *authorization);
  call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  method(call->stub.get(), &call->ctx, request, response,
         [call, reactor, response, adjust](grpc::Status s) {
           if (s.ok() && adjust) adjust(response);
           reactor->Finish(s);
         });
  return reactor;
}

}  // namespace

absl::StatusOr<rl::v1::GenerateRequest> SglangToRouterRequest(const sgl::GenerateRequest& in,
                                                              const tokenizer::Tokenizer& tokenizer,
                                                              int32_t max_n) {
  RETURN_IF_ERROR(sglang::CheckSupported(in));
  ASSIGN_OR_RETURN(std::vector<int32_t> ids, sglang::ReadInputIds(in));
  const sgl::SamplingParams& sp = in.sampling_params();
  ASSIGN_OR_RETURN(sglang::Sampling s, sglang::ReadSampling(sp, max_n));
  ASSIGN_OR_RETURN(std::optional<uint64_t> seed, sglang::ReadSeed(in));
  ASSIGN_OR_RETURN(std::optional<std::string> episode,
                   sglang::EpisodeFromRequestId(in.request_id()));
  // The router adds its template prefix (BOS) to every text: one the gateway put in is left
  // out of the text, so it is not doubled.
  const absl::Span<const int32_t> prefix = tokenizer.template_prefix_ids();
  size_t skip = 0;
  if (!prefix.empty() && ids.size() >= prefix.size() &&
      std::equal(prefix.begin(), prefix.end(), ids.begin())) {
    skip = prefix.size();
  }
  ASSIGN_OR_RETURN(std::string text,
                   tokenizer.Decode(absl::MakeConstSpan(ids).subspan(skip), false));
  if (text.empty()) {
    return absl::InvalidArgumentError(
        "tokenized.input_ids: the prompt decodes to no text (the router serves text prompts)");
  }
  rl::v1::GenerateRequest out;
  out.set_request_id(in.request_id());
  out.set_text(std::move(text));
  rl::v1::SamplingParams* o = out.mutable_sampling_params();
  if (sp.has_max_new_tokens()) {
    o->set_max_new_tokens(static_cast<int32_t>(
        std::min<uint32_t>(sp.max_new_tokens(), std::numeric_limits<int32_t>::max())));
  } else {
    o->set_max_new_tokens(sglang::kDefaultMaxNewTokens);
  }
  o->set_min_new_tokens(static_cast<int32_t>(
      std::min<uint32_t>(sp.min_new_tokens(), std::numeric_limits<int32_t>::max())));
  o->set_temperature(static_cast<float>(s.temperature));
  o->set_top_p(static_cast<float>(s.top_p));
  o->set_top_k(s.top_k);
  o->set_min_p(static_cast<float>(s.min_p));
  o->set_repetition_penalty(static_cast<float>(s.repetition_penalty));
  o->set_frequency_penalty(static_cast<float>(s.frequency_penalty));
  o->set_presence_penalty(static_cast<float>(s.presence_penalty));
  o->set_ignore_eos(s.ignore_eos);
  o->set_n(s.n);
  o->mutable_stop_token_ids()->Assign(s.stop_token_ids.begin(), s.stop_token_ids.end());
  for (const std::string& stop : sp.stop()) o->add_stop(stop);
  o->set_include_stop_str_in_output(sp.no_stop_trim());
  if (seed) o->set_seed(*seed);
  if (in.return_logprob()) {
    out.set_return_logprob(true);
    out.set_top_logprobs_num(in.top_logprobs_num());
    if (in.logprob_start_len() >= 0) {
      return absl::InvalidArgumentError(
          "logprob_start_len: input logprobs are not served through rl-router's SGLang protocol "
          "(the router's prompt tokens need not be the gateway's); set -1, or ask the router's "
          "Router.Generate");
    }
  }
  out.set_stream(in.stream());
  if (episode) out.set_episode_id(*std::move(episode));
  return out;
}

RouterSglangService::RouterSglangService(WorkerPool* pool, RouterService* router_service,
                                         const tokenizer::Tokenizer* tokenizer,
                                         std::string tokenizer_dir,
                                         std::optional<std::string> authorization,
                                         const BearerAuth* auth, int32_t max_n,
                                         const DrainGate* drain)
    : pool_(pool),
      router_service_(router_service),
      tokenizer_(tokenizer),
      tokenizer_dir_(std::move(tokenizer_dir)),
      authorization_(std::move(authorization)),
      auth_(auth),
      max_n_(max_n),
      drain_(drain),
      tokenizer_bundle_(tokenizer_dir_) {}

void RouterSglangService::Connect(std::shared_ptr<grpc::Channel> router) {
  router_owner_ = rl::v1::Router::NewStub(std::move(router));
  router_.store(router_owner_.get());
}

std::shared_ptr<Worker> RouterSglangService::AnyLiveWorker() const {
  std::vector<std::shared_ptr<Worker>> live = pool_->LiveWorkers();
  if (live.empty()) return nullptr;
  return live.front();
}

grpc::ServerWriteReactor<sgl::GenerateResponse>* RouterSglangService::Generate(
    grpc::CallbackServerContext* context, const sgl::GenerateRequest* request) {
  absl::StatusOr<rl::v1::GenerateRequest> out;
  rl::v1::Router::Stub* const router = router_.load();
  if (absl::Status s = auth_->Check(*context); !s.ok()) {
    out = s;
  } else if (router == nullptr) {
    out = absl::UnavailableError("rl-router is starting");
  } else {
    out = SglangToRouterRequest(*request, *tokenizer_, max_n_);
  }
  if (!out.ok()) {
    // Refused before any router call: only the server side finishes.
    class Refuse final : public grpc::ServerWriteReactor<sgl::GenerateResponse> {
     public:
      explicit Refuse(const absl::Status& s) { Finish(ToGrpcStatus(s)); }
      void OnDone() override { delete this; }
    };
    return new Refuse(out.status());
  }
  return new BridgeReactor(router, authorization_, *request, *std::move(out));
}

grpc::ServerUnaryReactor* RouterSglangService::HealthCheck(grpc::CallbackServerContext* context,
                                                           const sgl::HealthCheckRequest*,
                                                           sgl::HealthCheckResponse* response) {
  if (absl::Status s = auth_->Check(*context); !s.ok()) return FinishUnary(context, s);
  SglangReadiness r = SglangReadinessOf(*pool_, drain_ != nullptr && drain_->draining());
  response->set_healthy(r.ready);
  response->set_message(std::move(r.message));
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* RouterSglangService::Abort(grpc::CallbackServerContext* context,
                                                     const sgl::AbortRequest* request,
                                                     sgl::AbortResponse* response) {
  if (absl::Status s = auth_->Check(*context); !s.ok()) return FinishUnary(context, s);
  if (request->request_id().empty()) {
    return FinishUnary(context, absl::InvalidArgumentError("request_id: must not be empty"));
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  rl::v1::AbortRequest abort;
  abort.set_request_id(request->request_id());
  router_service_->AbortRequests(
      abort, authorization_,
      [reactor, response, id = request->request_id()](absl::StatusOr<int32_t> n) {
        if (!n.ok() && n.status().code() != absl::StatusCode::kNotFound) {
          reactor->Finish(ToGrpcStatus(n.status()));
          return;
        }
        const bool aborted = n.ok() && *n > 0;
        response->set_success(aborted);
        response->set_message(absl::StrCat("request ", id, aborted ? " aborted" : " not found"));
        reactor->Finish(grpc::Status::OK);
      });
  return reactor;
}

grpc::ServerUnaryReactor* RouterSglangService::GetModelInfo(grpc::CallbackServerContext* context,
                                                            const sgl::GetModelInfoRequest* request,
                                                            sgl::GetModelInfoResponse* response) {
  if (absl::Status s = auth_->Check(*context); !s.ok()) return FinishUnary(context, s);
  return ForwardToWorker<sgl::GetModelInfoRequest, sgl::GetModelInfoResponse>(
      context, AnyLiveWorker(), authorization_, request, response,
      [](sgl::SglangScheduler::Stub* stub, grpc::ClientContext* ctx,
         const sgl::GetModelInfoRequest* req, sgl::GetModelInfoResponse* resp,
         std::function<void(grpc::Status)> done) {
        stub->async()->GetModelInfo(ctx, req, resp, std::move(done));
      },
      [dir = tokenizer_dir_](sgl::GetModelInfoResponse* r) { r->set_tokenizer_path(dir); });
}

grpc::ServerUnaryReactor* RouterSglangService::GetServerInfo(
    grpc::CallbackServerContext* context, const sgl::GetServerInfoRequest* request,
    sgl::GetServerInfoResponse* response) {
  if (absl::Status s = auth_->Check(*context); !s.ok()) return FinishUnary(context, s);
  return ForwardToWorker<sgl::GetServerInfoRequest, sgl::GetServerInfoResponse>(
      context, AnyLiveWorker(), authorization_, request, response,
      [](sgl::SglangScheduler::Stub* stub, grpc::ClientContext* ctx,
         const sgl::GetServerInfoRequest* req, sgl::GetServerInfoResponse* resp,
         std::function<void(grpc::Status)> done) {
        stub->async()->GetServerInfo(ctx, req, resp, std::move(done));
      },
      [dir = tokenizer_dir_](sgl::GetServerInfoResponse* r) {
        (*r->mutable_server_args()->mutable_fields())["tokenizer_path"].set_string_value(dir);
      });
}

grpc::ServerUnaryReactor* RouterSglangService::GetLoads(grpc::CallbackServerContext* context,
                                                        const sgl::GetLoadsRequest* request,
                                                        sgl::GetLoadsResponse* response) {
  if (absl::Status s = auth_->Check(*context); !s.ok()) return FinishUnary(context, s);
  return ForwardToWorker<sgl::GetLoadsRequest, sgl::GetLoadsResponse>(
      context, AnyLiveWorker(), authorization_, request, response,
      [](sgl::SglangScheduler::Stub* stub, grpc::ClientContext* ctx,
         const sgl::GetLoadsRequest* req, sgl::GetLoadsResponse* resp,
         std::function<void(grpc::Status)> done) {
        stub->async()->GetLoads(ctx, req, resp, std::move(done));
      },
      nullptr);
}

grpc::ServerWriteReactor<common::GetTokenizerChunk>* RouterSglangService::GetTokenizer(
    grpc::CallbackServerContext* context, const common::GetTokenizerRequest*) {
  if (absl::Status s = auth_->Check(*context); !s.ok()) return sglang::NewTokenizerReactor(s);
  return sglang::NewTokenizerReactor(tokenizer_bundle_.Get());
}

}  // namespace rl::router
