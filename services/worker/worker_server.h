// WorkerServer: one model replica as a process, and the composition root of the worker: it only
// wires. Start loads the model config and tokenizer, picks the backend, and builds in order the
// sleepable runner (model/) and the engine (engine/), the metrics table, the weight-update unit
// (weights/), the control plane (control/), the data-plane host (EngineHost), the admin
// executor, the gRPC services (Worker, Admin, SGLang scheduler, health, reflection), the
// optional key-free SGLang scheduler listener for the SMG gateway (--sglang-port) and the
// metrics endpoint. No service includes this header; each talks to the interfaces it needs
// (GenerateHost, WorkerControl, WeightUpdates). Health (grpc.health.v1): the overall status is
// liveness (SERVING from start until Shutdown, updates, sleep and drain included); the service
// `rl.v1.Worker` is readiness and follows WorkerControl::serving(). Layout and semantics:
// docs/worker-control.md.
// Cost: the admin executor's kAdminThreads threads and the stream thread, made once at Start.
// Thread-safe: gRPC handlers call in concurrently; Shutdown from one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/auth.h"
#include "common/bounded_executor.h"
#include "common/metrics_http.h"
#include "common/model_io/model_config.h"
#include "common/server_runner.h"
#include "common/tokenizer/tokenizer.h"
#include "services/worker/control/worker_controller.h"
#include "services/worker/engine/engine.h"
#include "services/worker/engine_host.h"
#include "services/worker/weights/peer_sender.h"
#include "services/worker/weights/weight_update_controller.h"
#include "services/worker/worker_config.h"
#include "services/worker/worker_metrics.h"

namespace rl::worker {

class AdminService;
class PauseGuard;
class SglangService;
class WorkerService;

class WorkerServer final {
 public:
  // The admin executor: every background call (Admin calls that wait for the engine or a
  // receive, SGLang FlushCache retries) runs on it. Admin calls are rare and the router
  // serializes its broadcasts, so a few threads cover a receive, a Destroy that ends it and the
  // calls around them; a stuck engine holds at most kAdminThreads threads and
  // kMaxQueuedAdminCalls queued calls, and later calls are refused with RESOURCE_EXHAUSTED.
  static constexpr int kAdminThreads = 8;
  static constexpr size_t kMaxQueuedAdminCalls = 32;

  // Loads the model and tokenizer, starts the engine and serving. Errors name the bad flag or
  // file.
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Start(const WorkerConfig& config);
  ~WorkerServer();
  WorkerServer(const WorkerServer&) = delete;
  WorkerServer& operator=(const WorkerServer&) = delete;

  // "HOST:PORT" of the gRPC listener.
  std::string address() const { return grpc_->address(); }
  // "HOST:PORT" of the key-free SGLang scheduler listener (--sglang-port); "" when off.
  std::string sglang_address() const { return sglang_grpc_ ? sglang_grpc_->address() : ""; }
  int metrics_port() const { return metrics_http_ ? metrics_http_->port() : -1; }
  std::string backend_name() const { return control_->model_identity().backend; }
  // The readiness service's name on grpc.health.v1 (the overall status is liveness).
  static constexpr char kReadinessService[] = "rl.v1.Worker";

  // SIGTERM's first step (RunServerMain calls it before Shutdown): readiness off, new
  // generations refused with UNAVAILABLE (the router retries them elsewhere), and waits until no
  // request is running or waiting, or `drain_grace_s` (the flag) has passed. Admin calls and
  // streams in flight go on. Returns the number of requests still active (Shutdown aborts them
  // with their partial outputs). Idempotent.
  int Drain();
  // Graceful stop: refuses new calls, aborts generations, lets calls in flight finish, closes
  // the weight-update groups, stops the executors and the engine. Idempotent.
  void Shutdown();

  // The wired parts (tests, benchmarks).
  engine::Engine& engine() { return *engine_; }
  int64_t weight_version() const { return engine_->weight_version(); }
  WorkerControl& control() { return *control_; }
  WeightUpdates& weights() { return *weights_; }
  GenerateHost& host() { return *host_; }

 private:
  WorkerServer() = default;
  // Publishes WorkerControl::serving() as the health status.
  void RefreshHealth();

  WorkerConfig config_;
  model_io::ModelConfig model_config_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<WorkerMetrics> metrics_;
  std::unique_ptr<WeightUpdateController> weights_;
  std::unique_ptr<WorkerController> control_;
  std::unique_ptr<BearerAuth> admin_auth_;
  std::unique_ptr<BearerAuth> data_auth_;
  std::unique_ptr<BearerAuth> no_auth_;  // the --sglang-port listener's: no key
  std::unique_ptr<EngineHost> host_;
  std::unique_ptr<PeerSender> peer_sender_;  // SendWeightsToPeer; outlives the executor
  // Shut down after the gRPC server (every call has finished), before the services go.
  std::unique_ptr<BoundedExecutor> admin_executor_;
  std::unique_ptr<WorkerService> worker_service_;
  std::unique_ptr<AdminService> admin_service_;
  // Bounds the wait of SGLang requests on a paused worker; stopped before the engine goes.
  std::unique_ptr<PauseGuard> pause_guard_;
  std::unique_ptr<SglangService> sglang_service_;       // sglang.grpc.scheduler (SMG), keyed
  std::unique_ptr<SglangService> sglang_open_service_;  // the same on --sglang-port, no key
  std::unique_ptr<GrpcServer> grpc_;
  std::unique_ptr<GrpcServer> sglang_grpc_;  // --sglang-port
  std::unique_ptr<MetricsHttpServer> metrics_http_;
  bool shut_down_ = false;
};

}  // namespace rl::worker
