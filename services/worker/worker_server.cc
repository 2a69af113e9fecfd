#include "services/worker/worker_server.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/model_io/dtype.h"
#include "common/status.h"
#include "common/tokenizer/stream_decoder.h"
#include "services/worker/admin_service.h"
#include "services/worker/model/cpu_model_runner.h"
#include "services/worker/model/cuda_runner.h"
#include "services/worker/proto_convert.h"
#include "services/worker/sglang/sglang_service.h"
#include "services/worker/sleepable_runner.h"
#include "services/worker/weight_sync/weight_sync.h"
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
  {
    std::ifstream in(config.model_path + "/config.json");
    std::stringstream text;
    text << in.rdbuf();
    s->config_json_ = text.str();
  }
  s->num_parameters_ = NumParameters(s->model_config_);
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
  s->backend_name_ = use_cuda ? "cuda" : "cpu";
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

  ASSIGN_OR_RETURN(const std::vector<model::TensorInfo> weights, s->ListWeights());
  for (const model::TensorInfo& t : weights) s->weight_shapes_[t.name] = t.shape;
  WorkerServer* raw = s.get();
  s->metrics_ = std::make_unique<WorkerMetrics>(s->engine_.get(), [raw] { return raw->asleep(); });
  s->admin_auth_ = std::make_unique<BearerAuth>(config.admin_api_key);
  s->data_auth_ = std::make_unique<BearerAuth>(config.api_key);
  s->worker_service_ = std::make_unique<WorkerService>(s.get(), s->data_auth_.get());
  s->admin_service_ = std::make_unique<AdminService>(s.get(), s->admin_auth_.get());
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
  std::map<std::string, std::unique_ptr<PendingReceive>> pending;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, receiver] : groups_) receiver->Close();  // pending receives fail now
    pending.swap(pending_);
  }
  for (auto& [name, p] : pending) p->thread.join();
  {
    absl::MutexLock lock(&mu_);
    groups_.clear();
  }
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
  if (grpc_) grpc_->SetServing(!asleep() && updates_in_progress_.load() == 0);
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
  {
    absl::MutexLock lock(&mu_);
    out.message =
        update_failed_ ? "resumed; note: the last weight update failed: " + last_error_ : "resumed";
  }
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

absl::StatusOr<AdminOutcome> WorkerServer::RunWeightUpdate(
    const char* what, const UpdatePolicy& policy,
    const std::function<absl::Status(model::ModelRunner&)>& apply, bool failure_keeps_pause) {
  if (policy.weight_version.has_value() && *policy.weight_version < 0) {
    return absl::InvalidArgumentError("weight_version: must be >= 0");
  }
  const auto start = std::chrono::steady_clock::now();
  updates_in_progress_.fetch_add(1);
  RefreshHealth();
  AdminOutcome out;
  absl::Status status = engine_->RunOnEngineThread([&](engine::EngineContext& ctx) -> absl::Status {
    const bool active = ctx.has_running() || ctx.has_waiting();
    const bool retracted = ctx.paused() && ctx.pause_mode() >= engine::PauseMode::kRetract;
    if (active && !policy.abort_all_requests && !retracted) {
      const engine::ServerInfo info = ctx.info();
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": ", info.num_running, " running and ", info.num_waiting,
                       " waiting requests; pass abort_all_requests or pause with retract first"));
    }
    const bool was_paused = ctx.paused();
    if (!retracted) ctx.Pause(engine::PauseMode::kRetract);
    if (policy.abort_all_requests)
      out.num_aborted = ctx.AbortAll(absl::StrCat(what, " aborted it"));
    if (absl::Status s = apply(ctx.runner()); !s.ok()) {
      if (!failure_keeps_pause && !was_paused && !asleep()) ctx.Continue();
      return s;
    }
    RETURN_IF_ERROR(ctx.FlushCache());
    const int64_t version = policy.weight_version.value_or(ctx.weight_version() + 1);
    ctx.set_weight_version(version);
    // Asleep: the runner staged the weights (sleepable_runner.h); they serve on wake, which
    // resumes the engine.
    if (!policy.keep_pause && !asleep()) ctx.Continue();
    out.weight_version = version;
    return absl::OkStatus();
  });
  updates_in_progress_.fetch_sub(1);
  RefreshHealth();
  out.duration_us = MicrosSince(start);
  metrics_->RecordUpdate(out.duration_us / 1e6);
  {
    absl::MutexLock lock(&mu_);
    if (status.ok()) {
      update_failed_ = false;
      last_error_.clear();
    } else if (failure_keeps_pause && status.code() != absl::StatusCode::kFailedPrecondition) {
      update_failed_ = true;
      last_error_ = std::string(status.message());
    }
  }
  if (!status.ok()) {
    spdlog::warn("{} failed: {}", what, std::string(status.message()));
    return status;
  }
  out.message = absl::StrCat(what, ": weight_version ", out.weight_version,
                             policy.keep_pause ? " (kept paused)" : "");
  spdlog::info("{} in {} ms", out.message, out.duration_us / 1000.0);
  return out;
}

absl::StatusOr<AdminOutcome> WorkerServer::UpdateWeightsFromDisk(const std::string& model_path,
                                                                 const UpdatePolicy& policy) {
  RETURN_IF_ERROR(CheckDiskUpdate(model_path, model_config_, config_.limits));
  return RunWeightUpdate(
      "update_weights_from_disk", policy,
      [&](model::ModelRunner& runner) {
        return Annotate(runner.LoadWeightsFromDisk(model_path), model_path);
      },
      /*failure_keeps_pause=*/false);
}

namespace {

// Checks that every tensor names a held weight with the same shape, a float dtype and the
// right byte count, and that no name repeats.
absl::Status ValidateTensors(const std::vector<model::TensorInfo>& held,
                             const std::vector<const model::TensorInfo*>& incoming,
                             const std::vector<int64_t>& byte_counts) {
  std::map<std::string, const model::TensorInfo*> by_name;
  for (const auto& t : held) by_name[t.name] = &t;
  std::set<std::string> seen;
  for (size_t i = 0; i < incoming.size(); ++i) {
    const model::TensorInfo& t = *incoming[i];
    auto it = by_name.find(t.name);
    if (it == by_name.end()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': no such weight"));
    }
    if (!seen.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': sent twice"));
    }
    if (t.shape != it->second->shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name, "': shape [", absl::StrJoin(t.shape, ", "),
                       "] but the model has [", absl::StrJoin(it->second->shape, ", "), "]"));
    }
    const std::optional<model_io::DType> dtype = model_io::ParseDType(t.dtype);
    if (!dtype || !model_io::IsFloatWeightDType(*dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name, "': dtype '", t.dtype, "' (F32, BF16 or F16)"));
    }
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    if (byte_counts[i] >= 0 && byte_counts[i] != numel * model_io::DTypeSize(*dtype)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': ", byte_counts[i],
                                                     " bytes, expected ",
                                                     numel * model_io::DTypeSize(*dtype)));
    }
  }
  return absl::OkStatus();
}

// Validates and applies staged tensors (ValidateTensors first, so nothing changes on error).
absl::Status ApplyStaged(model::ModelRunner& runner, const std::vector<NamedTensor>& tensors) {
  std::vector<const model::TensorInfo*> infos;
  std::vector<int64_t> sizes;
  for (const NamedTensor& t : tensors) {
    infos.push_back(&t.info);
    sizes.push_back(static_cast<int64_t>(t.bytes.size()));
  }
  RETURN_IF_ERROR(ValidateTensors(runner.ListWeights(), infos, sizes));
  for (const NamedTensor& t : tensors) RETURN_IF_ERROR(runner.UpdateWeight(t.info, t.bytes));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AdminOutcome> WorkerServer::UpdateWeightsFromTensors(
    std::vector<NamedTensor> tensors, const UpdatePolicy& policy) {
  if (tensors.empty()) return absl::InvalidArgumentError("chunk: the stream carried no tensor");
  return RunWeightUpdate(
      "update_weights_from_tensor", policy,
      [&](model::ModelRunner& runner) { return ApplyStaged(runner, tensors); },
      /*failure_keeps_pause=*/false);
}

absl::StatusOr<AdminOutcome> WorkerServer::InitWeightsUpdateGroup(const GroupRequest& r) {
  if (r.group_name.empty()) return absl::InvalidArgumentError("group_name: must not be empty");
  if (r.master_address.empty())
    return absl::InvalidArgumentError("master_address: must not be empty");
  if (r.master_port <= 0 || r.master_port > 65535) {
    return absl::InvalidArgumentError("master_port: must be in [1, 65535]");
  }
  if (r.world_size < 2)
    return absl::InvalidArgumentError("world_size: must be >= 2 (trainer + worker)");
  if (r.rank_offset < 1 || r.rank_offset >= r.world_size) {
    return absl::InvalidArgumentError(
        "rank_offset: must be in [1, world_size) (rank 0 is the trainer)");
  }
  if (r.timeout_ms <= 0) return absl::InvalidArgumentError("timeout_ms: must be > 0");
  {
    absl::MutexLock lock(&mu_);
    if (groups_.contains(r.group_name)) {
      return absl::AlreadyExistsError(
          absl::StrCat("group_name: '", r.group_name, "' already exists"));
    }
  }
  const auto start = std::chrono::steady_clock::now();
  weight_sync::GroupOptions options;
  options.backend = r.backend.empty() ? "tcp" : r.backend;
  options.master_address = r.master_address;
  options.master_port = r.master_port;
  options.rank = r.rank_offset;
  options.world_size = r.world_size;
  options.group_name = r.group_name;
  options.timeout = std::chrono::milliseconds(r.timeout_ms);
  options.cuda_device = config_.cuda_device;
  auto receiver = weight_sync::ConnectReceiver(options);
  if (!receiver.ok()) {
    absl::MutexLock lock(&mu_);
    last_error_ = std::string(receiver.status().message());
    return receiver.status();
  }
  std::shared_ptr<weight_sync::WeightReceiver> joined = *std::move(receiver);
  {
    absl::MutexLock lock(&mu_);
    if (groups_.emplace(r.group_name, joined).second) joined = nullptr;
  }
  if (joined != nullptr) {  // a concurrent InitWeightsUpdateGroup of the same name won
    joined->Close();
    return absl::AlreadyExistsError(
        absl::StrCat("group_name: '", r.group_name, "' already exists"));
  }
  AdminOutcome out;
  out.message = absl::StrCat("joined group '", r.group_name, "' as rank ", r.rank_offset, " of ",
                             r.world_size, " (", options.backend, ")");
  out.weight_version = weight_version();
  out.duration_us = MicrosSince(start);
  return out;
}

absl::StatusOr<AdminOutcome> WorkerServer::UpdateWeightsFromDistributed(
    const std::string& group_name, std::vector<model::TensorInfo> specs,
    const UpdatePolicy& policy) {
  std::shared_ptr<weight_sync::WeightReceiver> receiver;
  {
    absl::MutexLock lock(&mu_);
    auto it = groups_.find(group_name);
    if (it == groups_.end()) {
      return absl::FailedPreconditionError(
          absl::StrCat("group_name: no group '", group_name, "' (InitWeightsUpdateGroup first)"));
    }
    if (pending_.contains(group_name)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "group '", group_name, "' has a prepared update (CompleteWeightsUpdate first)"));
    }
    receiver = it->second;
  }
  if (specs.empty()) return absl::InvalidArgumentError("names: no tensor in the bucket");
  return RunWeightUpdate(
      "update_weights_from_distributed", policy,
      [&](model::ModelRunner& runner) -> absl::Status {
        std::vector<const model::TensorInfo*> infos;
        for (const auto& s : specs) infos.push_back(&s);
        RETURN_IF_ERROR(
            ValidateTensors(runner.ListWeights(), infos, std::vector<int64_t>(specs.size(), -1)));
        std::vector<weight_sync::TensorSpec> wire;
        for (const auto& s : specs) wire.push_back({s.name, s.dtype, s.shape});
        std::map<std::string, const model::TensorInfo*> by_name;
        for (const auto& s : specs) by_name[s.name] = &s;
        return receiver->Receive(
            wire, [&](const weight_sync::TensorSpec& spec, absl::Span<const uint8_t> bytes) {
              return runner.UpdateWeight(*by_name.at(spec.name), bytes);
            });
      },
      /*failure_keeps_pause=*/true);
}

absl::StatusOr<AdminOutcome> WorkerServer::DestroyWeightsUpdateGroup(
    const std::string& group_name) {
  std::shared_ptr<weight_sync::WeightReceiver> receiver;
  std::unique_ptr<PendingReceive> pending;
  {
    absl::MutexLock lock(&mu_);
    auto it = groups_.find(group_name);
    if (it == groups_.end()) {
      return absl::NotFoundError(absl::StrCat("group_name: no group '", group_name, "'"));
    }
    receiver = std::move(it->second);
    groups_.erase(it);
    if (auto p = pending_.find(group_name); p != pending_.end()) {
      pending = std::move(p->second);
      pending_.erase(p);
    }
  }
  receiver->Close();  // a prepared receive fails promptly
  if (pending) pending->thread.join();
  AdminOutcome out;
  out.message = absl::StrCat("left group '", group_name, "'");
  out.weight_version = weight_version();
  return out;
}

namespace {

// Receives `buckets` in order, copying every tensor into host staging.
absl::Status ReceiveBuckets(weight_sync::WeightReceiver* receiver,
                            const std::vector<std::vector<model::TensorInfo>>& buckets,
                            std::vector<NamedTensor>* out) {
  for (const auto& bucket : buckets) {
    std::vector<weight_sync::TensorSpec> wire;
    for (const auto& s : bucket) wire.push_back({s.name, s.dtype, s.shape});
    size_t next = 0;
    RETURN_IF_ERROR(receiver->Receive(
        wire, [&](const weight_sync::TensorSpec&, absl::Span<const uint8_t> bytes) {
          out->push_back({bucket[next++], std::vector<uint8_t>(bytes.begin(), bytes.end())});
          return absl::OkStatus();
        }));
  }
  return absl::OkStatus();
}


}  // namespace

absl::StatusOr<AdminOutcome> WorkerServer::RunSelfPausingUpdate(
    const char* what, const UpdatePolicy& policy,
    const std::function<absl::Status(model::ModelRunner&)>& apply) {
  const bool paused_here = !engine_->GetServerInfo().paused;
  if (paused_here) RETURN_IF_ERROR(engine_->Pause(engine::PauseMode::kRetract));
  absl::StatusOr<AdminOutcome> out = RunWeightUpdate(what, policy, apply,
                                                     /*failure_keeps_pause=*/false);
  if (!out.ok() && paused_here && !asleep()) (void)engine_->Continue();
  return out;
}

absl::StatusOr<std::shared_ptr<weight_sync::WeightReceiver>> WorkerServer::CheckedReceiver(
    const std::string& group_name, const std::vector<std::vector<model::TensorInfo>>& buckets) {
  if (buckets.empty()) return absl::InvalidArgumentError("buckets: no bucket listed");
  std::vector<const model::TensorInfo*> infos;
  for (const auto& bucket : buckets) {
    if (bucket.empty()) return absl::InvalidArgumentError("buckets: an empty bucket");
    for (const auto& s : bucket) infos.push_back(&s);
  }
  ASSIGN_OR_RETURN(const std::vector<model::TensorInfo> held, ListWeights());
  RETURN_IF_ERROR(ValidateTensors(held, infos, std::vector<int64_t>(infos.size(), -1)));
  absl::MutexLock lock(&mu_);
  auto it = groups_.find(group_name);
  if (it == groups_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("group_name: no group '", group_name, "' (InitWeightsUpdateGroup first)"));
  }
  return it->second;
}

absl::StatusOr<AdminOutcome> WorkerServer::PrepareWeightsUpdate(
    const std::string& group_name, std::vector<std::vector<model::TensorInfo>> buckets) {
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(std::shared_ptr<weight_sync::WeightReceiver> receiver,
                   CheckedReceiver(group_name, buckets));
  int64_t num_tensors = 0;
  for (const auto& b : buckets) num_tensors += static_cast<int64_t>(b.size());
  absl::MutexLock lock(&mu_);
  if (pending_.contains(group_name)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "group '", group_name, "' already has a prepared update (CompleteWeightsUpdate first)"));
  }
  if (!groups_.contains(group_name)) {
    return absl::FailedPreconditionError(absl::StrCat("group '", group_name, "' was destroyed"));
  }
  auto p = std::make_unique<PendingReceive>();
  PendingReceive* raw = p.get();
  // Posted: the receiver reads the group's connection from here on (tcp buffers anything the
  // trainer sends first; nccl posts its receive inside Receive before any data can move).
  raw->thread = std::thread([raw, receiver, buckets = std::move(buckets)] {
    raw->status = ReceiveBuckets(receiver.get(), buckets, &raw->tensors);
  });
  pending_[group_name] = std::move(p);
  AdminOutcome out;
  out.ready = true;
  out.message = absl::StrCat("prepare_weights_update: receive of ", num_tensors,
                             " tensors posted on group '", group_name, "'");
  out.weight_version = weight_version();
  out.duration_us = MicrosSince(start);
  return out;
}

absl::StatusOr<AdminOutcome> WorkerServer::CompleteWeightsUpdate(const std::string& group_name,
                                                                 const UpdatePolicy& policy) {
  std::unique_ptr<PendingReceive> p;
  {
    absl::MutexLock lock(&mu_);
    auto it = pending_.find(group_name);
    if (it == pending_.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "group '", group_name, "' has no prepared update (PrepareWeightsUpdate first)"));
    }
    p = std::move(it->second);
    pending_.erase(it);
  }
  p->thread.join();  // bounded by the group's stall timeout
  if (!p->status.ok()) {
    return Annotate(p->status,
                    "complete_weights_update: the prepared receive failed (nothing "
                    "was applied)");
  }
  return RunSelfPausingUpdate("complete_weights_update", policy, [&](model::ModelRunner& runner) {
    return ApplyStaged(runner, p->tensors);
  });
}

absl::StatusOr<AdminOutcome> WorkerServer::ReceiveWeights(
    const std::string& group_name, std::vector<std::vector<model::TensorInfo>> buckets,
    const UpdatePolicy& policy) {
  ASSIGN_OR_RETURN(std::shared_ptr<weight_sync::WeightReceiver> receiver,
                   CheckedReceiver(group_name, buckets));
  {
    absl::MutexLock lock(&mu_);
    if (pending_.contains(group_name)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "group '", group_name, "' has a prepared update (CompleteWeightsUpdate first)"));
    }
  }
  return RunSelfPausingUpdate("receive_weights", policy, [&](model::ModelRunner& runner) {
    std::vector<NamedTensor> staged;
    RETURN_IF_ERROR(ReceiveBuckets(receiver.get(), buckets, &staged));
    return ApplyStaged(runner, staged);
  });
}

absl::StatusOr<std::vector<model::TensorInfo>> WorkerServer::ListWeights() {
  std::vector<model::TensorInfo> out;
  RETURN_IF_ERROR(engine_->RunOnEngineThread([&](engine::EngineContext& ctx) {
    if (asleep()) return absl::FailedPreconditionError("list_weights: the worker is asleep");
    out = ctx.runner().ListWeights();
    return absl::OkStatus();
  }));
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

void WorkerServer::FillModelInfo(rl::v1::GetModelInfoResponse* out) const {
  ToProto(model_config_, out);
  out->set_model_path(config_.model_path);
  out->set_weight_version(weight_version());
  out->set_backend(backend_name_);
  out->set_num_parameters(num_parameters_);
  out->set_config_json(config_json_);
}

void WorkerServer::FillServerInfo(rl::v1::GetServerInfoResponse* out) const {
  ToProto(engine_->GetServerInfo(), out);
  out->set_asleep(asleep());
  out->set_backend(backend_name_);
  out->set_version(RL_VERSION);
  absl::MutexLock lock(&mu_);
  out->set_update_failed(update_failed_);
  out->set_last_error(last_error_);
  for (const auto& [name, receiver] : groups_) out->add_weight_update_groups(name);
}

}  // namespace rl::worker
