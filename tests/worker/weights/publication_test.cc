// Publications through rl.v1.Admin on an in-process rl-worker (stories260K), issue 30: a staged
// delta activates with the checksums of the dense checkpoint it encodes; a delta whose parent
// the worker does not hold is refused with that reason; a corrupted or cut delta stages and
// activates nothing; a checkpoint that does not match its manifest is refused naming the
// tensor; a version number once served with one content is refused with another.
#include <filesystem>
#include <fstream>
#include <random>

#include "common/weight_sync/delta_file.h"
#include "common/weight_sync/manifest.h"
#include "tests/testing/publications.h"
#include "tests/worker/worker_test_util.h"

namespace rl::worker::testing {
namespace {

using Stub = rl::v1::Admin::Stub;

void WriteStep(const std::string& from, const std::string& dir, double fraction, uint64_t seed) {
  ASSERT_TRUE(::rl::testing::WriteTrainerStep(from, dir, fraction, seed).ok());
}

void WriteManifestOf(const std::string& dir, int64_t version) {
  ASSERT_TRUE(::rl::testing::WriteManifestOf(dir, version).ok());
}

std::string ManifestSha(const std::string& dir) {
  auto m = weight_sync::ReadManifest(dir);
  EXPECT_TRUE(m.ok() && m->has_value());
  return m.ok() && m->has_value() ? (*m)->sha256 : "";
}

class PublicationTest : public WorkerFixture {
 protected:
  void SetUp() override { StartWorker(); }

  grpc::Status Stage(const std::string& path, rl::v1::AdminResponse* resp) {
    rl::v1::StageWeightsRequest req;
    req.set_model_path(path);
    return Call(&Stub::StageWeights, req, resp);
  }
  grpc::Status Activate(rl::v1::AdminResponse* resp) {
    return Call(&Stub::ActivateWeights, rl::v1::ActivateWeightsRequest(), resp);
  }
  grpc::Status UpdateFromDisk(const std::string& path, int64_t version) {
    rl::v1::UpdateWeightsFromDiskRequest req;
    req.set_model_path(path);
    if (version >= 0) req.set_weight_version(version);
    rl::v1::AdminResponse resp;
    return Call(&Stub::UpdateWeightsFromDisk, req, &resp);
  }
  std::string RankChecksum() {
    rl::v1::WeightsCheckerRequest req;
    req.set_action(rl::v1::WEIGHTS_CHECKER_ACTION_CHECKSUM);
    rl::v1::WeightsCheckerResponse resp;
    EXPECT_TRUE(Call(&Stub::WeightsChecker, req, &resp).ok());
    return resp.rank_sha256();
  }
  // Nothing staged, version and weights unchanged.
  void ExpectUnchanged(int64_t version, const std::string& checksum) {
    rl::v1::GetServerInfoResponse info = ServerInfo();
    EXPECT_FALSE(info.has_staged_weights());
    EXPECT_FALSE(info.staging());
    rl::v1::AdminResponse resp;
    EXPECT_EQ(Activate(&resp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_EQ(server_->weight_version(), version);
    EXPECT_EQ(RankChecksum(), checksum);
  }
};

TEST_F(PublicationTest, StagedDeltaActivatesWithTheDenseCheckpointsChecksums) {
  TempDir child, delta;
  WriteStep(Stories(), child.path(), 0.02, 1);
  auto stats = weight_sync::WriteDeltaPublication(Stories(), child.path(), delta.path(), 1, 0);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_LT(stats->delta_bytes, stats->dense_bytes / 10);
  const std::string before = RankChecksum();

  rl::v1::AdminResponse resp;
  grpc::Status s = Stage(delta.path(), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_NE(resp.message().find("a delta of"), std::string::npos) << resp.message();
  rl::v1::GetServerInfoResponse info = ServerInfo();
  EXPECT_TRUE(info.has_staged_weights());
  EXPECT_EQ(info.staged_weight_version(), 1);  // the manifest's version
  EXPECT_EQ(RankChecksum(), before);           // staged, not served
  EXPECT_EQ(server_->weight_version(), 0);

  ASSERT_TRUE(Activate(&resp).ok());
  EXPECT_EQ(server_->weight_version(), 1);
  const std::string after = RankChecksum();
  EXPECT_EQ(after, ManifestSha(delta.path()));  // the child's manifest digest
  const std::vector<int32_t> delta_ids = GreedyIds();

  // The dense checkpoint gives the same checksum and the same outputs.
  ASSERT_TRUE(UpdateFromDisk(Stories(), 7).ok());
  EXPECT_EQ(RankChecksum(), before);
  ASSERT_TRUE(UpdateFromDisk(child.path(), 8).ok());
  EXPECT_EQ(RankChecksum(), after);
  EXPECT_EQ(GreedyIds(), delta_ids);
}

TEST_F(PublicationTest, OneCallUpdateAppliesADeltaAndChainsThem) {
  TempDir v1, v2, d1, d2;
  WriteStep(Stories(), v1.path(), 0.02, 1);
  WriteStep(v1.path(), v2.path(), 0.02, 2);
  ASSERT_TRUE(weight_sync::WriteDeltaPublication(Stories(), v1.path(), d1.path(), 1, 0).ok());
  WriteManifestOf(v1.path(), 1);
  ASSERT_TRUE(
      weight_sync::WriteDeltaPublication(v1.path(), v2.path(), d2.path(), 2, std::nullopt).ok());
  ASSERT_TRUE(UpdateFromDisk(d1.path(), -1).ok());
  EXPECT_EQ(server_->weight_version(), 1);
  grpc::Status s = UpdateFromDisk(d2.path(), -1);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(server_->weight_version(), 2);
  EXPECT_EQ(RankChecksum(), ManifestSha(d2.path()));
}

TEST_F(PublicationTest, DeltaWhoseParentTheWorkerDoesNotHoldIsRefused) {
  TempDir child, delta;
  WriteStep(Stories(), child.path(), 0.02, 1);
  ASSERT_TRUE(weight_sync::WriteDeltaPublication(Stories(), child.path(), delta.path(), 4, 3).ok());
  const std::string before = RankChecksum();
  rl::v1::AdminResponse resp;
  grpc::Status s = Stage(delta.path(), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("its parent is version 3 but this worker serves version 0"),
            std::string::npos)
      << s.error_message();
  EXPECT_NE(s.error_message().find("does not hold the parent"), std::string::npos);
  ExpectUnchanged(0, before);
}

TEST_F(PublicationTest, DeltaOfAnotherContentOfTheParentVersionIsRefused) {
  // The worker serves version 1 = A (manifest recorded); the delta's parent is version 1 = B.
  TempDir a, b, child, delta;
  WriteStep(Stories(), a.path(), 0.02, 1);
  WriteStep(Stories(), b.path(), 0.02, 2);
  WriteStep(b.path(), child.path(), 0.02, 3);
  WriteManifestOf(a.path(), 1);
  WriteManifestOf(b.path(), 1);
  ASSERT_TRUE(UpdateFromDisk(a.path(), -1).ok());
  ASSERT_EQ(server_->weight_version(), 1);
  ASSERT_TRUE(
      weight_sync::WriteDeltaPublication(b.path(), child.path(), delta.path(), 2, std::nullopt)
          .ok());
  const std::string before = RankChecksum();
  rl::v1::AdminResponse resp;
  grpc::Status s = Stage(delta.path(), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("does not hold the parent"), std::string::npos)
      << s.error_message();
  ExpectUnchanged(1, before);
}

TEST_F(PublicationTest, CorruptedDeltaStagesNothing) {
  TempDir child, delta;
  WriteStep(Stories(), child.path(), 0.02, 1);
  ASSERT_TRUE(weight_sync::WriteDeltaPublication(Stories(), child.path(), delta.path(), 1, 0).ok());
  const std::string file = delta.path() + "/" + weight_sync::kDeltaFileName;
  std::vector<char> bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const std::string before = RankChecksum();
  // A flipped bit in the last payload byte: the payload may still decode, but the result then
  // does not match the manifest, and the refusal names the tensor.
  bytes.back() ^= 0x01;
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  rl::v1::AdminResponse resp;
  grpc::Status s = Stage(delta.path(), &resp);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.error_message().find("tensor '"), std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("nothing is staged"), std::string::npos) << s.error_message();
  ExpectUnchanged(0, before);
}

TEST_F(PublicationTest, CutDeltaActivatesNothing) {
  TempDir child, delta;
  WriteStep(Stories(), child.path(), 0.02, 1);
  ASSERT_TRUE(weight_sync::WriteDeltaPublication(Stories(), child.path(), delta.path(), 1, 0).ok());
  const std::string file = delta.path() + "/" + weight_sync::kDeltaFileName;
  const auto size = std::filesystem::file_size(file);
  const std::string before = RankChecksum();
  std::filesystem::copy_file(file, file + ".full");
  for (uintmax_t cut : {uintmax_t{0}, uintmax_t{12}, uintmax_t{200}, size / 2, size - 1}) {
    std::filesystem::copy_file(file + ".full", file,
                               std::filesystem::copy_options::overwrite_existing);
    std::filesystem::resize_file(file, cut);
    rl::v1::AdminResponse resp;
    grpc::Status s = Stage(delta.path(), &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << cut << ": " << s.error_message();
    ExpectUnchanged(0, before);
  }
}

TEST_F(PublicationTest, CheckpointThatDoesNotMatchItsManifestIsRefused) {
  TempDir a, b;
  WriteStep(Stories(), a.path(), 0.02, 1);
  WriteStep(Stories(), b.path(), 0.02, 2);
  WriteManifestOf(a.path(), 1);
  // b's files under a's manifest.
  std::filesystem::copy_file(a.path() + "/" + weight_sync::kManifestFileName,
                             b.path() + "/" + weight_sync::kManifestFileName);
  const std::string before = RankChecksum();
  rl::v1::AdminResponse resp;
  grpc::Status s = Stage(b.path(), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("does not match the manifest of version 1"), std::string::npos)
      << s.error_message();
  ExpectUnchanged(0, before);
  // The right files verify and activate as the manifest's version.
  ASSERT_TRUE(Stage(a.path(), &resp).ok());
  EXPECT_NE(resp.message().find("verified against its manifest"), std::string::npos);
  ASSERT_TRUE(Activate(&resp).ok());
  EXPECT_EQ(server_->weight_version(), 1);
  EXPECT_EQ(RankChecksum(), ManifestSha(a.path()));
}

TEST_F(PublicationTest, AVersionNumberNeverNamesTwoContents) {
  TempDir a, b;
  WriteStep(Stories(), a.path(), 0.02, 1);
  WriteStep(Stories(), b.path(), 0.02, 2);
  WriteManifestOf(a.path(), 3);
  WriteManifestOf(b.path(), 3);
  rl::v1::AdminResponse resp;
  ASSERT_TRUE(Stage(a.path(), &resp).ok());
  ASSERT_TRUE(Activate(&resp).ok());
  ASSERT_TRUE(UpdateFromDisk(Stories(), 4).ok());
  const std::string before = RankChecksum();
  // Version 3 again with other content: refused, by the stage and by the one-call update.
  grpc::Status s = Stage(b.path(), &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("never names two contents"), std::string::npos)
      << s.error_message();
  EXPECT_EQ(UpdateFromDisk(b.path(), -1).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  ExpectUnchanged(4, before);
  // The same content again is fine. A version named in the call must be the manifest's.
  EXPECT_EQ(UpdateFromDisk(a.path(), 5).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(UpdateFromDisk(a.path(), -1).ok());
  EXPECT_EQ(server_->weight_version(), 3);
}

}  // namespace
}  // namespace rl::worker::testing
