// Staged versions through rl.v1.Admin on an in-process rl-worker (stories260K), issue 30:
// StageWeights reads a checkpoint while the worker keeps serving the old weights, GetServerInfo
// reports it, ActivateWeights serves it (version, outputs, checksums of the files); a stage that
// is cut (a truncated file) or holds a NaN leaves nothing staged and activation then changes
// nothing; a version mismatch at activation keeps it staged; Drop frees it; the one-call disk
// update still works and leaves a staged version alone.
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include "tests/worker/worker_test_util.h"

namespace rl::worker::testing {
namespace {

using Stub = rl::v1::Admin::Stub;

class StagedUpdateTest : public WorkerFixture {
 protected:
  void SetUp() override { StartWorker(); }

  grpc::Status Stage(const std::string& path, int64_t version, rl::v1::AdminResponse* resp) {
    rl::v1::StageWeightsRequest req;
    req.set_model_path(path);
    if (version >= 0) req.set_weight_version(version);
    return Call(&Stub::StageWeights, req, resp);
  }
  grpc::Status Activate(int64_t version, rl::v1::AdminResponse* resp) {
    rl::v1::ActivateWeightsRequest req;
    if (version >= 0) req.set_weight_version(version);
    return Call(&Stub::ActivateWeights, req, resp);
  }
  std::string RankChecksum() {
    rl::v1::WeightsCheckerRequest req;
    req.set_action(rl::v1::WEIGHTS_CHECKER_ACTION_CHECKSUM);
    rl::v1::WeightsCheckerResponse resp;
    EXPECT_TRUE(Call(&Stub::WeightsChecker, req, &resp).ok());
    return resp.rank_sha256();
  }
};

TEST_F(StagedUpdateTest, StageServesTheOldWeightsUntilActivate) {
  TempDir dir;
  WritePerturbedStories(dir.path(), "mlp.down_proj", 1.7f);
  const std::vector<int32_t> before = GreedyIds();
  const std::string sum_before = RankChecksum();
  rl::v1::AdminResponse resp;
  ASSERT_TRUE(Stage(dir.path(), 5, &resp).ok());
  EXPECT_EQ(resp.weight_version(), 0);
  rl::v1::GetServerInfoResponse info = ServerInfo();
  EXPECT_TRUE(info.has_staged_weights());
  EXPECT_EQ(info.staged_weight_version(), 5);
  EXPECT_EQ(info.staged_source(), "disk:" + dir.path());
  EXPECT_GT(info.staged_bytes(), 0);
  EXPECT_FALSE(info.staging());
  // Staged, not served.
  EXPECT_EQ(GreedyIds(), before);
  EXPECT_EQ(RankChecksum(), sum_before);
  EXPECT_EQ(server_->weight_version(), 0);

  ASSERT_TRUE(Activate(-1, &resp).ok());
  EXPECT_EQ(resp.weight_version(), 5);
  EXPECT_EQ(server_->weight_version(), 5);
  EXPECT_NE(GreedyIds(), before);
  EXPECT_NE(RankChecksum(), sum_before);
  EXPECT_FALSE(ServerInfo().has_staged_weights());
  EXPECT_FALSE(ServerInfo().paused());
  rl::v1::GenerateFinal f;
  ASSERT_TRUE(Generate(Greedy(kPromptIds, 3), &f).ok());
  EXPECT_EQ(f.weight_version(), 5);
  EXPECT_EQ(f.cached_tokens(), 0);  // the prefix cache was flushed at activation
  // Nothing staged any more.
  grpc::Status s = Activate(-1, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("nothing is staged"), std::string::npos) << s.error_message();
}

TEST_F(StagedUpdateTest, ACutStageLeavesNothingStagedAndActivatesNothing) {
  TempDir good, cut;
  WritePerturbedStories(good.path(), "mlp.down_proj", 1.7f);
  WritePerturbedStories(cut.path(), "mlp.up_proj", 0.5f);
  // The checkpoint is cut short (a save interrupted mid-write).
  const std::string file = cut.path() + "/model.safetensors";
  std::filesystem::resize_file(file, std::filesystem::file_size(file) / 2);
  const std::vector<int32_t> before = GreedyIds();
  rl::v1::AdminResponse resp;
  // A version staged before is freed by the next stage (one staged version at most), so a cut
  // stage leaves nothing at all staged.
  ASSERT_TRUE(Stage(good.path(), 3, &resp).ok());
  grpc::Status s = Stage(cut.path(), 4, &resp);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.error_message().find("nothing is staged"), std::string::npos) << s.error_message();
  EXPECT_FALSE(ServerInfo().has_staged_weights());
  s = Activate(-1, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_EQ(server_->weight_version(), 0);
  EXPECT_EQ(GreedyIds(), before);
}

TEST_F(StagedUpdateTest, NonFiniteWeightsAreRefusedAtStaging) {
  TempDir nan;
  WritePerturbedStories(nan.path(), "mlp.down_proj", std::numeric_limits<float>::quiet_NaN());
  rl::v1::AdminResponse resp;
  const grpc::Status s = Stage(nan.path(), 2, &resp);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.error_message().find("NaN"), std::string::npos) << s.error_message();
  EXPECT_FALSE(ServerInfo().has_staged_weights());
}

TEST_F(StagedUpdateTest, AVersionMismatchKeepsItStagedAndDropFreesIt) {
  TempDir dir;
  WritePerturbedStories(dir.path(), "mlp.down_proj", 1.7f);
  const std::vector<int32_t> before = GreedyIds();
  rl::v1::AdminResponse resp;
  ASSERT_TRUE(Stage(dir.path(), 5, &resp).ok());
  grpc::Status s = Activate(6, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("the staged version is 5, not 6"), std::string::npos)
      << s.error_message();
  EXPECT_TRUE(ServerInfo().has_staged_weights());
  EXPECT_EQ(server_->weight_version(), 0);
  ASSERT_TRUE(Call(&Stub::DropStagedWeights, rl::v1::DropStagedWeightsRequest(), &resp).ok());
  EXPECT_FALSE(ServerInfo().has_staged_weights());
  EXPECT_EQ(Activate(5, &resp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(GreedyIds(), before);
  EXPECT_EQ(Stage(dir.path(), -1, &resp).ok(), true);
  rl::v1::StageWeightsRequest neg;
  neg.set_model_path(dir.path());
  neg.set_weight_version(-3);
  EXPECT_EQ(Call(&Stub::StageWeights, neg, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// Activation pauses by itself: requests queued behind an in-place pause are retracted, not a
// reason to refuse, and go on with the new weights.
TEST_F(StagedUpdateTest, ActivateRetractsActiveRequestsWhichGoOnWithTheNewVersion) {
  TempDir dir;
  WritePerturbedStories(dir.path(), "mlp.down_proj", 1.7f);
  rl::v1::AdminResponse resp;
  ASSERT_TRUE(Stage(dir.path(), 9, &resp).ok());
  rl::v1::PauseGenerationRequest pause;
  pause.set_mode(rl::v1::PAUSE_MODE_IN_PLACE);
  ASSERT_TRUE(Call(&Stub::PauseGeneration, pause, &resp).ok());
  rl::v1::GenerateFinal f;
  std::jthread t([&] { EXPECT_TRUE(Generate(Greedy(kPromptIds, 8), &f).ok()); });
  for (int i = 0; i < 2000 && ServerInfo().num_waiting() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(Activate(9, &resp).ok());
  t.join();
  EXPECT_EQ(f.finish_reason(), rl::v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(f.weight_version(), 9);
  EXPECT_FALSE(ServerInfo().paused());
}

// The one-call disk update reads before it pauses and leaves a staged version staged.
TEST_F(StagedUpdateTest, OneCallUpdateLeavesAStagedVersionAlone) {
  TempDir staged, direct;
  WritePerturbedStories(staged.path(), "mlp.down_proj", 1.7f);
  WritePerturbedStories(direct.path(), "mlp.up_proj", 0.5f);
  rl::v1::AdminResponse resp;
  ASSERT_TRUE(Stage(staged.path(), 4, &resp).ok());
  rl::v1::UpdateWeightsFromDiskRequest req;
  req.set_model_path(direct.path());
  req.set_weight_version(2);
  ASSERT_TRUE(Call(&Stub::UpdateWeightsFromDisk, req, &resp).ok());
  EXPECT_EQ(server_->weight_version(), 2);
  EXPECT_TRUE(ServerInfo().has_staged_weights());
  ASSERT_TRUE(Activate(4, &resp).ok());
  EXPECT_EQ(server_->weight_version(), 4);
}

}  // namespace
}  // namespace rl::worker::testing
