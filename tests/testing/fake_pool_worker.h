// FakePoolWorker: an in-process stand-in for an rl-worker as the router's pool sees it, on
// 127.0.0.1:0: gRPC health (SetServing), rl.v1.Worker.GetLoad with a weight version the test
// sets (or UNAUTHENTICATED, as a worker with a data-plane key answers a caller without one, or
// held until the test releases it), and Generate answered at once by FakeWorker. For pool,
// health-check and router-service tests that need no model.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/server_runner.h"
#include "grpcpp/grpcpp.h"
#include "rl/v1/worker.grpc.pb.h"
#include "tests/testing/fake_worker.h"

namespace rl::router::testing {

// FakeWorker (Generate) with a GetLoad that reports `weight_version`.
class VersionedFakeWorker final : public rl::v1::Worker::CallbackService {
 public:
  explicit VersionedFakeWorker(FakeWorkerOptions options = {}) : generate_(options) {}

  grpc::ServerWriteReactor<rl::v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* ctx, const rl::v1::GenerateRequest* req) override {
    return generate_.Generate(ctx, req);
  }
  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* ctx, const rl::v1::GetLoadRequest*,
                                    rl::v1::GetLoadResponse* resp) override {
    get_loads.fetch_add(1);
    if (hold_get_loads.load()) return held_get_loads.Take(ctx, resp);  // answered on Release
    auto* r = ctx->DefaultReactor();
    if (require_key.load()) {
      r->Finish(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing bearer key"));
      return r;
    }
    resp->set_weight_version(weight_version.load());
    resp->set_paused(paused.load());
    {
      absl::MutexLock lock(&identity_mu_);
      resp->set_instance_id(instance_id_);
      resp->set_weights_sha256(weights_sha256_);
    }
    r->Finish(grpc::Status::OK);
    return r;
  }

  FakeWorker& generate() { return generate_; }
  // GetLoad's instance_id and weights_sha256 ("" each until set).
  void SetIdentity(const std::string& instance_id, const std::string& weights_sha256) {
    absl::MutexLock lock(&identity_mu_);
    instance_id_ = instance_id;
    weights_sha256_ = weights_sha256;
  }
  std::atomic<int64_t> weight_version{0};
  std::atomic<bool> paused{false};  // GetLoad's paused
  std::atomic<bool> require_key{false};
  std::atomic<int> get_loads{0};
  // While set, GetLoad calls wait in `held_get_loads` until its Release (which the test must
  // call before the server stops).
  std::atomic<bool> hold_get_loads{false};
  HeldCalls<rl::v1::GetLoadResponse> held_get_loads;

 private:
  FakeWorker generate_;
  absl::Mutex identity_mu_;
  std::string instance_id_ ABSL_GUARDED_BY(identity_mu_);
  std::string weights_sha256_ ABSL_GUARDED_BY(identity_mu_);
};

// One fake worker process: the service above behind a GrpcServer (health included).
class FakePoolWorker {
 public:
  explicit FakePoolWorker(FakeWorkerOptions options = {}) : service_(options) {
    ServerOptions so;
    so.drain = std::chrono::milliseconds(100);
    auto s = GrpcServer::Start(so, {&service_});
    if (s.ok()) server_ = *std::move(s);
  }
  ~FakePoolWorker() { Stop(); }
  FakePoolWorker(const FakePoolWorker&) = delete;
  FakePoolWorker& operator=(const FakePoolWorker&) = delete;

  bool ok() const { return server_ != nullptr; }
  std::string address() const { return address_.empty() ? server_->address() : address_; }
  VersionedFakeWorker& service() { return service_; }
  void SetVersion(int64_t v) { service_.weight_version.store(v); }
  void SetPaused(bool paused) { service_.paused.store(paused); }
  void SetIdentity(const std::string& instance_id, const std::string& weights_sha256) {
    service_.SetIdentity(instance_id, weights_sha256);
  }
  // The overall health status (liveness; a worker without a readiness service: also readiness).
  void SetServing(bool serving) { server_->SetServing(serving); }
  // The readiness service `rl.v1.Worker`, as a real rl-worker reports it (unset: NOT_FOUND).
  void SetReady(bool ready) { server_->SetServiceServing("rl.v1.Worker", ready); }
  // Shuts the server down (the address stays known); calls to it then fail.
  void Stop() {
    if (server_ == nullptr) return;
    address_ = server_->address();
    server_->Shutdown();
    server_.reset();
  }

 private:
  VersionedFakeWorker service_;
  std::unique_ptr<GrpcServer> server_;
  std::string address_;
};

}  // namespace rl::router::testing
