#include "services/worker/worker_server.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/request_limits.h"
#include "common/status.h"
#include "common/tokenizer/vocab_coverage.h"
#include "services/worker/admin_service.h"
#include "services/worker/engine/tokenizer_text_decoder.h"
#include "services/worker/model/cpu_model_runner.h"
#include "services/worker/model/cuda_runner.h"
#include "services/worker/model/sleepable_runner.h"
#include "services/worker/sglang/pause_guard.h"
#include "services/worker/sglang/sglang_service.h"
#include "services/worker/worker_service.h"
#include "spdlog/spdlog.h"

namespace rl::worker {
namespace {

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
  ModelIdentity identity;
  identity.model_path = config.model_path;
  {
    std::ifstream in(config.model_path + "/config.json");
    std::stringstream text;
    text << in.rdbuf();
    identity.config_json = text.str();
  }
  identity.num_parameters = NumParameters(s->model_config_);
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
  identity.backend = use_cuda ? "cuda" : "cpu";
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

  // The model: a sleepable runner (sleep / wake) over the chosen backend, under the engine.
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
  runner_options.cpu_huge_pages = config.cpu_huge_pages;
  runner_options.kv_cache_dtype = config.kv_cache_dtype;
  const auto make_runner = use_cuda ? model::CreateCudaModelRunner : model::CreateCpuModelRunner;
  const std::string spill_dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("rl-worker-spill-", getpid()))
          .string();
  ASSIGN_OR_RETURN(std::unique_ptr<model::SleepableRunner> runner,
                   model::SleepableRunner::Create(
                       [runner_options, make_runner] { return make_runner(runner_options); },
                       spill_dir, config.model_path));
  model::SleepableRunner* const sleepable = runner.get();  // owned by the engine
  engine::EngineOptions engine_options;
  engine_options.scheduler.max_running_requests = config.max_running_requests;
  engine_options.scheduler.default_max_version_lag = config.max_version_lag;
  engine_options.scheduler.chunked_prefill_size = config.chunked_prefill_tokens;
  engine_options.initial_weight_version = config.weight_version;
  engine_options.enable_return_routed_experts = config.enable_return_routed_experts;
  std::unique_ptr<engine::TextDecoder> decoder;
  if (s->tokenizer_) decoder = std::make_unique<engine::TokenizerTextDecoder>(s->tokenizer_.get());
  ASSIGN_OR_RETURN(s->engine_,
                   engine::Engine::Create(std::move(runner), engine_options, std::move(decoder)));
  spdlog::info("model {}: {} layers, hidden {}, vocab {}, {} KV tokens", config.model_path,
               s->model_config_.num_hidden_layers, s->model_config_.hidden_size,
               s->model_config_.vocab_size, s->engine_->GetServerInfo().scheduler.total_kv_tokens);

  // The metrics table reads the control plane's asleep state at scrape time (the endpoint
  // starts after the control plane exists).
  WorkerServer* raw = s.get();
  s->metrics_ =
      std::make_unique<WorkerMetrics>(s->engine_.get(), [raw] { return raw->control_->asleep(); });
  WorkerMetrics* metrics = s->metrics_.get();

  // The weight-update unit, then the control plane over it; both report serving-state changes
  // to the health status.
  WeightUpdateController::Deps weights;
  weights.engine = s->engine_.get();
  weights.model_config = s->model_config_;
  weights.limits = config.limits;
  weights.cuda_device = config.cuda_device;
  weights.sleep = sleepable;
  weights.updating_changed = [raw] { raw->RefreshHealth(); };
  weights.record_duration = [metrics](double seconds) { metrics->RecordUpdate(seconds); };
  weights.staging_nice = config.staging_nice;
  ASSIGN_OR_RETURN(s->weights_, WeightUpdateController::Create(std::move(weights)));
  WorkerController::Deps control;
  control.engine = s->engine_.get();
  control.runner = sleepable;
  control.weights = s->weights_.get();
  control.identity = std::move(identity);
  control.build_version = RL_VERSION;
  control.serving_changed = [raw] { raw->RefreshHealth(); };
  s->control_ = std::make_unique<WorkerController>(std::move(control));

  // The data plane's host, the admin executor, the services.
  s->admin_auth_ = std::make_unique<BearerAuth>(config.admin_api_key);
  s->data_auth_ = std::make_unique<BearerAuth>(config.api_key);
  s->host_ = std::make_unique<EngineHost>(EngineHost::Deps{
      .engine = s->engine_.get(),
      .tokenizer = s->tokenizer_.get(),
      .limits = config.limits,
      .context_len = s->model_config_.max_position_embeddings,
      .admin_auth = s->admin_auth_.get(),
      .metrics = metrics,
      .control = s->control_.get(),
  });
  s->admin_executor_ =
      std::make_unique<BoundedExecutor>("rl-admin", kAdminThreads, kMaxQueuedAdminCalls);
  WeightUpdateController* const digests = s->weights_.get();
  s->worker_service_ = std::make_unique<WorkerService>(
      s->host_.get(), s->data_auth_.get(),
      WorkerService::Identity{
          .instance_id = NewServerRequestId(""),
          .weights_sha256 = [digests] { return digests->served_sha256(); },
      });
  s->admin_service_ =
      std::make_unique<AdminService>(*s->host_, *s->control_, *s->weights_, *s->admin_executor_,
                                     *s->admin_auth_, config.allow_non_finite_weights);
  WeightUpdateController* const controller = s->weights_.get();
  s->peer_sender_ = std::make_unique<PeerSender>(PeerSender::Deps{
      .engine = s->engine_.get(),
      .limits = config.limits,
      .applies = [controller] { return controller->applies(); },
  });
  s->admin_service_->SetPeerSender(s->peer_sender_.get());
  engine::Engine* const engine = s->engine_.get();
  s->pause_guard_ = std::make_unique<PauseGuard>(
      [engine] { return engine->GetServerInfo().paused; },
      [engine](const std::string& id, const std::string& why) { engine->AbortAsync(id, why); },
      absl::Milliseconds(static_cast<int64_t>(std::ceil(config.sglang_pause_timeout_s * 1000))));
  s->pause_guard_->Start();
  s->sglang_service_ =
      std::make_unique<SglangService>(*s->host_, *s->control_, s->config_, *s->admin_executor_,
                                      *s->pause_guard_, *s->data_auth_, *s->admin_auth_);
  ServerOptions options;
  options.host = config.host;
  options.port = config.port;
  // A tensor chunk plus its header; generate requests are far smaller.
  options.max_message_bytes = static_cast<int>(std::min<int64_t>(
      std::max<int64_t>(config.limits.max_tensor_chunk_bytes + (1 << 20), 64 << 20), INT32_MAX));
  ASSIGN_OR_RETURN(s->grpc_,
                   GrpcServer::Start(options, {s->worker_service_.get(), s->admin_service_.get(),
                                               s->sglang_service_.get()}));
  if (config.sglang_port >= 0) {
    // SMG's gRPC client sends no metadata and no client certificate: this listener takes no
    // key, and only the gateway must reach it (README "OpenAI-compatible API through SMG").
    s->no_auth_ = std::make_unique<BearerAuth>("");
    s->sglang_open_service_ =
        std::make_unique<SglangService>(*s->host_, *s->control_, s->config_, *s->admin_executor_,
                                        *s->pause_guard_, *s->no_auth_, *s->no_auth_);
    ServerOptions sglang_options = options;
    sglang_options.host = config.sglang_host.empty() ? config.host : config.sglang_host;
    sglang_options.port = config.sglang_port;
    sglang_options.max_message_bytes = 64 << 20;  // token ids only, no tensor chunks
    ASSIGN_OR_RETURN(s->sglang_grpc_,
                     GrpcServer::Start(sglang_options, {s->sglang_open_service_.get()}));
    if (s->data_auth_->enabled() || s->admin_auth_->enabled()) {
      spdlog::warn(
          "--sglang-port: SGLang's scheduler protocol on {} takes no API key (the SMG gateway "
          "sends none); only the gateway must reach that address",
          s->sglang_grpc_->address());
    }
  }
  if (config.metrics_port >= 0) {
    ASSIGN_OR_RETURN(s->metrics_http_, MetricsHttpServer::Start(config.host, config.metrics_port,
                                                                s->metrics_->registry()));
  }
  s->RefreshHealth();  // the readiness service's first status
  return s;
}

WorkerServer::~WorkerServer() { Shutdown(); }

void WorkerServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  // Abort generations first so streams end with a final message instead of hanging the drain.
  if (engine_) (void)engine_->AbortAll("worker shutting down");
  if (pause_guard_) pause_guard_->Shutdown();        // aborts nothing from now on
  if (sglang_service_) sglang_service_->Shutdown();  // FlushCache waits answer now
  if (sglang_open_service_) sglang_open_service_->Shutdown();
  if (sglang_grpc_) sglang_grpc_->Shutdown();
  if (peer_sender_) peer_sender_->Shutdown();  // a send in flight is cut: it ends now
  if (grpc_) grpc_->Shutdown();                // refuses new calls; waits for the calls in flight
  if (metrics_http_) metrics_http_->Stop();
  if (weights_) weights_->Shutdown();  // closes the groups: posted receives fail now
  // Every call has finished: what the executor still runs (a flush retry leaving) ends, then
  // its threads are joined, before anything a task could reach goes.
  admin_executor_.reset();
  // Nothing submits any more: end what arrived meanwhile, then let the stream thread deliver
  // every final (its tasks may still call into the engine and the metrics) and join it, before
  // the engine goes.
  if (engine_) (void)engine_->AbortAll("worker shutting down");
  if (host_) host_->StopStreamThread();
  engine_.reset();
}

int WorkerServer::Drain() {
  if (shut_down_ || !control_ || !engine_) return 0;
  control_->BeginDrain();  // readiness off (RefreshHealth), admission refused
  // Every request Submit accepted and has not finished (inbox, scheduler, final in delivery):
  // the published stats would miss one still in the inbox, which shutdown would then end with an
  // abort and no output. BeginDrain comes first, so only a Submit already past its admission
  // check (the next statement in EngineHost::Submit) can still join.
  const auto active = [this] { return engine_->NumLive(); };
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(config_.drain_grace_s * 1e3));
  int64_t left = active();
  spdlog::info("draining: {} request(s) active, up to {}s to finish", left, config_.drain_grace_s);
  while (left > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    left = active();
  }
  if (left > 0) {
    spdlog::warn("drain grace period ({}s) over: aborting {} request(s) with their partial outputs",
                 config_.drain_grace_s, left);
  } else {
    spdlog::info("drained: no request active");
  }
  return static_cast<int>(left);
}

void WorkerServer::RefreshHealth() {
  if (!control_) return;
  // Liveness (the overall status) stays SERVING; only readiness follows the serving state.
  const bool ready = control_->serving();
  if (grpc_) grpc_->SetServiceServing(kReadinessService, ready);
  if (sglang_grpc_) sglang_grpc_->SetServiceServing(kReadinessService, ready);
}

}  // namespace rl::worker
