// WorkerServer: one model replica as a process. Owns the model description, the gRPC services
// (Worker data plane, Admin control plane, health, reflection) and the metrics endpoint.
// Thread-safe: gRPC handlers call into it concurrently.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/auth.h"
#include "common/metrics.h"
#include "common/metrics_http.h"
#include "common/model_io/model_config.h"
#include "common/server_runner.h"
#include "rl/v1/admin.pb.h"
#include "services/worker/worker_config.h"

namespace rl::worker {

class AdminService;
class WorkerService;

class WorkerServer {
 public:
  // Loads the model description and starts serving. Errors name the bad flag or file.
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Start(const WorkerConfig& config);
  ~WorkerServer();

  // "HOST:PORT" of the gRPC listener.
  std::string address() const { return grpc_->address(); }
  int metrics_port() const { return metrics_http_ ? metrics_http_->port() : -1; }
  void Shutdown();

  // Domain calls used by the services.
  void FillModelInfo(rl::v1::GetModelInfoResponse* out) const;
  void FillServerInfo(rl::v1::GetServerInfoResponse* out) const;
  int64_t weight_version() const { return weight_version_.load(); }
  MetricsRegistry& metrics() { return metrics_; }

 private:
  WorkerServer() = default;

  WorkerConfig config_;
  model_io::ModelConfig model_config_;
  std::string config_json_;
  std::atomic<int64_t> weight_version_{0};
  MetricsRegistry metrics_;
  std::unique_ptr<BearerAuth> admin_auth_;
  std::unique_ptr<BearerAuth> data_auth_;
  std::unique_ptr<WorkerService> worker_service_;
  std::unique_ptr<AdminService> admin_service_;
  std::unique_ptr<GrpcServer> grpc_;
  std::unique_ptr<MetricsHttpServer> metrics_http_;
};

}  // namespace rl::worker
