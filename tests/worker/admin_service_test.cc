// rl.v1.Admin on the worker. The executor's behaviour over fake control and weight units: a
// full admin executor answers RESOURCE_EXHAUSTED at once and runs nothing more; a server shut
// down with calls running and queued answers every one of them (none hangs, none is lost).
// Then, on an in-process rl-worker: sleep / wake through the Admin calls, and the admin and
// data-plane keys.
#include "services/worker/admin_service.h"

#include <atomic>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/server_runner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/worker/engine/engine.h"
#include "services/worker/weights/weights_checker.h"
#include "tests/testing/fake_runner.h"
#include "tests/worker/worker_test_util.h"

namespace rl::worker::testing {
namespace {

using ::testing::HasSubstr;
using Stub = rl::v1::Admin::Stub;

class SleepWakeTest : public WorkerFixture {
 protected:
  void SetUp() override { StartWorker(); }

  rl::v1::WeightsCheckerResponse Check(rl::v1::WeightsCheckerAction action) {
    rl::v1::WeightsCheckerRequest req;
    req.set_action(action);
    rl::v1::WeightsCheckerResponse resp;
    EXPECT_TRUE(Call(&Stub::WeightsChecker, req, &resp).ok());
    return resp;
  }

  grpc::Status UpdateFromDisk(const std::string& path, rl::v1::AdminResponse* resp) {
    rl::v1::UpdateWeightsFromDiskRequest req;
    req.set_model_path(path);
    return Call(&Stub::UpdateWeightsFromDisk, req, resp);
  }
};

TEST_F(SleepWakeTest, ReleaseAndResumeMemory) {
  const std::vector<int32_t> before = GreedyIds();
  // Changed-in-memory weights survive a sleep (spilled and restored).
  Check(rl::v1::WEIGHTS_CHECKER_ACTION_RESET_TENSORS);
  const auto sums = Check(rl::v1::WEIGHTS_CHECKER_ACTION_CHECKSUM);
  rl::v1::AdminResponse resp;
  ASSERT_TRUE(Call(&Stub::ReleaseMemory, rl::v1::ReleaseMemoryRequest(), &resp).ok());
  EXPECT_TRUE(ServerInfo().asleep());
  rl::v1::GenerateFinal f;
  EXPECT_EQ(Generate(Greedy(kPromptIds, 4), &f).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  ASSERT_TRUE(Call(&Stub::ResumeMemory, rl::v1::ResumeMemoryRequest(), &resp).ok());
  EXPECT_FALSE(ServerInfo().asleep());
  EXPECT_EQ(Check(rl::v1::WEIGHTS_CHECKER_ACTION_CHECKSUM).rank_sha256(), sums.rank_sha256());
  ASSERT_TRUE(UpdateFromDisk(Stories(), &resp).ok());
  ASSERT_TRUE(Call(&Stub::ReleaseMemory, rl::v1::ReleaseMemoryRequest(), &resp).ok());
  ASSERT_TRUE(Call(&Stub::ResumeMemory, rl::v1::ResumeMemoryRequest(), &resp).ok());
  EXPECT_EQ(GreedyIds(), before);
}

class AuthTest : public WorkerFixture {
 protected:
  void SetUp() override {
    WorkerConfig c;
    c.admin_api_key = "admin-key";
    c.api_key = "data-key";
    StartWorker(c);
  }
};

TEST_F(AuthTest, AdminAndDataKeys) {
  rl::v1::GetModelInfoResponse info;
  EXPECT_EQ(Call(&Stub::GetModelInfo, rl::v1::GetModelInfoRequest(), &info).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(Call(&Stub::GetModelInfo, rl::v1::GetModelInfoRequest(), &info, "data-key").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(Call(&Stub::GetModelInfo, rl::v1::GetModelInfoRequest(), &info, "admin-key").ok());
  rl::v1::AdminResponse resp;
  rl::v1::PauseGenerationRequest pause;
  pause.set_mode(rl::v1::PAUSE_MODE_IN_PLACE);
  EXPECT_EQ(Call(&Stub::PauseGeneration, pause, &resp).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_FALSE(server_->engine().GetServerInfo().paused);
  rl::v1::GenerateFinal f;
  EXPECT_EQ(Generate(Greedy(kPromptIds, 2), &f).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(Generate(Greedy(kPromptIds, 2), &f, nullptr, "data-key").ok());
}

}  // namespace
}  // namespace rl::worker::testing
