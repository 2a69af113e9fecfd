// Weight updates (disk, tensors), the weights checker and ListWeights through rl.v1.Admin on an
// in-process rl-worker (sleep / wake and auth: tests/worker/admin_service_test.cc).
#include <thread>

#include "services/worker/weights/weights_checker.h"
#include "tests/testing/tensor_stream.h"
#include "tests/worker/worker_test_util.h"

namespace rl::worker::testing {
namespace {

using Stub = rl::v1::Admin::Stub;

// The digests a checkpoint folder's files give, computed the way the checker does.
std::map<std::string, std::string> FileDigests(const std::string& dir) {
  std::map<std::string, std::string> out;
  auto ckpt = model_io::OpenCheckpoint(dir);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status();
  for (const auto& [name, t] : ckpt->tensors()) {
    out[name] = TensorDigest({name, model_io::DTypeName(t.dtype), t.shape}, t.data);
  }
  return out;
}

class WeightsUpdateTest : public WorkerFixture {
 protected:
  void SetUp() override { StartWorker(); }

  rl::v1::WeightsCheckerResponse Check(rl::v1::WeightsCheckerAction action) {
    rl::v1::WeightsCheckerRequest req;
    req.set_action(action);
    rl::v1::WeightsCheckerResponse resp;
    EXPECT_TRUE(Call(&Stub::WeightsChecker, req, &resp).ok());
    return resp;
  }

  grpc::Status UpdateFromDisk(const std::string& path, rl::v1::AdminResponse* resp,
                              bool abort_all = false) {
    rl::v1::UpdateWeightsFromDiskRequest req;
    req.set_model_path(path);
    req.set_abort_all_requests(abort_all);
    return Call(&Stub::UpdateWeightsFromDisk, req, resp);
  }
};

TEST_F(WeightsUpdateTest, FromDiskChangesOutputsVersionAndChecksums) {
  TempDir dir;
  WritePerturbedStories(dir.path(), "mlp.down_proj", 1.7f);
  const std::vector<int32_t> before = GreedyIds();
  rl::v1::AdminResponse resp;
  ASSERT_TRUE(UpdateFromDisk(dir.path(), &resp).ok());
  EXPECT_EQ(resp.weight_version(), 1);
  EXPECT_EQ(server_->weight_version(), 1);
  const std::vector<int32_t> after = GreedyIds();
  EXPECT_NE(before, after);
  rl::v1::GenerateFinal f;
  ASSERT_TRUE(Generate(Greedy(kPromptIds, 3), &f).ok());
  EXPECT_EQ(f.weight_version(), 1);
  EXPECT_EQ(f.cached_tokens(), 0);  // nothing cached under the old weights is reused

  const auto sums = Check(rl::v1::WEIGHTS_CHECKER_ACTION_CHECKSUM);
  const auto files = FileDigests(dir.path());
  ASSERT_EQ(sums.tensor_sha256().size(), files.size());
  for (const auto& [name, digest] : files) EXPECT_EQ(sums.tensor_sha256().at(name), digest) << name;
  EXPECT_EQ(sums.rank_sha256(), RankDigest(files));

  rl::v1::GetModelInfoResponse info;
  ASSERT_TRUE(Call(&Stub::GetModelInfo, rl::v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.weight_version(), 1);

  // Back to the original file restores the original outputs; explicit versions are kept.
  rl::v1::UpdateWeightsFromDiskRequest req;
  req.set_model_path(Stories());
  req.set_weight_version(7);
  ASSERT_TRUE(Call(&Stub::UpdateWeightsFromDisk, req, &resp).ok());
  EXPECT_EQ(resp.weight_version(), 7);
  EXPECT_EQ(GreedyIds(), before);
}

TEST_F(WeightsUpdateTest, BadUpdatesLeaveTheOldWeightsServing) {
  const std::vector<int32_t> before = GreedyIds();
  rl::v1::AdminResponse resp;
  grpc::Status s = UpdateFromDisk("/nonexistent/model", &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("model_path"), std::string::npos);

  TempDir missing;
  WritePerturbedStories(missing.path(), "x", 1.0f, "model.layers.2.mlp.up_proj.weight");
  s = UpdateFromDisk(missing.path(), &resp);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.error_message().find("model.layers.2.mlp.up_proj.weight"), std::string::npos)
      << s.error_message();

  EXPECT_EQ(server_->weight_version(), 0);
  EXPECT_FALSE(ServerInfo().paused());
  EXPECT_EQ(GreedyIds(), before);
}

TEST_F(WeightsUpdateTest, RefusedWhileActiveUnlessAbortOrRetract) {
  rl::v1::GenerateRequest req = Greedy(kPromptIds, 400);
  req.mutable_sampling_params()->set_ignore_eos(true);
  rl::v1::GenerateFinal f;
  rl::v1::PauseGenerationRequest pause;
  pause.set_mode(rl::v1::PAUSE_MODE_IN_PLACE);
  rl::v1::AdminResponse resp;
  ASSERT_TRUE(Call(&Stub::PauseGeneration, pause, &resp).ok());
  std::jthread t([&] { EXPECT_TRUE(Generate(req, &f).ok()); });
  for (int i = 0; i < 2000 && ServerInfo().num_waiting() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  grpc::Status s = UpdateFromDisk(Stories(), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("abort_all_requests"), std::string::npos);
  ASSERT_TRUE(UpdateFromDisk(Stories(), &resp, /*abort_all=*/true).ok());
  t.join();
  EXPECT_EQ(f.finish_reason(), rl::v1::FINISH_REASON_ABORT);
  EXPECT_EQ(resp.num_aborted(), 1);
  EXPECT_FALSE(ServerInfo().paused());  // resumed (no keep_pause)
}

TEST_F(WeightsUpdateTest, KeepPauseStaysPaused) {
  rl::v1::UpdateWeightsFromDiskRequest req;
  req.set_model_path(Stories());
  req.set_keep_pause(true);
  rl::v1::AdminResponse resp;
  ASSERT_TRUE(Call(&Stub::UpdateWeightsFromDisk, req, &resp).ok());
  EXPECT_TRUE(ServerInfo().paused());
}

TEST_F(WeightsUpdateTest, FromTensorAppliesAtomically) {
  const std::vector<int32_t> before = GreedyIds();
  Check(rl::v1::WEIGHTS_CHECKER_ACTION_SNAPSHOT);
  const std::string name = "model.layers.0.mlp.down_proj.weight";  // [64, 172] float32
  std::vector<float> values(64 * 172, 0.05f);
  const auto* bytes = reinterpret_cast<const char*>(values.data());
  const size_t half = values.size() * 2;

  auto send = [&](const std::vector<rl::v1::TensorChunk>& chunks, rl::v1::AdminResponse* resp) {
    grpc::ClientContext ctx;
    return ::rl::testing::SendTensorStream(*admin_, &ctx, chunks, resp);
  };
  auto chunk = [&](const std::string& n, std::vector<int64_t> shape, size_t off, size_t len) {
    rl::v1::TensorChunk c;
    c.set_name(n);
    c.set_dtype("F32");
    for (int64_t d : shape) c.add_shape(d);
    c.set_offset(off);
    c.set_data(std::string(bytes + off, len));
    return c;
  };
  rl::v1::AdminResponse resp;
  // A good tensor plus a mis-shaped one: the whole update is rejected.
  grpc::Status s = send({chunk(name, {64, 172}, 0, half), chunk(name, {64, 172}, half, half),
                         chunk("model.norm.weight", {65}, 0, 65 * 4)},
                        &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("model.norm.weight"), std::string::npos);
  EXPECT_TRUE(Check(rl::v1::WEIGHTS_CHECKER_ACTION_COMPARE).changed().empty());
  EXPECT_EQ(GreedyIds(), before);
  // An incomplete tensor is rejected too.
  s = send({chunk(name, {64, 172}, 0, half)}, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("incomplete"), std::string::npos);
  // Two chunks of one tensor: applied.
  ASSERT_TRUE(
      send({chunk(name, {64, 172}, half, half), chunk(name, {64, 172}, 0, half)}, &resp).ok());
  EXPECT_EQ(resp.weight_version(), 1);
  const auto cmp = Check(rl::v1::WEIGHTS_CHECKER_ACTION_COMPARE);
  EXPECT_EQ(std::vector<std::string>(cmp.changed().begin(), cmp.changed().end()),
            std::vector<std::string>{name});
  EXPECT_NE(GreedyIds(), before);
}

TEST_F(WeightsUpdateTest, CheckerSnapshotResetCompare) {
  rl::v1::WeightsCheckerRequest req;  // compare before any snapshot
  req.set_action(rl::v1::WEIGHTS_CHECKER_ACTION_COMPARE);
  rl::v1::WeightsCheckerResponse resp;
  EXPECT_EQ(Call(&Stub::WeightsChecker, req, &resp).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  Check(rl::v1::WEIGHTS_CHECKER_ACTION_SNAPSHOT);
  EXPECT_TRUE(Check(rl::v1::WEIGHTS_CHECKER_ACTION_COMPARE).changed().empty());
  Check(rl::v1::WEIGHTS_CHECKER_ACTION_RESET_TENSORS);
  const auto r = Check(rl::v1::WEIGHTS_CHECKER_ACTION_COMPARE);
  rl::v1::ListWeightsResponse list;
  ASSERT_TRUE(Call(&Stub::ListWeights, rl::v1::ListWeightsRequest(), &list).ok());
  EXPECT_EQ(list.weights_size(), 2 + 5 * 9);  // embed, final norm, 9 per layer (tied head)
  EXPECT_EQ(r.changed_size(), list.weights_size());
  EXPECT_TRUE(r.missing().empty() && r.unexpected().empty());
  // Reloading the file brings every digest back.
  rl::v1::AdminResponse a;
  ASSERT_TRUE(UpdateFromDisk(Stories(), &a).ok());
  EXPECT_TRUE(Check(rl::v1::WEIGHTS_CHECKER_ACTION_COMPARE).changed().empty());
  req.set_action(rl::v1::WEIGHTS_CHECKER_ACTION_UNSPECIFIED);
  EXPECT_EQ(Call(&Stub::WeightsChecker, req, &resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace rl::worker::testing
