// WorkerServer: one model replica as a process, and the composition root of the worker. Loads
// the model and tokenizer, picks the backend, builds the engine (and through it the model
// runner), the weight-update controller (weight_update_controller.h: the update lifecycle and
// the weight-update groups), the metrics table, the gRPC services (Worker data plane, Admin
// control plane, SGLang scheduler, health, reflection) and the metrics endpoint. It implements
// the domain side of the data plane, pause / continue / flush, sleep / wake and the weights
// checker; the service classes only translate protos.
// Health is NOT_SERVING while asleep or while an update holds the engine.
// Thread-safe: gRPC handlers call in concurrently; engine state is touched only on its thread.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "common/auth.h"
#include "common/bounded_executor.h"
#include "common/metrics.h"
#include "common/metrics_http.h"
#include "common/model_io/model_config.h"
#include "common/server_runner.h"
#include "common/tokenizer/tokenizer.h"
#include "services/worker/engine/engine.h"
#include "services/worker/generate_host.h"
#include "services/worker/proto_convert.h"
#include "services/worker/weight_update_check.h"
#include "services/worker/weight_update_controller.h"
#include "services/worker/weights_checker.h"
#include "services/worker/worker_config.h"
#include "services/worker/worker_metrics.h"

namespace rl::worker {

class AdminService;
class SglangService;
class WorkerService;
class SleepableRunner;

class WorkerServer final : public GenerateHost {
 public:
  // Loads the model and tokenizer, starts the engine and serving. Errors name the bad flag or
  // file.
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Start(const WorkerConfig& config);
  ~WorkerServer() override;

  // "HOST:PORT" of the gRPC listener.
  std::string address() const { return grpc_->address(); }
  int metrics_port() const { return metrics_http_ ? metrics_http_->port() : -1; }
  std::string backend_name() const { return model_identity_.backend; }
  // Graceful drain: refuses new calls, aborts generations, stops the engine.
  void Shutdown();

  // ---- data plane ----
  engine::Engine& engine() override { return *engine_; }
  // Null when the model folder has no tokenizer.json.
  const tokenizer::Tokenizer* tokenizer() const override { return tokenizer_.get(); }
  // FAILED_PRECONDITION while asleep; otherwise Engine::Submit.
  absl::Status Submit(engine::GenerateRequest request,
                      engine::RequestCallbacks callbacks) override;
  // A fresh server-assigned request id ("srv-" + 128 random bits: unguessable, and in a
  // namespace client ids cannot use).
  std::string NextRequestId() override;
  // The --max-* request limits, and the model's context length (bounds max_new_tokens).
  const RequestLimits& limits() const override { return config_.limits; }
  int64_t context_len() const override { return model_config_.max_position_embeddings; }
  // Name → shape of every served weight (fixed for the life of the process).
  const WeightShapes& weight_shapes() const { return weight_shapes_; }
  // The admin key check (Worker.Abort with abort_all needs it).
  const BearerAuth& admin_auth() const override { return *admin_auth_; }
  MetricsRegistry& metrics() { return *metrics_->registry(); }
  void RecordFinished(const engine::GenerateResult& result) override;
  // Runs `task` on the stream thread: the work an engine callback hands over so the engine
  // thread does not do it (decoding text, building protobufs, queueing writes). One thread, so
  // tasks run in submission order (a stream's chunks stay in order). When kMaxStreamTasks are
  // queued the caller waits for room: backpressure on the engine, never an unbounded queue.
  void RunOnStreamThread(absl::AnyInvocable<void() &&> task) override;
  static constexpr size_t kMaxStreamTasks = 1 << 16;

  // ---- control plane ----
  absl::StatusOr<AdminOutcome> Pause(engine::PauseMode mode);
  absl::StatusOr<AdminOutcome> Continue();
  absl::StatusOr<AdminOutcome> FlushCache();
  // Disk, tensor and distributed weight updates and the weight-update groups.
  WeightUpdateController& weight_updates() { return *updates_; }
  enum class CheckerAction { kSnapshot, kResetTensors, kCompare, kChecksum };
  absl::StatusOr<CheckerResult> CheckWeights(CheckerAction action);
  absl::StatusOr<AdminOutcome> ReleaseMemory();
  absl::StatusOr<AdminOutcome> ResumeMemory();

  // What GetModelInfo reports beside the architecture (fixed for the life of the process).
  const ModelIdentity& model_identity() const { return model_identity_; }
  const model_io::ModelConfig& model_config() const { return model_config_; }
  // What GetServerInfo reports beside the engine's snapshot.
  WorkerInfo worker_info() const;
  int64_t weight_version() const override { return engine_->weight_version(); }
  bool asleep() const { return asleep_.load(); }
  // What grpc.health.v1 reports: not asleep and no weight update holding the engine.
  bool serving() const { return !asleep() && !updates_->updating(); }
  const WorkerConfig& config() const { return config_; }

 private:
  WorkerServer() = default;
  void RefreshHealth();

  WorkerConfig config_;
  model_io::ModelConfig model_config_;
  ModelIdentity model_identity_;  // path, backend, parameter count, config.json
  WeightShapes weight_shapes_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  // Destroyed after engine_ (whose shutdown still delivers finals to it), before tokenizer_.
  std::unique_ptr<BoundedExecutor> stream_executor_;
  SleepableRunner* runner_ = nullptr;  // owned by engine_; touched on the engine thread only
  std::unique_ptr<engine::Engine> engine_;
  WeightsChecker checker_;  // engine thread only
  std::atomic<bool> asleep_{false};

  std::unique_ptr<WorkerMetrics> metrics_;
  // After engine_ and metrics_ (it uses both); shut down before the engine goes.
  std::unique_ptr<WeightUpdateController> updates_;

  std::unique_ptr<BearerAuth> admin_auth_;
  std::unique_ptr<BearerAuth> data_auth_;
  std::unique_ptr<WorkerService> worker_service_;
  std::unique_ptr<AdminService> admin_service_;
  std::unique_ptr<SglangService> sglang_service_;  // sglang.grpc.scheduler (SMG)
  std::unique_ptr<GrpcServer> grpc_;
  std::unique_ptr<MetricsHttpServer> metrics_http_;
  bool shut_down_ = false;
};

}  // namespace rl::worker
