#include "services/worker/worker_service.h"

#include <deque>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "common/tokenizer/stream_decoder.h"
#include "services/worker/proto_convert.h"
#include "services/worker/worker_server.h"

namespace rl::worker {
namespace {

// One Generate stream. Lifetime: two references, gRPC's (dropped in OnDone) and the engine's
// (dropped after the last completion's on_finish); the object deletes itself when both are
// gone, so engine callbacks never touch a freed reactor. StartWrite / Finish are issued
// outside the mutex, with at most one write in flight.
class GenerateReactor final : public grpc::ServerWriteReactor<rl::v1::GenerateResponse> {
 public:
  GenerateReactor(WorkerServer* server, const BearerAuth* auth, grpc::CallbackServerContext* context,
                  const rl::v1::GenerateRequest& request)
      : server_(server) {
    absl::Status s = Start(auth, context, request);
    if (!s.ok()) {
      {
        absl::MutexLock lock(&mu_);
        engine_ref_ = false;
        finished_ = true;
      }
      Finish(ToGrpcStatus(s));
    }
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) broken_ = true;
    }
    if (!ok) server_->engine().AbortAsync(id_, "client stream closed");
    Pump();
  }

  void OnCancel() override {
    server_->engine().AbortAsync(id_, "client cancelled");
    {
      absl::MutexLock lock(&mu_);
      broken_ = true;
    }
    Pump();
  }

  void OnDone() override {
    bool last;
    {
      absl::MutexLock lock(&mu_);
      grpc_ref_ = false;
      last = !engine_ref_;
    }
    if (last) delete this;
  }

 private:
  absl::Status Start(const BearerAuth* auth, grpc::CallbackServerContext* context,
                     const rl::v1::GenerateRequest& request) {
    RETURN_IF_ERROR(auth->Check(*context));
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
    id_ = request.request_id().empty() ? server_->NextRequestId() : request.request_id();
    stream_ = !request.has_stream() || request.stream();
    ASSIGN_OR_RETURN(engine::GenerateRequest req, ToEngineRequest(request, id_, std::move(ids)));
    const int n = req.sampling.n;
    remaining_ = n;
    if (tok != nullptr) {
      for (int i = 0; i < n; ++i) decoders_.emplace_back(*tok, /*skip_special_tokens=*/false);
    }
    engine::RequestCallbacks callbacks;
    callbacks.on_output = [this](const engine::OutputChunk& chunk) { OnOutput(chunk); };
    callbacks.on_finish = [this](engine::GenerateResult result) { OnFinish(std::move(result)); };
    return server_->Submit(std::move(req), std::move(callbacks));
  }

  // Engine thread.
  void OnOutput(const engine::OutputChunk& chunk) {
    if (!stream_) return;
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
    {
      absl::MutexLock lock(&mu_);
      queue_.push_back(std::move(msg));
    }
    Pump();
  }

  // Engine thread.
  void OnFinish(engine::GenerateResult result) {
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
      auto text = server_->tokenizer()->Decode(result.output_ids, /*skip_special_tokens=*/false);
      if (text.ok()) f->set_text(*std::move(text));
    }
    bool last;
    {
      absl::MutexLock lock(&mu_);
      if (have_tail) queue_.push_back(std::move(tail));
      queue_.push_back(std::move(fin));
      last = --remaining_ == 0;
    }
    Pump();
    if (last) {
      bool del;
      {
        absl::MutexLock lock(&mu_);
        engine_ref_ = false;
        del = !grpc_ref_;
      }
      if (del) delete this;
    }
  }

  // Starts the next write, or finishes the stream when everything is written (or the client
  // is gone). Safe from any thread while a reference is held.
  void Pump() {
    enum { kNothing, kWrite, kFinishOk, kFinishCancelled } action = kNothing;
    {
      absl::MutexLock lock(&mu_);
      if (finished_ || writing_) return;
      if (broken_) {
        action = kFinishCancelled;
        finished_ = true;
      } else if (!queue_.empty()) {
        current_ = std::move(queue_.front());
        queue_.pop_front();
        writing_ = true;
        action = kWrite;
      } else if (remaining_ == 0) {
        action = kFinishOk;
        finished_ = true;
      }
    }
    switch (action) {
      case kWrite:
        StartWrite(&current_);
        break;
      case kFinishOk:
        Finish(grpc::Status::OK);
        break;
      case kFinishCancelled:
        Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled"));
        break;
      case kNothing:
        break;
    }
  }

  WorkerServer* server_;
  std::string id_;
  bool stream_ = true;
  std::vector<tokenizer::StreamDecoder> decoders_;  // engine thread only

  absl::Mutex mu_;
  std::deque<rl::v1::GenerateResponse> queue_ ABSL_GUARDED_BY(mu_);
  rl::v1::GenerateResponse current_;  // the message being written
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  int remaining_ ABSL_GUARDED_BY(mu_) = 0;
  bool grpc_ref_ ABSL_GUARDED_BY(mu_) = true;
  bool engine_ref_ ABSL_GUARDED_BY(mu_) = true;
};

}  // namespace

grpc::ServerWriteReactor<rl::v1::GenerateResponse>* WorkerService::Generate(
    grpc::CallbackServerContext* context, const rl::v1::GenerateRequest* request) {
  return new GenerateReactor(server_, auth_, context, *request);
}

grpc::ServerUnaryReactor* WorkerService::Abort(grpc::CallbackServerContext* context,
                                               const rl::v1::AbortRequest* request,
                                               rl::v1::AbortResponse* response) {
  if (absl::Status s = auth_->Check(*context); !s.ok()) return FinishUnary(context, s);
  absl::StatusOr<int32_t> n = absl::InvalidArgumentError("request_id: set it or abort_all");
  if (request->abort_all()) {
    n = server_->engine().AbortAll("aborted by Abort(abort_all)");
  } else if (!request->request_id().empty()) {
    n = server_->engine().Abort(request->request_id(), "aborted by Abort");
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
  response->set_num_running(info.num_running);
  response->set_num_waiting(info.num_waiting);
  response->set_kv_usage(info.kv_tokens_total > 0
                             ? 1.0 - static_cast<double>(info.kv_tokens_available) /
                                         info.kv_tokens_total
                             : 0.0);
  response->set_weight_version(info.weight_version);
  response->set_paused(info.paused);
  return FinishUnary(context, absl::OkStatus());
}

}  // namespace rl::worker
