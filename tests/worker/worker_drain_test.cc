// WorkerServer::Drain (services/worker/worker_server.h), SIGTERM's first step, in process: the
// readiness service goes NOT_SERVING while liveness stays SERVING, new generations are refused
// UNAVAILABLE (the router retries them elsewhere), a request that runs is let finish within the
// grace period, and what is still active when it ends is aborted by Shutdown with its partial
// output.
#include <future>
#include <thread>

#include "gtest/gtest.h"
#include "tests/testing/grpc_health.h"
#include "tests/worker/worker_test_util.h"

namespace rl::worker::testing {
namespace {

using rl::testing::HealthStatus;

class WorkerDrainTest : public WorkerFixture {
 protected:
  // A greedy stream started; returns once its first chunk arrived, then the engine is paused in
  // place so the request stays running (with output) until Continue.
  struct HeldStream {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReader<rl::v1::GenerateResponse>> reader;
    std::vector<int32_t> streamed;
  };
  void StartHeld(HeldStream* h, int max_new_tokens) {
    rl::v1::GenerateRequest req = Greedy(kPromptIds, max_new_tokens);
    req.mutable_sampling_params()->set_ignore_eos(true);  // runs its whole budget
    h->reader = worker_->Generate(&h->ctx, req);
    rl::v1::GenerateResponse msg;
    ASSERT_TRUE(h->reader->Read(&msg));
    ASSERT_TRUE(msg.has_chunk());
    h->streamed.assign(msg.chunk().token_ids().begin(), msg.chunk().token_ids().end());
    rl::v1::PauseGenerationRequest pause;
    pause.set_mode(rl::v1::PAUSE_MODE_IN_PLACE);
    rl::v1::AdminResponse resp;
    ASSERT_TRUE(Call(&rl::v1::Admin::Stub::PauseGeneration, pause, &resp).ok());
    // Still running (a budget far beyond what one step makes): held by the pause.
    ASSERT_EQ(ServerInfo().num_running(), 1);
  }
  // Reads the held stream to its end; returns the final message.
  rl::v1::GenerateFinal Finish(HeldStream* h, grpc::Status* status) {
    rl::v1::GenerateResponse msg;
    rl::v1::GenerateFinal final_msg;
    while (h->reader->Read(&msg)) {
      if (msg.has_chunk()) {
        h->streamed.insert(h->streamed.end(), msg.chunk().token_ids().begin(),
                           msg.chunk().token_ids().end());
      }
      if (msg.has_final()) final_msg = msg.final();
    }
    *status = h->reader->Finish();
    return final_msg;
  }
};

TEST_F(WorkerDrainTest, RunningRequestFinishesWithinTheGracePeriod) {
  WorkerConfig config;
  config.drain_grace_s = 60;
  StartWorker(config);
  HeldStream held;
  ASSERT_NO_FATAL_FAILURE(StartHeld(&held, 400));
  auto drained = std::async(std::launch::async, [this] { return server_->Drain(); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (HealthStatus(channel_, "rl.v1.Worker") != "NOT_SERVING" &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(HealthStatus(channel_, "rl.v1.Worker"), "NOT_SERVING");
  EXPECT_EQ(HealthStatus(channel_, ""), "SERVING");  // liveness: the process is sound
  // New work is refused, retryably, with the reason.
  rl::v1::GenerateFinal refused;
  grpc::Status s = Generate(Greedy(kPromptIds, 4), &refused);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(s.error_message().find("draining"), std::string::npos) << s.error_message();
  // The request in flight is let finish: the drain waits for it.
  EXPECT_EQ(drained.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  rl::v1::ContinueGenerationRequest cont;
  rl::v1::AdminResponse resp;
  ASSERT_TRUE(Call(&rl::v1::Admin::Stub::ContinueGeneration, cont, &resp).ok());
  grpc::Status status;
  const rl::v1::GenerateFinal f = Finish(&held, &status);
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_NE(f.finish_reason(), rl::v1::FINISH_REASON_ABORT);
  EXPECT_EQ(f.output_ids_size(), 400);
  EXPECT_EQ(drained.get(), 0);
  server_->Shutdown();
}

TEST_F(WorkerDrainTest, WhatOutlivesTheGracePeriodIsAbortedWithItsPartialOutput) {
  WorkerConfig config;
  config.drain_grace_s = 0.2;
  StartWorker(config);
  HeldStream held;
  ASSERT_NO_FATAL_FAILURE(StartHeld(&held, 400));
  EXPECT_EQ(server_->Drain(), 1);  // still running (paused in place) when the grace ends
  std::thread stop([this] { server_->Shutdown(); });
  grpc::Status status;
  const rl::v1::GenerateFinal f = Finish(&held, &status);
  stop.join();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(f.finish_reason(), rl::v1::FINISH_REASON_ABORT);
  EXPECT_GE(f.output_ids_size(), 1);
  EXPECT_LT(f.output_ids_size(), 400);
  EXPECT_EQ(std::vector<int32_t>(f.output_ids().begin(), f.output_ids().end()), held.streamed);
}

}  // namespace
}  // namespace rl::worker::testing
