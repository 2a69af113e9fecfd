// WorkerServer: one model replica as a process. Owns the engine (and through it the model
// runner), the tokenizer, the gRPC services (Worker data plane, Admin control plane, health,
// reflection) and the metrics endpoint, and implements the domain side of every call; the
// service classes only translate protos.
//
// Weight updates (disk, tensors, distributed) share one lifecycle, run on the engine thread
// between two steps: refuse while requests are active unless abort_all_requests or paused with
// retract → pause (retract) → abort if asked → apply → flush the prefix cache (KV computed with
// the old weights is never reused) → bump weight_version → resume unless keep_pause. A failed
// disk/tensor update leaves the old weights serving (everything is validated before anything
// changes); a failed distributed update leaves the engine paused and marks update_failed.
// Updates are accepted while asleep: the runner stages them (host memory, or the folder for a
// disk update) and they become the served weights on wake; the version is bumped at the update.
// Health is NOT_SERVING while asleep or while an update holds the engine.
// Thread-safe: gRPC handlers call in concurrently; engine state is touched only on its thread.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/auth.h"
#include "common/bounded_executor.h"
#include "common/metrics.h"
#include "common/metrics_http.h"
#include "common/model_io/model_config.h"
#include "common/server_runner.h"
#include "common/tokenizer/tokenizer.h"
#include "rl/v1/admin.pb.h"
#include "services/worker/engine/engine.h"
#include "services/worker/generate_host.h"
#include "services/worker/weight_update_check.h"
#include "services/worker/weights_checker.h"
#include "services/worker/worker_metrics.h"
#include "services/worker/worker_config.h"

namespace rl::weight_sync {
class WeightReceiver;
}

namespace rl::worker {

class AdminService;
class SglangService;
class WorkerService;
class SleepableRunner;

// What an admin call did.
struct AdminOutcome {
  std::string message;
  int32_t num_aborted = 0;
  int64_t weight_version = 0;
  int64_t duration_us = 0;
  bool ready = false;  // PrepareWeightsUpdate: the receive is posted
};

struct UpdatePolicy {
  std::optional<int64_t> weight_version;  // unset: current + 1
  bool abort_all_requests = false;
  bool keep_pause = false;
};

// One tensor of an UpdateWeightsFromTensor stream, assembled.
struct NamedTensor {
  model::TensorInfo info;
  std::vector<uint8_t> bytes;
};

struct GroupRequest {
  std::string master_address;
  int master_port = 0;
  int rank_offset = 0;
  int world_size = 0;
  std::string group_name;
  std::string backend;  // "tcp" | "nccl" | "" (auto)
  int timeout_ms = 60000;
};

class WorkerServer final : public GenerateHost {
 public:
  // Loads the model and tokenizer, starts the engine and serving. Errors name the bad flag or
  // file.
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Start(const WorkerConfig& config);
  ~WorkerServer() override;

  // "HOST:PORT" of the gRPC listener.
  std::string address() const { return grpc_->address(); }
  int metrics_port() const { return metrics_http_ ? metrics_http_->port() : -1; }
  std::string backend_name() const { return backend_name_; }
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
  absl::StatusOr<AdminOutcome> UpdateWeightsFromDisk(const std::string& model_path,
                                                     const UpdatePolicy& policy);
  // Validates every tensor (name, dtype, shape, byte count) before changing any.
  absl::StatusOr<AdminOutcome> UpdateWeightsFromTensors(std::vector<NamedTensor> tensors,
                                                        const UpdatePolicy& policy);
  absl::StatusOr<AdminOutcome> InitWeightsUpdateGroup(const GroupRequest& request);
  absl::StatusOr<AdminOutcome> UpdateWeightsFromDistributed(
      const std::string& group_name, std::vector<model::TensorInfo> specs,
      const UpdatePolicy& policy);
  absl::StatusOr<AdminOutcome> DestroyWeightsUpdateGroup(const std::string& group_name);
  // Two-phase receive (admin.proto): Prepare validates `buckets` against the served weights and
  // starts receiving them on a background thread (host staging); it returns once the receive is
  // posted. Complete waits for it, then applies everything atomically (self-pausing update).
  // One prepared receive per group at a time (FAILED_PRECONDITION otherwise).
  absl::StatusOr<AdminOutcome> PrepareWeightsUpdate(
      const std::string& group_name, std::vector<std::vector<model::TensorInfo>> buckets);
  absl::StatusOr<AdminOutcome> CompleteWeightsUpdate(const std::string& group_name,
                                                     const UpdatePolicy& policy);
  // Single call: pause (retract) → receive `buckets` → apply atomically → resume.
  absl::StatusOr<AdminOutcome> ReceiveWeights(const std::string& group_name,
                                              std::vector<std::vector<model::TensorInfo>> buckets,
                                              const UpdatePolicy& policy);
  absl::StatusOr<std::vector<model::TensorInfo>> ListWeights();
  enum class CheckerAction { kSnapshot, kResetTensors, kCompare, kChecksum };
  absl::StatusOr<CheckerResult> CheckWeights(CheckerAction action);
  absl::StatusOr<AdminOutcome> ReleaseMemory();
  absl::StatusOr<AdminOutcome> ResumeMemory();

  void FillModelInfo(rl::v1::GetModelInfoResponse* out) const;
  void FillServerInfo(rl::v1::GetServerInfoResponse* out) const;
  int64_t weight_version() const override { return engine_->weight_version(); }
  bool asleep() const { return asleep_.load(); }
  // What grpc.health.v1 reports: not asleep and no weight update holding the engine.
  bool serving() const { return !asleep() && updates_in_progress_.load() == 0; }
  const WorkerConfig& config() const { return config_; }

 private:
  WorkerServer() = default;
  // The shared weight-update lifecycle (see the file comment). `apply` runs on the engine
  // thread with the engine paused.
  absl::StatusOr<AdminOutcome> RunWeightUpdate(
      const char* what, const UpdatePolicy& policy,
      const std::function<absl::Status(model::ModelRunner&)>& apply, bool failure_keeps_pause);
  void RefreshHealth();
  // RunWeightUpdate that pauses (retract) a running engine itself and resumes it on failure.
  absl::StatusOr<AdminOutcome> RunSelfPausingUpdate(
      const char* what, const UpdatePolicy& policy,
      const std::function<absl::Status(model::ModelRunner&)>& apply);
  // The group's receiver after checking every bucket against the served weights.
  absl::StatusOr<std::shared_ptr<weight_sync::WeightReceiver>> CheckedReceiver(
      const std::string& group_name, const std::vector<std::vector<model::TensorInfo>>& buckets);

  WorkerConfig config_;
  model_io::ModelConfig model_config_;
  std::string config_json_;
  WeightShapes weight_shapes_;
  std::string backend_name_;
  int64_t num_parameters_ = 0;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  // Destroyed after engine_ (whose shutdown still delivers finals to it), before tokenizer_.
  std::unique_ptr<BoundedExecutor> stream_executor_;
  SleepableRunner* runner_ = nullptr;  // owned by engine_; touched on the engine thread only
  std::unique_ptr<engine::Engine> engine_;
  WeightsChecker checker_;  // engine thread only
  std::atomic<bool> asleep_{false};
  std::atomic<int> updates_in_progress_{0};

  mutable absl::Mutex mu_;
  bool update_failed_ ABSL_GUARDED_BY(mu_) = false;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
  // Shared: a receive in flight holds its own reference, so DestroyWeightsUpdateGroup (which
  // closes the receiver: the receive fails promptly) never frees it under that call.
  std::map<std::string, std::shared_ptr<weight_sync::WeightReceiver>> groups_ ABSL_GUARDED_BY(mu_);
  // A receive PrepareWeightsUpdate posted; the thread writes `status` and `tensors`, read after
  // join (CompleteWeightsUpdate, DestroyWeightsUpdateGroup, Shutdown).
  struct PendingReceive {
    std::thread thread;
    absl::Status status;
    std::vector<NamedTensor> tensors;
  };
  std::map<std::string, std::unique_ptr<PendingReceive>> pending_ ABSL_GUARDED_BY(mu_);

  std::unique_ptr<WorkerMetrics> metrics_;

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
