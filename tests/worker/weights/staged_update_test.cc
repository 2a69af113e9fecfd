// Staged versions through rl.v1.Admin on an in-process rl-worker (stories260K), issue 30:
// StageWeights reads a checkpoint while the worker keeps serving the old weights, GetServerInfo
// reports it, ActivateWeights serves it (version, outputs, checksums of the files); a stage that
// is cut (a truncated file) or holds a NaN leaves nothing staged and activation then changes
// nothing; a version mismatch at activation keeps it staged; Drop frees it; the one-call disk
// update still works and leaves a staged version alone. Staged tensor streams (`stage` in the
// first message): staged, not served, until ActivateWeights; cut at every point (no end, bad
// counts, a refused chunk, cancelled) they leave nothing staged; one stage at a time.
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include "tests/testing/tensor_stream.h"
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
  // A stream of `down_proj` (layer 0) filled with `value`; its options `stage` and `version`.
  static std::vector<rl::v1::UpdateWeightsFromTensorRequest> DownProjStream(float value,
                                                                            int64_t version) {
    std::vector<float> values(64 * 172, value);
    const std::string data(reinterpret_cast<const char*>(values.data()), values.size() * 4);
    const size_t half = data.size() / 2;
    rl::v1::UpdateWeightsFromTensorRequest options;
    options.set_stage(true);
    if (version >= 0) options.set_weight_version(version);
    return ::rl::testing::StreamMessages(
        {::rl::testing::Chunk(kDownProj, {64, 172}, "F32", data.substr(0, half)),
         ::rl::testing::Chunk(kDownProj, {64, 172}, "F32", data.substr(half), half)},
        options);
  }
  grpc::Status SendStream(const std::vector<rl::v1::UpdateWeightsFromTensorRequest>& messages,
                          rl::v1::AdminResponse* resp) {
    grpc::ClientContext ctx;
    return ::rl::testing::SendMessages(*admin_, &ctx, messages, resp);
  }
  static constexpr char kDownProj[] = "model.layers.0.mlp.down_proj.weight";  // [64, 172] F32

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

// ---- staged tensor streams ----

TEST_F(StagedUpdateTest, AStagedTensorStreamServesOnlyOnceActivated) {
  const std::vector<int32_t> before = GreedyIds();
  const std::string sum_before = RankChecksum();
  rl::v1::AdminResponse resp;
  grpc::Status s = SendStream(DownProjStream(0.05f, 7), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.weight_version(), 0);
  EXPECT_NE(resp.message().find("staged as version 7"), std::string::npos) << resp.message();
  rl::v1::GetServerInfoResponse info = ServerInfo();
  EXPECT_TRUE(info.has_staged_weights());
  EXPECT_EQ(info.staged_weight_version(), 7);
  EXPECT_EQ(info.staged_source(), "tensor");
  EXPECT_EQ(info.staged_bytes(), 64 * 172 * 4);
  EXPECT_FALSE(info.staging());
  EXPECT_FALSE(info.paused());
  // Staged, not served.
  EXPECT_EQ(GreedyIds(), before);
  EXPECT_EQ(RankChecksum(), sum_before);
  EXPECT_EQ(server_->weight_version(), 0);
  // A version other than the staged one: refused, still staged.
  EXPECT_EQ(Activate(8, &resp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(ServerInfo().has_staged_weights());
  ASSERT_TRUE(Activate(7, &resp).ok());
  EXPECT_EQ(server_->weight_version(), 7);
  EXPECT_FALSE(ServerInfo().has_staged_weights());
  EXPECT_NE(GreedyIds(), before);
  const std::string staged_sum = RankChecksum();
  EXPECT_NE(staged_sum, sum_before);
  // The same stream applied in one call on a fresh worker gives the same weights.
  StartWorker();
  std::vector<rl::v1::UpdateWeightsFromTensorRequest> one_call = DownProjStream(0.05f, 7);
  one_call.front().set_stage(false);
  ASSERT_TRUE(SendStream(one_call, &resp).ok());
  EXPECT_EQ(RankChecksum(), staged_sum);
}

TEST_F(StagedUpdateTest, AStagedStreamCutAnywhereLeavesNothingStaged) {
  const std::string sum_before = RankChecksum();
  TempDir dir;
  WritePerturbedStories(dir.path(), "mlp.down_proj", 1.7f);
  rl::v1::AdminResponse resp;
  std::vector<rl::v1::UpdateWeightsFromTensorRequest> whole = DownProjStream(0.05f, 7);
  ASSERT_EQ(whole.size(), 2u);
  std::vector<float> nan(64 * 172, 0.05f);
  nan[100] = std::numeric_limits<float>::infinity();
  std::vector<rl::v1::UpdateWeightsFromTensorRequest> non_finite = DownProjStream(0.05f, 7);
  non_finite[0].mutable_chunk()->set_data(
      std::string(reinterpret_cast<const char*>(nan.data()), nan.size() * 2));
  std::vector<rl::v1::UpdateWeightsFromTensorRequest> bad_counts = whole;
  bad_counts.back().mutable_end()->set_num_bytes(1);
  std::vector<rl::v1::UpdateWeightsFromTensorRequest> no_end = whole;
  no_end.back().clear_end();
  const std::vector<std::pair<const char*, std::vector<rl::v1::UpdateWeightsFromTensorRequest>>>
      cuts = {{"no end", no_end},
              {"first half only", {no_end.front()}},
              {"bad counts", bad_counts},
              {"non-finite", non_finite}};
  for (const auto& [what, messages] : cuts) {
    SCOPED_TRACE(what);
    // A version staged before goes when the next stage begins (one staged version at most).
    ASSERT_TRUE(Stage(dir.path(), 3, &resp).ok());
    const grpc::Status s = SendStream(messages, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    const rl::v1::GetServerInfoResponse info = ServerInfo();
    EXPECT_FALSE(info.has_staged_weights());
    EXPECT_FALSE(info.staging());
    EXPECT_EQ(Activate(-1, &resp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_EQ(server_->weight_version(), 0);
    EXPECT_EQ(RankChecksum(), sum_before);
  }
  // Cancelled mid-stream by the client.
  {
    grpc::ClientContext ctx;
    auto writer = admin_->UpdateWeightsFromTensor(&ctx, &resp);
    ASSERT_TRUE(writer->Write(whole.front()));
    for (int i = 0; i < 2000 && !ServerInfo().staging(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    EXPECT_TRUE(ServerInfo().staging());  // the stream holds the staged slot meanwhile
    ctx.TryCancel();
    EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  for (int i = 0; i < 2000 && ServerInfo().staging(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_FALSE(ServerInfo().staging());
  EXPECT_FALSE(ServerInfo().has_staged_weights());
  EXPECT_EQ(RankChecksum(), sum_before);
  // The whole stream then stages.
  ASSERT_TRUE(SendStream(whole, &resp).ok());
  EXPECT_TRUE(ServerInfo().has_staged_weights());
}

TEST_F(StagedUpdateTest, OneStageAtATimeAndNoEngineOptionsOnAStage) {
  TempDir dir;
  WritePerturbedStories(dir.path(), "mlp.down_proj", 1.7f);
  rl::v1::AdminResponse resp;
  std::vector<rl::v1::UpdateWeightsFromTensorRequest> whole = DownProjStream(0.05f, 7);
  // A stream staging holds the slot: a second staged stream, a disk stage and a drop are refused.
  grpc::ClientContext ctx;
  rl::v1::AdminResponse open_resp;
  auto writer = admin_->UpdateWeightsFromTensor(&ctx, &open_resp);
  ASSERT_TRUE(writer->Write(whole.front()));
  for (int i = 0; i < 2000 && !ServerInfo().staging(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_TRUE(ServerInfo().staging());
  grpc::Status s = SendStream(DownProjStream(0.1f, 8), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("another stage is in progress"), std::string::npos);
  EXPECT_EQ(Stage(dir.path(), 9, &resp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(Call(&Stub::DropStagedWeights, rl::v1::DropStagedWeightsRequest(), &resp).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  // The open stream completes and is the staged version.
  ASSERT_TRUE(writer->Write(whole.back()));
  writer->WritesDone();
  s = writer->Finish();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(ServerInfo().staged_weight_version(), 7);
  // A later stage replaces it.
  ASSERT_TRUE(SendStream(DownProjStream(0.1f, 8), &resp).ok());
  EXPECT_EQ(ServerInfo().staged_weight_version(), 8);
  // Engine options belong to ActivateWeights.
  std::vector<rl::v1::UpdateWeightsFromTensorRequest> keep = DownProjStream(0.1f, 9);
  keep.front().set_keep_pause(true);
  s = SendStream(keep, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("belong to ActivateWeights"), std::string::npos);
  EXPECT_EQ(ServerInfo().staged_weight_version(), 8);  // a refused option stages nothing
  std::vector<rl::v1::UpdateWeightsFromTensorRequest> negative = DownProjStream(0.1f, 9);
  negative.front().set_weight_version(-2);
  EXPECT_EQ(SendStream(negative, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(Activate(8, &resp).ok());
  EXPECT_EQ(server_->weight_version(), 8);
}

}  // namespace
}  // namespace rl::worker::testing
