// Router test helpers: a tiny in-process rl-worker (stories260K) and an rl-router over a list of
// workers, both on 127.0.0.1:0 with fast health checks and retries; RouterFleetTest, the fixture
// of a router over N such workers with the calls its tests make; the process's thread count.
#pragma once

#include <dirent.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "rl/v1/admin.grpc.pb.h"
#include "rl/v1/router.grpc.pb.h"
#include "services/router/router_server.h"
#include "services/worker/worker_server.h"
#include "tests/testing/test_data.h"

namespace rl::router::testing {

// Threads of this process now (/proc/self/task).
inline int CountThreads() {
  int n = 0;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

// An rl-worker on stories260K (or `model`), port 0, a small KV cache and one thread; other
// fields of `wc` are kept.
inline absl::StatusOr<std::unique_ptr<worker::WorkerServer>> StartTestWorker(
    worker::WorkerConfig wc = {}, const std::string& model = "") {
  wc.model_path = model.empty() ? rl::testing::Stories() : model;
  wc.port = 0;
  wc.kv_cache_gb = 0.01;
  wc.num_threads = 1;
  return worker::WorkerServer::Start(wc);
}

// An rl-router over `config.workers` with the stories260K tokenizer (or `model`'s), health
// checks every 100 ms and 10 ms retry backoff; other fields of `config` are kept.
inline absl::StatusOr<std::unique_ptr<RouterServer>> StartTestRouter(
    RouterConfig config, const std::string& model = "") {
  config.tokenizer_path = model.empty() ? rl::testing::Stories() : model;
  config.health_interval_ms = 100;
  config.retry_backoff_ms = 10;
  return RouterServer::Start(config);
}

// A router over `num_workers` in-process workers, with stubs for its Router and Admin services.
class RouterFleetTest : public ::testing::Test {
 protected:
  void StartFleet(int num_workers, RouterConfig config = {}, worker::WorkerConfig wc = {}) {
    for (int i = 0; i < num_workers; ++i) {
      auto w = StartTestWorker(wc);
      ASSERT_TRUE(w.ok()) << w.status();
      config.workers.push_back((*w)->address());
      workers_.push_back(*std::move(w));
    }
    auto r = StartTestRouter(config);
    ASSERT_TRUE(r.ok()) << r.status();
    router_ = *std::move(r);
    auto channel = grpc::CreateChannel(router_->address(), grpc::InsecureChannelCredentials());
    stub_ = rl::v1::Router::NewStub(channel);
    admin_ = rl::v1::Admin::NewStub(channel);
  }

  void TearDown() override {
    if (router_) router_->Shutdown();
    for (auto& w : workers_) w->Shutdown();
  }

  // One more worker, not in the fleet yet (null on failure, with the test failed).
  static std::unique_ptr<worker::WorkerServer> StartWorker() {
    auto w = StartTestWorker();
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? *std::move(w) : nullptr;
  }

  // A whole Generate stream (bounded: 120 s); the final message into `f`, the streamed text
  // into `streamed_text` when given.
  grpc::Status Generate(const rl::v1::GenerateRequest& req, rl::v1::GenerateFinal* f,
                        std::string* streamed_text = nullptr, const std::string& key = "") {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    if (!key.empty()) ctx.AddMetadata("authorization", "Bearer " + key);
    auto reader = stub_->Generate(&ctx, req);
    rl::v1::GenerateResponse msg;
    while (reader->Read(&msg)) {
      if (msg.has_chunk() && streamed_text) *streamed_text += msg.chunk().text();
      if (msg.has_final()) *f = msg.final();
    }
    return reader->Finish();
  }

  // Greedy generation of `text` with logprobs (and the trajectory unless told otherwise).
  static rl::v1::GenerateRequest TextRequest(const std::string& text, int max_new_tokens,
                                             bool trajectory = true) {
    rl::v1::GenerateRequest req;
    req.set_text(text);
    req.mutable_sampling_params()->set_temperature(0);
    req.mutable_sampling_params()->set_max_new_tokens(max_new_tokens);
    req.set_return_logprob(true);
    req.set_return_trajectory(trajectory);
    return req;
  }

  rl::v1::WorkerListResponse ListWorkers() {
    rl::v1::WorkerListResponse resp;
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub_->ListWorkers(&ctx, {}, &resp).ok());
    return resp;
  }

  // One worker's line of ListWorkers (the test fails when it is not listed).
  rl::v1::WorkerStatus Status(const std::string& address) {
    const rl::v1::WorkerListResponse listing = ListWorkers();
    for (const auto& w : listing.workers()) {
      if (w.address() == address) return w;
    }
    ADD_FAILURE() << "no worker " << address;
    return {};
  }

  void AddWorker(const std::string& address) {
    rl::v1::AddWorkerRequest req;
    req.set_address(address);
    rl::v1::WorkerListResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->AddWorker(&ctx, req, &resp).ok());
  }

  // Polls until `pred` holds (bounded: 30 s).
  template <typename Pred>
  static bool WaitFor(Pred pred) {
    for (int i = 0; i < 300; ++i) {
      if (pred()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  std::vector<std::unique_ptr<worker::WorkerServer>> workers_;
  std::unique_ptr<RouterServer> router_;
  std::unique_ptr<rl::v1::Router::Stub> stub_;
  std::unique_ptr<rl::v1::Admin::Stub> admin_;
};

}  // namespace rl::router::testing
