#include "services/worker/sglang/sglang_service.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status.h"
#include "google/protobuf/util/time_util.h"
#include "services/worker/engine_stream_reactor.h"
#include "services/worker/sglang/kv_events_reactor.h"
#include "services/worker/sglang/sglang_convert.h"
#include "spdlog/spdlog.h"

namespace rl::worker {
namespace {

namespace common = ::smg::grpc::common;

constexpr size_t kMaxPendingFlushes = 64;
constexpr absl::Duration kFlushPoll = absl::Milliseconds(20);
constexpr int64_t kKeyWarningIntervalS = 60;

double UnixSeconds(std::chrono::system_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

grpc::ServerUnaryReactor* Unimplemented(grpc::CallbackServerContext* context, const char* what) {
  return FinishUnary(context, absl::UnimplementedError(absl::StrCat(
                                  what, " is not supported by this worker (rlfleet)")));
}

// Submit errors as the gateway should read them: a sleeping worker is UNAVAILABLE (503,
// retried on another worker), the rest keeps its code.
absl::Status ForGateway(absl::Status s) {
  if (s.code() == absl::StatusCode::kFailedPrecondition) {
    return absl::UnavailableError(s.message());
  }
  return s;
}

double KvUsage(const engine::ServerInfo& info) {
  return info.scheduler.total_kv_tokens > 0
             ? 1.0 - static_cast<double>(info.scheduler.available_kv_tokens) /
                         info.scheduler.total_kv_tokens
             : 0.0;
}

// One SglangScheduler Generate call: translates the request and the engine's chunks; lifetime
// and the write queue are EngineStreamReactor's (shared with rl.v1.Worker's Generate).
class GenerateReactor final : public EngineStreamReactor<sgl::GenerateResponse> {
 public:
  // `auth`: the key check's outcome, done by the service.
  GenerateReactor(GenerateHost* host, PauseGuard* pause_guard, const absl::Status& auth,
                  const sgl::GenerateRequest& request)
      : EngineStreamReactor(host), pause_guard_(pause_guard) {
    absl::Status s = Start(auth, request);
    if (!s.ok()) FailStart(s);
  }
  ~GenerateReactor() override {
    if (tracked_) pause_guard_->Untrack(pause_token_);
  }

 private:
  absl::Status Start(const absl::Status& auth, const sgl::GenerateRequest& request) {
    RETURN_IF_ERROR(auth);
    id_ = request.request_id().empty() ? server_->NextRequestId() : request.request_id();
    stream_ = request.stream();
    ASSIGN_OR_RETURN(request_, SglangToEngineRequest(request, id_, server_->engine().limits()));
    RETURN_IF_ERROR(pause_guard_->CheckAdmission());
    const int n = request_.sampling.n;
    ExpectCompletions(n);
    completion_tokens_.assign(n, 0);
    // Tracked before the engine has it, so a pause that outlasts the bound ends it too.
    pause_token_ = pause_guard_->Track(id_);
    tracked_ = true;
    return ForGateway(server_->Submit(request_, StreamThreadCallbacks(stream_)));
  }

  // Stream thread.
  void OnEngineOutput(const engine::OutputChunk& chunk) override {
    if (chunk.token_ids.empty()) return;
    completion_tokens_[chunk.index] += static_cast<int>(chunk.token_ids.size());
    sgl::GenerateResponse msg;
    msg.set_request_id(id_);
    sgl::GenerateStreamChunk* c = msg.mutable_chunk();
    c->mutable_token_ids()->Assign(chunk.token_ids.begin(), chunk.token_ids.end());
    c->set_prompt_tokens(static_cast<uint32_t>(request_.input_ids.size()));
    c->set_completion_tokens(completion_tokens_[chunk.index]);
    c->set_index(chunk.index);
    if (request_.return_logprob) {
      AppendOutputLogprobs(chunk.logprobs, request_.top_logprobs_num > 0,
                           c->mutable_output_logprobs());
    }
    Enqueue(std::move(msg));
  }

  // Stream thread.
  void OnEngineFinish(engine::GenerateResult result) override {
    server_->RecordFinished(result);
    if (result.finish_reason.kind == engine::FinishKind::kAbort) {
      // The engine's own abort (pause with abort, shutdown, or the client's Abort): the call
      // ends with a status the gateway retries, never an empty "success".
      CompleteOne({},
                  absl::UnavailableError(absl::StrCat(
                      "request ", id_, " aborted by the worker: ", result.finish_reason.message)));
      return;
    }
    sgl::GenerateResponse fin;
    fin.set_request_id(id_);
    FillComplete(result, request_, stream_, fin.mutable_complete());
    std::vector<sgl::GenerateResponse> msgs;
    msgs.push_back(std::move(fin));
    CompleteOne(std::move(msgs));
  }

  PauseGuard* const pause_guard_;
  bool tracked_ = false;
  uint64_t pause_token_ = 0;
  bool stream_ = false;
  engine::GenerateRequest request_;     // as submitted (input ids, logprob options)
  std::vector<int> completion_tokens_;  // per completion; stream thread only
};

}  // namespace

SglangService::SglangService(GenerateHost& host, WorkerControl& control, const WorkerConfig& config,
                             BoundedExecutor& executor, PauseGuard& pause_guard,
                             const BearerAuth& data_auth, const BearerAuth& admin_auth)
    : host_(host),
      control_(control),
      config_(config),
      pause_guard_(pause_guard),
      executor_(executor),
      data_auth_(data_auth),
      admin_auth_(admin_auth),
      start_time_(std::chrono::system_clock::now()),
      tokenizer_bundle_(config.model_path),
      flushes_([this] { return control_.FlushCache().status(); }, &executor, kMaxPendingFlushes,
               kFlushPoll) {}

void SglangService::Shutdown() {
  flushes_.Shutdown();
  host_.engine().CloseKvEvents();  // subscriptions end UNAVAILABLE instead of holding the drain
}

absl::Status SglangService::CheckData(const grpc::CallbackServerContext& context,
                                      const char* method) {
  absl::Status s = data_auth_.Check(context);
  if (!s.ok()) WarnMissingKey(s, method);
  return s;
}

absl::Status SglangService::CheckAdmin(const grpc::CallbackServerContext& context,
                                       const char* method) {
  absl::Status s = admin_auth_.Check(context);
  if (!s.ok()) WarnMissingKey(s, method);
  return s;
}

void SglangService::WarnMissingKey(const absl::Status& s, const char* method) {
  if (s.code() != absl::StatusCode::kUnauthenticated) return;  // a wrong key: the client's
  const int64_t now_s = absl::ToUnixSeconds(absl::Now());
  int64_t last = last_key_warning_s_.load();
  if (now_s - last < kKeyWarningIntervalS ||
      !last_key_warning_s_.compare_exchange_strong(last, now_s)) {
    return;
  }
  spdlog::warn(
      "SglangScheduler.{} without an API key refused. The SMG gateway sends no key on gRPC (it "
      "then reports \"No worker available\"): point it at the key-free --sglang-port listener",
      method);
}

const std::string& SglangService::served_model_name() const {
  return config_.model_alias.empty() ? config_.model_path : config_.model_alias;
}

grpc::ServerWriteReactor<sgl::GenerateResponse>* SglangService::Generate(
    grpc::CallbackServerContext* context, const sgl::GenerateRequest* request) {
  last_receive_unix_s_.store(UnixSeconds(std::chrono::system_clock::now()));
  return new GenerateReactor(&host_, &pause_guard_, CheckData(*context, "Generate"), *request);
}

grpc::ServerUnaryReactor* SglangService::Embed(grpc::CallbackServerContext* context,
                                               const sgl::EmbedRequest*, sgl::EmbedResponse*) {
  return Unimplemented(context, "Embed (embeddings)");
}

grpc::ServerUnaryReactor* SglangService::HealthCheck(grpc::CallbackServerContext* context,
                                                     const sgl::HealthCheckRequest*,
                                                     sgl::HealthCheckResponse* response) {
  if (absl::Status s = CheckData(*context, "HealthCheck"); !s.ok()) return FinishUnary(context, s);
  const ServingState state = control_.serving_state();
  response->set_healthy(state == ServingState::kServing);
  response->set_message(ServingStateName(state));
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* SglangService::Abort(grpc::CallbackServerContext* context,
                                               const sgl::AbortRequest* request,
                                               sgl::AbortResponse* response) {
  if (absl::Status s = CheckData(*context, "Abort"); !s.ok()) return FinishUnary(context, s);
  if (request->request_id().empty()) {
    return FinishUnary(context, absl::InvalidArgumentError("request_id: must not be empty"));
  }
  const std::string reason =
      request->reason().empty() ? "aborted by Abort" : absl::StrCat("aborted: ", request->reason());
  absl::StatusOr<int32_t> n = host_.engine().Abort(request->request_id(), reason);
  if (!n.ok()) return FinishUnary(context, n.status());
  response->set_success(*n > 0);
  response->set_message(
      absl::StrCat("request ", request->request_id(), *n > 0 ? " aborted" : " not found"));
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* SglangService::GetModelInfo(grpc::CallbackServerContext* context,
                                                      const sgl::GetModelInfoRequest*,
                                                      sgl::GetModelInfoResponse* response) {
  if (absl::Status s = CheckData(*context, "GetModelInfo"); !s.ok()) {
    return FinishUnary(context, s);
  }
  const model_io::ModelConfig& c = host_.engine().model_config();
  const engine::EngineLimits& limits = host_.engine().limits();
  const std::string& model_path = config_.model_path;
  response->set_model_path(model_path);
  if (host_.tokenizer() != nullptr) response->set_tokenizer_path(model_path);
  response->set_is_generation(true);
  response->set_weight_version(absl::StrCat(host_.weight_version()));
  response->set_served_model_name(served_model_name());
  response->set_max_context_length(static_cast<int32_t>(limits.max_context_len));
  response->set_vocab_size(static_cast<int32_t>(c.vocab_size));
  response->set_supports_vision(false);
  response->set_model_type(c.model_type);
  for (int32_t id : c.eos_token_ids) response->add_eos_token_ids(id);
  response->set_pad_token_id(c.eos_token_ids.empty() ? 0 : c.eos_token_ids.front());
  response->set_bos_token_id(c.bos_token_id);
  response->set_max_req_input_len(
      static_cast<int32_t>(std::min(limits.max_context_len, limits.max_kv_tokens) - 1));
  if (!c.architecture_name.empty()) response->add_architectures(c.architecture_name);
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* SglangService::GetServerInfo(grpc::CallbackServerContext* context,
                                                       const sgl::GetServerInfoRequest*,
                                                       sgl::GetServerInfoResponse* response) {
  if (absl::Status s = CheckData(*context, "GetServerInfo"); !s.ok()) {
    return FinishUnary(context, s);
  }
  const WorkerConfig& config = config_;
  const engine::ServerInfo info = host_.engine().GetServerInfo();
  auto& args = *response->mutable_server_args()->mutable_fields();
  args["model_path"].set_string_value(config.model_path);
  args["tokenizer_path"].set_string_value(host_.tokenizer() != nullptr ? config.model_path : "");
  args["served_model_name"].set_string_value(served_model_name());
  args["host"].set_string_value(config.host);
  args["page_size"].set_number_value(config.page_size);
  args["max_running_requests"].set_number_value(info.scheduler.req_to_token_total);
  args["chunked_prefill_size"].set_number_value(config.chunked_prefill_tokens);
  args["tp_size"].set_number_value(1);
  args["dp_size"].set_number_value(1);
  args["backend"].set_string_value(control_.model_identity().backend);
  auto& sched = *response->mutable_scheduler_info()->mutable_fields();
  sched["max_total_num_tokens"].set_number_value(
      static_cast<double>(info.scheduler.total_kv_tokens));
  sched["max_running_requests"].set_number_value(info.scheduler.req_to_token_total);
  sched["max_req_input_len"].set_number_value(static_cast<double>(
      std::min(host_.engine().limits().max_context_len, host_.engine().limits().max_kv_tokens) -
      1));
  sched["is_generation"].set_bool_value(true);
  sched["weight_version"].set_number_value(static_cast<double>(info.weight_version));
  response->set_active_requests(info.scheduler.num_running + info.scheduler.num_waiting);
  response->set_is_paused(info.paused);
  response->set_last_receive_timestamp(last_receive_unix_s_.load());
  const auto now = std::chrono::system_clock::now();
  response->set_uptime_seconds(std::chrono::duration<double>(now - start_time_).count());
  response->set_sglang_version(absl::StrCat("rlfleet ", RL_VERSION));
  response->set_server_type("grpc");
  *response->mutable_start_time() = google::protobuf::util::TimeUtil::NanosecondsToTimestamp(
      std::chrono::duration_cast<std::chrono::nanoseconds>(start_time_.time_since_epoch()).count());
  response->set_max_total_num_tokens(static_cast<int32_t>(info.scheduler.total_kv_tokens));
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* SglangService::GetLoads(grpc::CallbackServerContext* context,
                                                  const sgl::GetLoadsRequest* request,
                                                  sgl::GetLoadsResponse* response) {
  if (absl::Status s = CheckData(*context, "GetLoads"); !s.ok()) return FinishUnary(context, s);
  if (request->has_dp_rank() && request->dp_rank() != 0) {
    return FinishUnary(context,
                       absl::InvalidArgumentError(absl::StrCat(
                           "dp_rank: this worker has one rank (0), got ", request->dp_rank())));
  }
  bool all = request->include().empty();
  bool memory = false, queues = false;
  for (const std::string& section : request->include()) {
    if (section == "all") {
      all = true;
    } else if (section == "memory") {
      memory = true;
    } else if (section == "queues") {
      queues = true;
    } else if (section != "core" && section != "spec" && section != "lora" && section != "disagg") {
      return FinishUnary(context, absl::InvalidArgumentError(absl::StrCat(
                                      "include: unknown section '", section,
                                      "' (core, memory, spec, lora, disagg, queues, all)")));
    }
  }
  const engine::ServerInfo info = host_.engine().GetServerInfo();
  sgl::SchedulerLoad* load = response->add_loads();
  load->set_dp_rank(0);
  load->set_num_running_reqs(info.scheduler.num_running);
  load->set_num_waiting_reqs(info.scheduler.num_waiting);
  load->set_num_total_reqs(info.scheduler.num_running + info.scheduler.num_waiting);
  load->set_num_used_tokens(
      static_cast<int32_t>(info.scheduler.total_kv_tokens - info.scheduler.available_kv_tokens));
  load->set_max_total_num_tokens(static_cast<int32_t>(info.scheduler.total_kv_tokens));
  load->set_token_usage(KvUsage(info));
  load->set_cache_hit_rate(info.scheduler.prompt_tokens > 0
                               ? static_cast<double>(info.scheduler.cache_hit_tokens) /
                                     info.scheduler.prompt_tokens
                               : 0.0);
  load->set_max_running_requests(info.scheduler.req_to_token_total);
  load->set_utilization(info.scheduler.req_to_token_total > 0
                            ? static_cast<double>(info.scheduler.num_running) /
                                  info.scheduler.req_to_token_total
                            : 0.0);
  if (all || memory) {
    load->mutable_memory()->set_token_capacity(
        static_cast<int32_t>(info.scheduler.total_kv_tokens));
  }
  if (all || queues) {
    load->mutable_queues()->set_waiting(info.scheduler.num_waiting);
    load->mutable_queues()->set_paused(info.paused ? info.scheduler.num_waiting : 0);
  }
  response->set_timestamp(google::protobuf::util::TimeUtil::ToString(
      google::protobuf::util::TimeUtil::GetCurrentTime()));
  response->set_version(absl::StrCat("rlfleet ", RL_VERSION));
  response->set_dp_rank_count(1);
  sgl::AggregateMetrics* agg = response->mutable_aggregate();
  agg->set_total_running_reqs(load->num_running_reqs());
  agg->set_total_waiting_reqs(load->num_waiting_reqs());
  agg->set_total_reqs(load->num_total_reqs());
  agg->set_avg_token_usage(load->token_usage());
  agg->set_avg_utilization(load->utilization());
  return FinishUnary(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* SglangService::FlushCache(grpc::CallbackServerContext* context,
                                                    const common::FlushCacheRequest* request,
                                                    common::FlushCacheResponse* response) {
  if (absl::Status s = CheckAdmin(*context, "FlushCache"); !s.ok()) return FinishUnary(context, s);
  const float timeout_s = request->timeout_s();
  if (!std::isfinite(timeout_s) || timeout_s < 0 || timeout_s > kMaxFlushTimeoutS) {
    return FinishUnary(
        context, absl::InvalidArgumentError(absl::StrCat("timeout_s: must be in [0, ",
                                                         kMaxFlushTimeoutS, "], got ", timeout_s)));
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // Every flush, timeout 0 included, is tried on the admin executor: the engine answers only
  // between steps, and a gRPC callback thread must not wait for that.
  flushes_.Add(absl::Now() + absl::Milliseconds(static_cast<int64_t>(std::ceil(timeout_s * 1000))),
               [reactor, response, timeout_s](const absl::Status& s) {
                 FinishFlush(reactor, response, s, timeout_s);
               });
  return reactor;
}

void SglangService::FinishFlush(grpc::ServerUnaryReactor* reactor,
                                common::FlushCacheResponse* response, const absl::Status& s,
                                float timeout_s) {
  if (s.ok()) {
    response->set_success(true);
    response->set_message("cache flushed");
    reactor->Finish(grpc::Status::OK);
  } else if (s.code() == absl::StatusCode::kFailedPrecondition) {
    // Not idle (in time): an answer, not an error, as SGLang gives it.
    response->set_success(false);
    response->set_message(absl::StrCat(
        "cache not flushed", timeout_s > 0 ? absl::StrCat(" within ", timeout_s, " s") : "", ": ",
        s.message()));
    reactor->Finish(grpc::Status::OK);
  } else {
    reactor->Finish(ToGrpcStatus(s));
  }
}

grpc::ServerUnaryReactor* SglangService::StartProfile(grpc::CallbackServerContext* context,
                                                      const common::StartProfileRequest*,
                                                      common::ProfileResponse*) {
  return Unimplemented(context, "StartProfile (profiling)");
}

grpc::ServerUnaryReactor* SglangService::StopProfile(grpc::CallbackServerContext* context,
                                                     const common::StopProfileRequest*,
                                                     common::ProfileResponse*) {
  return Unimplemented(context, "StopProfile (profiling)");
}

grpc::ServerWriteReactor<common::GetTokenizerChunk>* SglangService::GetTokenizer(
    grpc::CallbackServerContext* context, const common::GetTokenizerRequest*) {
  if (absl::Status s = CheckData(*context, "GetTokenizer"); !s.ok()) {
    return sglang::NewTokenizerReactor(s);
  }
  if (host_.tokenizer() == nullptr) {
    return sglang::NewTokenizerReactor(absl::FailedPreconditionError(
        "GetTokenizer: this worker's model folder has no tokenizer.json"));
  }
  return sglang::NewTokenizerReactor(tokenizer_bundle_.Get());
}

grpc::ServerWriteReactor<common::KvEventBatch>* SglangService::SubscribeKvEvents(
    grpc::CallbackServerContext* context, const common::SubscribeKvEventsRequest* request) {
  return StartKvEvents(&host_.engine(), &executor_, config_.page_size,
                       CheckData(*context, "SubscribeKvEvents"), *request);
}

grpc::ServerUnaryReactor* SglangService::LoadLoRAAdapter(grpc::CallbackServerContext* context,
                                                         const sgl::LoadLoRAAdapterRequest*,
                                                         sgl::LoadLoRAAdapterResponse*) {
  return Unimplemented(context, "LoadLoRAAdapter (LoRA)");
}

grpc::ServerUnaryReactor* SglangService::UnloadLoRAAdapter(grpc::CallbackServerContext* context,
                                                           const sgl::UnloadLoRAAdapterRequest*,
                                                           sgl::UnloadLoRAAdapterResponse*) {
  return Unimplemented(context, "UnloadLoRAAdapter (LoRA)");
}

grpc::ServerUnaryReactor* SglangService::ListLoadedLoRAAdapters(
    grpc::CallbackServerContext* context, const sgl::ListLoadedLoRAAdaptersRequest*,
    sgl::ListLoadedLoRAAdaptersResponse* response) {
  if (absl::Status s = CheckData(*context, "ListLoadedLoRAAdapters"); !s.ok()) {
    return FinishUnary(context, s);
  }
  response->clear_loaded_adapters();  // none: LoRA is not supported
  return FinishUnary(context, absl::OkStatus());
}

}  // namespace rl::worker
