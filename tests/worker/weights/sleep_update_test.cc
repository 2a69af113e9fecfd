// Weight updates while asleep (ReleaseMemory): from disk and from tensors, staged and served on
// wake, with the version bumped at the update and the checker digests matching an awake
// update of the same weights; bad updates are refused while asleep and leave the old weights.
#include "services/worker/weights/weights_checker.h"
#include "tests/testing/tensor_stream.h"
#include "tests/worker/worker_test_util.h"

namespace rl::worker::testing {
namespace {

using Stub = rl::v1::Admin::Stub;

class SleepUpdateTest : public WorkerFixture {
 protected:
  void SetUp() override { StartWorker(); }

  std::string Checksum() {
    rl::v1::WeightsCheckerRequest req;
    req.set_action(rl::v1::WEIGHTS_CHECKER_ACTION_CHECKSUM);
    rl::v1::WeightsCheckerResponse resp;
    grpc::Status s = Call(&Stub::WeightsChecker, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.rank_sha256();
  }
  grpc::Status UpdateFromDisk(const std::string& path, rl::v1::AdminResponse* resp) {
    rl::v1::UpdateWeightsFromDiskRequest req;
    req.set_model_path(path);
    return Call(&Stub::UpdateWeightsFromDisk, req, resp);
  }
  grpc::Status SendTensor(const std::string& name, const std::vector<int64_t>& shape,
                          const std::vector<float>& values, rl::v1::AdminResponse* resp) {
    grpc::ClientContext ctx;
    return ::rl::testing::SendTensorStream(
        *admin_, &ctx,
        {::rl::testing::Chunk(
            name, shape, "F32",
            std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4))},
        resp);
  }
  void Sleep() {
    rl::v1::AdminResponse resp;
    ASSERT_TRUE(Call(&Stub::ReleaseMemory, rl::v1::ReleaseMemoryRequest(), &resp).ok());
    ASSERT_TRUE(ServerInfo().asleep());
  }
  void Wake() {
    rl::v1::AdminResponse resp;
    grpc::Status s = Call(&Stub::ResumeMemory, rl::v1::ResumeMemoryRequest(), &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_FALSE(ServerInfo().asleep());
  }
};

TEST_F(SleepUpdateTest, DiskUpdateWhileAsleepServesOnWake) {
  TempDir dir;
  WritePerturbedStories(dir.path(), "mlp.down_proj", 1.7f);
  // The reference: the same update applied awake.
  rl::v1::AdminResponse resp;
  ASSERT_TRUE(UpdateFromDisk(dir.path(), &resp).ok());
  const std::string updated_sum = Checksum();
  const std::vector<int32_t> updated_ids = GreedyIds();
  ASSERT_TRUE(UpdateFromDisk(Stories(), &resp).ok());  // v2, the original weights
  const std::vector<int32_t> original_ids = GreedyIds();
  ASSERT_NE(updated_ids, original_ids);

  Sleep();
  grpc::Status s = UpdateFromDisk(dir.path(), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.weight_version(), 3);  // bumped at the update
  EXPECT_EQ(ServerInfo().weight_version(), 3);
  EXPECT_TRUE(ServerInfo().asleep());  // still asleep: staged
  rl::v1::GenerateFinal f;
  EXPECT_EQ(Generate(Greedy(kPromptIds, 2), &f).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  // Bad folders are refused while asleep and change nothing.
  EXPECT_EQ(UpdateFromDisk("/nonexistent", &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  TempDir empty;
  EXPECT_FALSE(UpdateFromDisk(empty.path(), &resp).ok());
  EXPECT_EQ(ServerInfo().weight_version(), 3);
  Wake();
  EXPECT_EQ(Checksum(), updated_sum);
  EXPECT_EQ(GreedyIds(), updated_ids);
  ASSERT_TRUE(Generate(Greedy(kPromptIds, 2), &f).ok());
  EXPECT_EQ(f.weight_version(), 3);
}

// A trainer that saves its next checkpoint over the folder the worker loaded while the worker
// sleeps: waking would serve those weights under the old version, so ResumeMemory refuses and
// the worker stays asleep; a disk update of the folder as it is now then wakes it with it.
TEST_F(SleepUpdateTest, FolderRewrittenWhileAsleepIsRefusedOnWake) {
  TempDir dir;
  WritePerturbedStories(dir.path(), "mlp.down_proj", 1.7f);
  rl::v1::AdminResponse resp;
  ASSERT_TRUE(UpdateFromDisk(dir.path(), &resp).ok());
  const std::vector<int32_t> loaded_ids = GreedyIds();
  const int64_t version = ServerInfo().weight_version();
  Sleep();
  WritePerturbedStories(dir.path(), "mlp.down_proj", 0.3f);
  grpc::Status s = Call(&Stub::ResumeMemory, rl::v1::ResumeMemoryRequest(), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("changed on disk"), std::string::npos) << s.error_message();
  EXPECT_TRUE(ServerInfo().asleep());
  EXPECT_EQ(ServerInfo().weight_version(), version);

  ASSERT_TRUE(UpdateFromDisk(dir.path(), &resp).ok());  // staged
  Wake();
  const std::string woken_sum = Checksum();
  const std::vector<int32_t> woken_ids = GreedyIds();
  EXPECT_NE(woken_ids, loaded_ids);
  ASSERT_TRUE(UpdateFromDisk(dir.path(), &resp).ok());  // the same folder, awake
  EXPECT_EQ(Checksum(), woken_sum);
  EXPECT_EQ(GreedyIds(), woken_ids);

  // A staged folder rewritten before the wake is refused the same way.
  Sleep();
  TempDir next;
  WritePerturbedStories(next.path(), "mlp.down_proj", 1.7f);
  ASSERT_TRUE(UpdateFromDisk(next.path(), &resp).ok());
  WritePerturbedStories(next.path(), "mlp.down_proj", 0.9f);
  s = Call(&Stub::ResumeMemory, rl::v1::ResumeMemoryRequest(), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_TRUE(ServerInfo().asleep());
}

TEST_F(SleepUpdateTest, TensorUpdateWhileAsleepServesOnWake) {
  const std::string name = "model.layers.0.mlp.down_proj.weight";  // [64, 172] float32
  const std::vector<float> values(64 * 172, 0.05f);
  rl::v1::AdminResponse resp;
  const std::string original_sum = Checksum();
  ASSERT_TRUE(SendTensor(name, {64, 172}, values, &resp).ok());
  const std::string updated_sum = Checksum();
  const std::vector<int32_t> updated_ids = GreedyIds();
  ASSERT_NE(updated_sum, original_sum);
  ASSERT_TRUE(UpdateFromDisk(Stories(), &resp).ok());
  ASSERT_EQ(Checksum(), original_sum);

  Sleep();
  // A mis-shaped tensor is refused while asleep.
  EXPECT_EQ(SendTensor(name, {172, 64}, values, &resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  grpc::Status s = SendTensor(name, {64, 172}, values, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.weight_version(), 3);
  Wake();
  EXPECT_EQ(Checksum(), updated_sum);
  EXPECT_EQ(GreedyIds(), updated_ids);
  // The staged tensor survives another sleep (spilled) like any in-memory change.
  Sleep();
  Wake();
  EXPECT_EQ(Checksum(), updated_sum);
}

// A stream of every weight (activated by a swap while awake, issue 30) is copied into the
// sleeping runner's staged tensors instead, and served on wake.
TEST_F(SleepUpdateTest, FullStateTensorStreamWhileAsleepServesOnWake) {
  TempDir perturbed;
  WritePerturbedStories(perturbed.path(), "attn", 1.5f);
  auto ckpt = model_io::OpenCheckpoint(perturbed.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  std::vector<rl::v1::TensorChunk> chunks;
  for (const auto& [name, t] : ckpt->tensors()) {
    chunks.push_back(::rl::testing::Chunk(
        name, t.shape, std::string(model_io::DTypeName(t.dtype)),
        std::string(reinterpret_cast<const char*>(t.data.data()), t.data.size())));
  }
  rl::v1::AdminResponse resp;
  const std::string original_sum = Checksum();
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(::rl::testing::SendTensorStream(*admin_, &ctx, chunks, &resp).ok());
  }
  const std::string perturbed_sum = Checksum();
  ASSERT_NE(perturbed_sum, original_sum);
  ASSERT_TRUE(UpdateFromDisk(Stories(), &resp).ok());
  ASSERT_EQ(Checksum(), original_sum);
  Sleep();
  grpc::ClientContext ctx;
  grpc::Status s = ::rl::testing::SendTensorStream(*admin_, &ctx, chunks, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  Wake();
  EXPECT_EQ(Checksum(), perturbed_sum);
}

TEST_F(SleepUpdateTest, DiskThenTensorWhileAsleepStackInOrder) {
  TempDir dir;
  WritePerturbedStories(dir.path(), "mlp.down_proj", 1.7f);
  const std::string name = "model.norm.weight";  // [64] float32
  const std::vector<float> values(64, 0.5f);
  rl::v1::AdminResponse resp;
  ASSERT_TRUE(UpdateFromDisk(dir.path(), &resp).ok());
  ASSERT_TRUE(SendTensor(name, {64}, values, &resp).ok());
  const std::string both_sum = Checksum();
  ASSERT_TRUE(UpdateFromDisk(Stories(), &resp).ok());

  Sleep();
  ASSERT_TRUE(UpdateFromDisk(dir.path(), &resp).ok());
  ASSERT_TRUE(SendTensor(name, {64}, values, &resp).ok());
  Wake();
  EXPECT_EQ(Checksum(), both_sum);
}

}  // namespace
}  // namespace rl::worker::testing
