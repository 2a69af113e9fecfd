#include "services/worker/worker_server.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "common/tokenizer/stream_decoder.h"
#include "common/tokenizer/vocab_coverage.h"
#include "services/worker/admin_service.h"
#include "services/worker/model/cpu_model_runner.h"
#include "services/worker/model/cuda_runner.h"
#include "services/worker/proto_convert.h"
#include "services/worker/sglang/sglang_service.h"
#include "services/worker/sleepable_runner.h"
#include "services/worker/worker_service.h"
#include "spdlog/spdlog.h"

namespace rl::worker {
namespace {

// The engine's view of the tokenizer, for stop strings: the completion's text as the client
// sees it (decoded in the prompt's context, a character split across tokens held back).
class TokenizerTextDecoder final : public engine::TextDecoder {
 public:
  explicit TokenizerTextDecoder(const tokenizer::Tokenizer* tok) : tok_(tok) {}
  std::string Decode(absl::Span<const int32_t> ids) const override {
    auto text = tok_->Decode(ids, /*skip_special_tokens=*/false);
    return text.ok() ? *std::move(text) : std::string();
  }
  std::unique_ptr<Stream> NewStream(absl::Span<const int32_t> prompt) const override {
    auto stream = std::make_unique<TokenStream>(*tok_);
    const size_t start = tokenizer::DecodeContextStart(*tok_, prompt);
    // An id outside the tokenizer leaves the stream unprimed (the engine validated the ids
    // against the model, whose embedding table may be padded).
    (void)stream->decoder.Prime(prompt.subspan(start));
    return stream;
  }

 private:
  struct TokenStream final : Stream {
    explicit TokenStream(const tokenizer::Tokenizer& tok)
        : decoder(tok, /*skip_special_tokens=*/false) {}
    std::string Step(int32_t id) override {
      auto text = decoder.Step(id);
      return text.ok() ? *std::move(text) : std::string();
    }
    tokenizer::StreamDecoder decoder;
  };
  const tokenizer::Tokenizer* tok_;
};

int64_t NumParameters(const model_io::ModelConfig& c) {
  const int64_t q = c.num_attention_heads * c.head_dim;
  const int64_t kv = c.num_key_value_heads * c.head_dim;
  int64_t per_layer = 2 * c.hidden_size + c.hidden_size * (q + 2 * kv) + q * c.hidden_size +
                      3 * c.hidden_size * c.intermediate_size;
  if (c.attention_bias) per_layer += q + 2 * kv;
  if (c.qk_norm) per_layer += 2 * c.head_dim;
  int64_t total = c.num_hidden_layers * per_layer + c.vocab_size * c.hidden_size + c.hidden_size;
  if (!c.tie_word_embeddings) total += c.vocab_size * c.hidden_size;
  return total;
}

int64_t MicrosSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                               start)
      .count();
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Start(const WorkerConfig& flags) {
  RETURN_IF_ERROR(Validate(flags));
  WorkerConfig config = flags;
  if (const std::string line = ApplyOnPolicyTarget(&config); !line.empty()) {
    spdlog::info("{}", line);
  }
  std::unique_ptr<WorkerServer> s(new WorkerServer());
  s->config_ = config;
  ASSIGN_OR_RETURN(s->model_config_, model_io::LoadModelConfig(config.model_path));
  s->model_identity_.model_path = config.model_path;
  {
    std::ifstream in(config.model_path + "/config.json");
    std::stringstream text;
    text << in.rdbuf();
    s->model_identity_.config_json = text.str();
  }
  s->model_identity_.num_parameters = NumParameters(s->model_config_);
  const int num_devices = model::NumCudaDevices();
  if (config.backend == "cuda") {
    if (!model::CudaBackendBuilt()) {
      return absl::FailedPreconditionError(
          "--backend cuda: this build has no CUDA backend (nvcc was not found when it was "
          "configured); use --backend cpu or auto");
    }
    if (num_devices == 0) {
      return absl::FailedPreconditionError(
          "--backend cuda: no CUDA device is visible to this process; use --backend cpu or auto");
    }
  }
  const bool use_cuda = config.backend == "cuda" || (config.backend == "auto" && num_devices > 0);
  s->model_identity_.backend = use_cuda ? "cuda" : "cpu";
  if (use_cuda) {
    absl::StatusOr<std::string> device = model::DescribeCudaDevice(config.cuda_device);
    spdlog::info("backend cuda{} on device {}: {}", config.backend == "auto" ? " (auto)" : "",
                 config.cuda_device, device.ok() ? *device : device.status().ToString());
  } else {
    spdlog::info("backend cpu{}", config.backend != "auto"    ? ""
                                  : model::CudaBackendBuilt() ? " (auto: no CUDA device visible)"
                                                              : " (auto: built without CUDA)");
  }

  if (std::filesystem::exists(config.model_path + "/tokenizer.json")) {
    ASSIGN_OR_RETURN(s->tokenizer_, tokenizer::Tokenizer::FromDir(config.model_path));
    RETURN_IF_ERROR(tokenizer::CheckModelVocabulary(*s->tokenizer_, s->model_config_.vocab_size,
                                                    config.model_path));
  } else {
    spdlog::warn("{} has no tokenizer.json: text prompts and stop strings are refused",
                 config.model_path);
  }

  model::RunnerOptions runner_options;
  runner_options.model_dir = config.model_path;
  runner_options.page_size = config.page_size;
  // 0 = auto: a fixed 0.25 GiB on the CPU; the CUDA runner sizes it from free device memory.
  const double kv_gb = config.kv_cache_gb > 0 ? config.kv_cache_gb : (use_cuda ? 0.0 : 0.25);
  runner_options.kv_cache_bytes = static_cast<int64_t>(kv_gb * (1 << 30));
  runner_options.num_threads = config.num_threads;
  runner_options.cuda_device = config.cuda_device;
  runner_options.gpu_memory_fraction = config.gpu_memory_fraction;
  runner_options.batch_invariant = config.batch_invariant;
  runner_options.fp32_lm_head = config.fp32_lm_head;
  runner_options.fp32_router = config.fp32_router;
  runner_options.cuda_graphs = !config.disable_cuda_graph;
  runner_options.reserve_update_buffers = !config.no_update_buffers;
  runner_options.cpu_bf16_products = config.cpu_bf16_products;
  runner_options.kv_cache_dtype = config.kv_cache_dtype;
  const auto make_runner = use_cuda ? model::CreateCudaModelRunner : model::CreateCpuModelRunner;
  const std::string spill_dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("rl-worker-spill-", getpid()))
          .string();
  ASSIGN_OR_RETURN(
      std::unique_ptr<SleepableRunner> runner,
      SleepableRunner::Create([runner_options, make_runner] { return make_runner(runner_options); },
                              spill_dir, config.model_path));
  s->runner_ = runner.get();
  s->stream_executor_ = std::make_unique<BoundedExecutor>("rl-stream", 1, kMaxStreamTasks);
  engine::EngineOptions engine_options;
  engine_options.max_running_requests = config.max_running_requests;
  engine_options.chunked_prefill_size = config.chunked_prefill_tokens;
  engine_options.initial_weight_version = config.weight_version;
  engine_options.enable_return_routed_experts = config.enable_return_routed_experts;
  std::unique_ptr<engine::TextDecoder> decoder;
  if (s->tokenizer_) decoder = std::make_unique<TokenizerTextDecoder>(s->tokenizer_.get());
  ASSIGN_OR_RETURN(s->engine_,
                   engine::Engine::Create(std::move(runner), engine_options, std::move(decoder)));
  spdlog::info("model {}: {} layers, hidden {}, vocab {}, {} KV tokens", config.model_path,
               s->model_config_.num_hidden_layers, s->model_config_.hidden_size,
               s->model_config_.vocab_size, s->engine_->GetServerInfo().kv_tokens_total);

  WorkerServer* raw = s.get();
  s->metrics_ = std::make_unique<WorkerMetrics>(s->engine_.get(), [raw] { return raw->asleep(); });
  WeightUpdateController::Deps updates;
  updates.engine = s->engine_.get();
  updates.model_config = s->model_config_;
  updates.limits = config.limits;
  updates.cuda_device = config.cuda_device;
  updates.metrics = s->metrics_.get();
  updates.asleep = [raw] { return raw->asleep(); };
  updates.updating_changed = [raw] { raw->RefreshHealth(); };
  ASSIGN_OR_RETURN(s->updates_, WeightUpdateController::Create(std::move(updates)));
  for (const model::TensorInfo& t : s->updates_->served_weights()) {
    s->weight_shapes_[t.name] = t.shape;
  }
  s->admin_auth_ = std::make_unique<BearerAuth>(config.admin_api_key);
  s->data_auth_ = std::make_unique<BearerAuth>(config.api_key);
  s->worker_service_ = std::make_unique<WorkerService>(s.get(), s->data_auth_.get());
  s->admin_service_ =
      std::make_unique<AdminService>(s.get(), s->updates_.get(), s->admin_auth_.get());
  s->sglang_service_ =
      std::make_unique<SglangService>(s.get(), s->data_auth_.get(), s->admin_auth_.get());
  ServerOptions options;
  options.host = config.host;
  options.port = config.port;
  // A tensor chunk plus its header; generate requests are far smaller.
  options.max_message_bytes = static_cast<int>(
      std::max<int64_t>(config.limits.max_tensor_chunk_bytes + (1 << 20), 64 << 20));
  ASSIGN_OR_RETURN(s->grpc_,
                   GrpcServer::Start(options, {s->worker_service_.get(), s->admin_service_.get(),
                                                s->sglang_service_.get()}));
  if (config.metrics_port >= 0) {
    ASSIGN_OR_RETURN(s->metrics_http_,
                     MetricsHttpServer::Start(config.host, config.metrics_port, s->metrics_->registry()));
  }
  return s;
}

WorkerServer::~WorkerServer() { Shutdown(); }

void WorkerServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  // Abort generations first so streams end with a final message instead of hanging the drain.
  if (engine_) (void)engine_->AbortAll("worker shutting down");
  if (sglang_service_) sglang_service_->Shutdown();
  if (grpc_) grpc_->Shutdown();
  if (metrics_http_) metrics_http_->Stop();
  if (updates_) updates_->Shutdown();  // closes the groups: posted receives fail now
  // Nothing submits any more: end what arrived meanwhile, then let the stream thread deliver
  // every final (its tasks may still call into the engine and the metrics) and join it, before
  // the engine goes. A callback after that (none is expected) runs inline.
  if (engine_) (void)engine_->AbortAll("worker shutting down");
  stream_executor_.reset();
  engine_.reset();
}

void WorkerServer::RecordFinished(const engine::GenerateResult& r) {
  metrics_->RecordFinished(r);
}

void WorkerServer::RunOnStreamThread(absl::AnyInvocable<void() &&> task) {
  if (stream_executor_ == nullptr) {  // shut down (see Shutdown)
    std::move(task)();
    return;
  }
  // Submit moves from `task` only when it accepts it.
  while (!stream_executor_->Submit(std::move(task))) absl::SleepFor(absl::Microseconds(100));
}

std::string WorkerServer::NextRequestId() { return NewServerRequestId(); }

absl::Status WorkerServer::Submit(engine::GenerateRequest request,
                                  engine::RequestCallbacks callbacks) {
  if (asleep()) {
    return absl::FailedPreconditionError("the worker is asleep (ReleaseMemory); call ResumeMemory");
  }
  return engine_->Submit(std::move(request), std::move(callbacks));
}

void WorkerServer::RefreshHealth() {
  if (grpc_) grpc_->SetServing(serving());
}

absl::StatusOr<AdminOutcome> WorkerServer::Pause(engine::PauseMode mode) {
  const auto start = std::chrono::steady_clock::now();
  const engine::ServerInfo before = engine_->GetServerInfo();
  RETURN_IF_ERROR(engine_->Pause(mode));
  AdminOutcome out;
  out.num_aborted = static_cast<int32_t>(engine_->GetServerInfo().num_aborted - before.num_aborted);
  out.message = absl::StrCat("paused (", engine::PauseModeName(mode), ")");
  out.weight_version = weight_version();
  out.duration_us = MicrosSince(start);
  return out;
}

absl::StatusOr<AdminOutcome> WorkerServer::Continue() {
  const auto start = std::chrono::steady_clock::now();
  if (asleep()) {
    return absl::FailedPreconditionError("continue: the worker is asleep; call ResumeMemory");
  }
  RETURN_IF_ERROR(engine_->Continue());
  AdminOutcome out;
  const WeightUpdateStatus updates = updates_->status();
  out.message = updates.update_failed
                    ? "resumed; note: the last weight update failed: " + updates.last_error
                    : "resumed";
  out.weight_version = weight_version();
  out.duration_us = MicrosSince(start);
  return out;
}

absl::StatusOr<AdminOutcome> WorkerServer::FlushCache() {
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(engine_->FlushCache());
  AdminOutcome out;
  out.message = "cache flushed";
  out.weight_version = weight_version();
  out.duration_us = MicrosSince(start);
  return out;
}

absl::StatusOr<CheckerResult> WorkerServer::CheckWeights(CheckerAction action) {
  absl::StatusOr<CheckerResult> result = absl::InternalError("weights checker did not run");
  RETURN_IF_ERROR(engine_->RunOnEngineThread([&](engine::EngineContext& ctx) -> absl::Status {
    if (asleep()) return absl::FailedPreconditionError("weights_checker: the worker is asleep");
    switch (action) {
      case CheckerAction::kSnapshot:
        result = checker_.Snapshot(ctx.runner());
        break;
      case CheckerAction::kResetTensors:
        if (ctx.has_running()) {
          return absl::FailedPreconditionError(
              "weights_checker reset_tensors: requests are running; pause first");
        }
        result = checker_.ResetTensors(ctx.runner(), static_cast<uint64_t>(weight_version()) + 1);
        if (result.ok()) RETURN_IF_ERROR(ctx.FlushCache());
        break;
      case CheckerAction::kCompare:
        result = checker_.Compare(ctx.runner());
        break;
      case CheckerAction::kChecksum:
        result = WeightsChecker::Checksum(ctx.runner());
        break;
    }
    return absl::OkStatus();
  }));
  return result;
}

absl::StatusOr<AdminOutcome> WorkerServer::ReleaseMemory() {
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(engine_->RunOnEngineThread([&](engine::EngineContext& ctx) -> absl::Status {
    if (runner_->released()) return absl::OkStatus();
    if (ctx.has_running() || ctx.has_waiting()) {
      return absl::FailedPreconditionError(
          "release_memory: requests are active; pause with abort (or let them finish) first");
    }
    ctx.Pause(engine::PauseMode::kInPlace);
    RETURN_IF_ERROR(ctx.FlushCache());
    RETURN_IF_ERROR(runner_->Release());
    asleep_ = true;
    return absl::OkStatus();
  }));
  RefreshHealth();
  AdminOutcome out;
  out.message = "memory released (weights and KV cache freed)";
  out.weight_version = weight_version();
  out.duration_us = MicrosSince(start);
  return out;
}

absl::StatusOr<AdminOutcome> WorkerServer::ResumeMemory() {
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(engine_->RunOnEngineThread([&](engine::EngineContext& ctx) -> absl::Status {
    if (!runner_->released()) return absl::OkStatus();
    RETURN_IF_ERROR(runner_->Resume());
    asleep_ = false;
    ctx.Continue();
    return absl::OkStatus();
  }));
  RefreshHealth();
  AdminOutcome out;
  out.message = "memory resumed";
  out.weight_version = weight_version();
  out.duration_us = MicrosSince(start);
  return out;
}

WorkerInfo WorkerServer::worker_info() const {
  WorkerInfo out;
  out.asleep = asleep();
  out.backend = model_identity_.backend;
  out.version = RL_VERSION;
  WeightUpdateStatus updates = updates_->status();
  out.update_failed = updates.update_failed;
  out.last_error = std::move(updates.last_error);
  out.weight_update_groups = std::move(updates.groups);
  return out;
}

}  // namespace rl::worker
