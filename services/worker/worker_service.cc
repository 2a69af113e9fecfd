#include "services/worker/worker_service.h"

#include <deque>
#include <memory>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "common/request_limits.h"
#include "common/status.h"
#include "common/tokenizer/stream_decoder.h"
#include "common/version_constraint.h"
#include "services/worker/engine_stream_reactor.h"
#include "services/worker/proto_convert.h"

namespace rl::worker {
namespace {

// One rl.v1.Worker Generate stream: translates the request and the engine's chunks; lifetime
// and the write queue are EngineStreamReactor's.
// The router sends `rl-min-weight-version` and `rl-fleet-weight-version` (both the fleet's
// recorded version; the second is checked exactly): a worker below the first (restarted at its
// start-up weights before the router noticed) or at another version than the second (updated behind
// the router's back) refuses with UNAVAILABLE, so the router retries elsewhere, instead of serving
// other weights than the fleet's.
absl::Status CheckMinWeightVersion(const grpc::CallbackServerContext& context, int64_t version) {
  const auto& md = context.client_metadata();
  struct Header {
    const char* name;
    bool exact;
  };
  for (const auto& [header, exact] :
       {Header{"rl-min-weight-version", false}, Header{"rl-fleet-weight-version", true}}) {
    auto it = md.find(header);
    if (it == md.end()) continue;
    long long want = 0;  // NOLINT(runtime/int): SimpleAtoi has no int64_t overload on this Abseil
    if (!absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &want)) {
      return absl::InvalidArgumentError(absl::StrCat(header, ": not an integer"));
    }
    if (exact ? version == want : version >= want) continue;
    return absl::UnavailableError(
        absl::StrCat("this worker serves weight version ", version,
                     exact ? ", not the fleet's " : ", older than the fleet's ", want,
                     exact ? " (updated alone?)" : " (restarted?)", "; route elsewhere"));
  }
  return absl::OkStatus();
}

// The router sends `rl-fleet-running` while its fleet is not paused: a paused worker (paused
// directly, or by a pause the router did not record) refuses with UNAVAILABLE instead of holding
// the request until a continue the router will not send; the router retries elsewhere and its
// next health check takes this worker out of routing.
absl::Status CheckFleetRunning(const grpc::CallbackServerContext& context,
                               const engine::Engine& engine) {
  const auto& md = context.client_metadata();
  if (md.find("rl-fleet-running") == md.end()) return absl::OkStatus();
  if (!engine.published_paused()) return absl::OkStatus();
  return absl::UnavailableError(
      "this worker is paused while the router's fleet is running (paused directly, or by a "
      "pause the router did not record): route elsewhere; `continue` resumes it");
}

// The request's own min_weight_version / exact_weight_version: a worker serving another version
// refuses at the door with UNAVAILABLE (retryable: the router tries a worker that qualifies).
// The engine checks again at every version change (a request never runs on weights it does not
// accept, also when an update lands while it waits).
absl::Status CheckAcceptedVersion(const VersionConstraint& versions, int64_t version) {
  if (versions.Accepts(version)) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("this worker serves weight version ", version,
                                             "; the request accepts ", versions.Describe(),
                                             "; route elsewhere"));
}

class GenerateReactor final : public EngineStreamReactor<rl::v1::GenerateResponse> {
 public:
  GenerateReactor(GenerateHost* server, const BearerAuth* auth,
                  grpc::CallbackServerContext* context, const rl::v1::GenerateRequest& request)
      : EngineStreamReactor(server) {
    absl::Status s = Start(auth, context, request);
    if (!s.ok()) FailStart(s);
  }

 private:
  absl::Status Start(const BearerAuth* auth, grpc::CallbackServerContext* context,
                     const rl::v1::GenerateRequest& request) {
    RETURN_IF_ERROR(auth->Check(*context));
    RETURN_IF_ERROR(CheckMinWeightVersion(*context, server_->weight_version()));
    RETURN_IF_ERROR(CheckFleetRunning(*context, server_->engine()));
    // Every client-sized field is bounded before tokenization or any per-sample allocation.
    RETURN_IF_ERROR(CheckGenerateRequest(request, server_->limits(), server_->context_len()));
    RETURN_IF_ERROR(CheckAcceptedVersion(VersionConstraintOf(request), server_->weight_version()));
    std::vector<int32_t> ids;
    const tokenizer::Tokenizer* tok = server_->tokenizer();
    switch (request.prompt_case()) {
      case rl::v1::GenerateRequest::kText: {
        if (tok == nullptr) {
          return absl::InvalidArgumentError("text: this worker has no tokenizer; send input_ids");
        }
        if (request.text().empty()) return absl::InvalidArgumentError("text: must not be empty");
        auto enc = tok->Encode(request.text(), /*add_special_tokens=*/true);
        if (!enc.ok()) return Annotate(enc.status(), "text");
        ids = std::move(enc->ids);
        break;
      }
      case rl::v1::GenerateRequest::kInputIds:
        ids.assign(request.input_ids().ids().begin(), request.input_ids().ids().end());
        break;
      default:
        return absl::InvalidArgumentError("prompt: set text or input_ids");
    }
    RETURN_IF_ERROR(CheckPromptTokens(static_cast<int64_t>(ids.size()), server_->limits()));
    id_ = request.request_id().empty() ? server_->NextRequestId() : request.request_id();
    stream_ = !request.has_stream() || request.stream();
    ASSIGN_OR_RETURN(engine::GenerateRequest req, ToEngineRequest(request, id_, std::move(ids)));
    const int n = req.sampling.n;
    ExpectCompletions(n);
    if (tok != nullptr && !request.skip_detokenize()) {
      // Completion text is decoded in the prompt's context and never repeats the prompt; that
      // context is only the prompt's last few ids (DecodeContextStart), not a copy of it all.
      const size_t context_start = tokenizer::DecodeContextStart(*tok, req.input_ids);
      prompt_ids_.assign(req.input_ids.begin() + context_start, req.input_ids.end());
      // A resume streams only the new tokens' text, decoded after the earlier output; the
      // final's text holds both parts (like its output_ids).
      std::vector<int32_t> context_ids = prompt_ids_;
      context_ids.insert(context_ids.end(), req.resumed_ids.begin(), req.resumed_ids.end());
      for (int i = 0; i < n; ++i) {
        decoders_.emplace_back(*tok, /*skip_special_tokens=*/false);
        // An id outside the tokenizer (a padded embedding table) leaves the decoder unprimed;
        // the engine validates ids against the model.
        (void)decoders_.back().Prime(context_ids);
      }
    }
    engine::RequestCallbacks callbacks = StreamThreadCallbacks(stream_);
    return server_->Submit(std::move(req), std::move(callbacks));
  }

  // Stream thread.
  void OnEngineOutput(const engine::OutputChunk& chunk) override {
    rl::v1::GenerateResponse msg;
    msg.set_request_id(id_);
    msg.set_index(chunk.index);
    rl::v1::GenerateChunk* c = msg.mutable_chunk();
    c->mutable_token_ids()->Assign(chunk.token_ids.begin(), chunk.token_ids.end());
    for (const auto& lp : chunk.logprobs) ToProto(lp, c->add_logprobs());
    if (!decoders_.empty()) {
      auto delta = decoders_[chunk.index].Step(chunk.token_ids);
      if (delta.ok()) c->set_text(*std::move(delta));
    }
    Enqueue(std::move(msg));
  }

  // Stream thread.
  void OnEngineFinish(engine::GenerateResult result) override {
    server_->RecordFinished(result);
    rl::v1::GenerateResponse tail;
    bool have_tail = false;
    rl::v1::GenerateResponse fin;
    fin.set_request_id(id_);
    fin.set_index(result.index);
    rl::v1::GenerateFinal* f = fin.mutable_final();
    ToProto(result, f);
    if (!decoders_.empty()) {
      auto rest = decoders_[result.index].Flush();
      if (stream_ && rest.ok() && !rest->empty()) {
        tail.set_request_id(id_);
        tail.set_index(result.index);
        tail.mutable_chunk()->set_text(*rest);
        have_tail = true;
      }
      auto text = tokenizer::DecodeContinuation(*server_->tokenizer(), prompt_ids_,
                                                result.output_ids, /*skip_special_tokens=*/false);
      if (text.ok()) f->set_text(*std::move(text));
    }
    std::vector<rl::v1::GenerateResponse> msgs;
    if (have_tail) msgs.push_back(std::move(tail));
    msgs.push_back(std::move(fin));
    CompleteOne(std::move(msgs));
  }

  bool stream_ = true;
  // Empty with skip_detokenize (or no tokenizer): no text is decoded at all.
  std::vector<tokenizer::StreamDecoder> decoders_;  // stream thread only
  std::vector<int32_t> prompt_ids_;                 // the prompt's tail: the decoders' context
};

}  // namespace

grpc::ServerWriteReactor<rl::v1::GenerateResponse>* WorkerService::Generate(
    grpc::CallbackServerContext* context, const rl::v1::GenerateRequest* request) {
  return new GenerateReactor(server_, auth_, context, *request);
}

grpc::ServerUnaryReactor* WorkerService::Abort(grpc::CallbackServerContext* context,
                                               const rl::v1::AbortRequest* request,
                                               rl::v1::AbortResponse* response) {
  absl::StatusOr<int32_t> n = absl::InvalidArgumentError("request_id: set it or abort_all");
  if (request->abort_all()) {
    // Aborting every client's work is an admin action: the data-plane key is not enough.
    if (absl::Status s = server_->admin_auth().Check(*context); !s.ok()) {
      return FinishUnary(context, Annotate(s, "abort_all needs the admin key"));
    }
    n = server_->engine().AbortAll("aborted by Abort(abort_all)");
  } else {
    if (absl::Status s = auth_->Check(*context); !s.ok()) return FinishUnary(context, s);
    if (static_cast<int64_t>(request->request_id().size()) >
        server_->limits().max_request_id_bytes) {
      n = absl::InvalidArgumentError(absl::StrCat("request_id: ", request->request_id().size(),
                                                  " bytes is more than --max-request-id-bytes (",
                                                  server_->limits().max_request_id_bytes, ")"));
    } else if (!request->request_id().empty()) {
      n = server_->engine().Abort(request->request_id(), "aborted by Abort");
    }
  }
  if (!n.ok()) return FinishUnary(context, n.status());
  response->set_num_aborted(*n);
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* WorkerService::GetLoad(grpc::CallbackServerContext* context,
                                                 const rl::v1::GetLoadRequest*,
                                                 rl::v1::GetLoadResponse* response) {
  if (absl::Status s = auth_->Check(*context); !s.ok()) return FinishUnary(context, s);
  const engine::ServerInfo info = server_->engine().GetServerInfo();
  response->set_num_running(info.scheduler.num_running);
  response->set_num_waiting(info.scheduler.num_waiting);
  response->set_kv_usage(info.scheduler.total_kv_tokens > 0
                             ? 1.0 - static_cast<double>(info.scheduler.available_kv_tokens) /
                                         info.scheduler.total_kv_tokens
                             : 0.0);
  response->set_weight_version(info.weight_version);
  response->set_paused(info.paused);
  response->set_max_running_requests(
      info.scheduler.req_to_token_total);  // one row per running request
  response->set_instance_id(identity_.instance_id);
  if (identity_.weights_sha256) response->set_weights_sha256(identity_.weights_sha256());
  return FinishUnary(context, absl::OkStatus());
}

}  // namespace rl::worker
