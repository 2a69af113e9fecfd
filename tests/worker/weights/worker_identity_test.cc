// Worker identity in GetLoad (issue 33; docs/router-restart.md): `instance_id` is random per
// process start (a restarted worker answers with another), and `weights_sha256` is the digest
// of the served weights when an update established it (a manifest-verified disk update, also
// through stage + activate), "" at start-up and after an update that carried no digest.
#include <string>

#include "common/weight_sync/manifest.h"
#include "tests/worker/worker_test_util.h"

namespace rl::worker::testing {
namespace {

using Stub = rl::v1::Admin::Stub;

class WorkerIdentityTest : public WorkerFixture {
 protected:
  rl::v1::GetLoadResponse Load() {
    grpc::ClientContext ctx;
    rl::v1::GetLoadResponse resp;
    EXPECT_TRUE(worker_->GetLoad(&ctx, rl::v1::GetLoadRequest(), &resp).ok());
    return resp;
  }
  grpc::Status UpdateFromDisk(const std::string& path) {
    rl::v1::UpdateWeightsFromDiskRequest req;
    req.set_model_path(path);
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
  // A perturbed copy of stories260K with its rl-manifest.json at `version`; its digest.
  std::string Publish(const std::string& dir, float scale, int64_t version) {
    WritePerturbedStories(dir, "mlp.down_proj", scale);
    auto ckpt = model_io::OpenCheckpoint(dir);
    EXPECT_TRUE(ckpt.ok());
    const weight_sync::Manifest m = weight_sync::ManifestOfCheckpoint(*ckpt, version);
    EXPECT_TRUE(weight_sync::WriteManifest(dir, m).ok());
    return m.sha256;
  }
};

TEST_F(WorkerIdentityTest, InstanceIdIsRandomPerStart) {
  StartWorker();
  const std::string first = Load().instance_id();
  EXPECT_EQ(first.size(), 32u);
  EXPECT_EQ(first.find_first_not_of("0123456789abcdef"), std::string::npos) << first;
  EXPECT_EQ(Load().instance_id(), first);  // stable while the process runs
  server_->Shutdown();
  StartWorker();
  const std::string second = Load().instance_id();
  EXPECT_EQ(second.size(), 32u);
  EXPECT_NE(second, first);
}

TEST_F(WorkerIdentityTest, WeightsDigestIsKnownOnlyAfterAVerifiedUpdate) {
  StartWorker();
  EXPECT_EQ(Load().weights_sha256(), "");  // start-up weights: not hashed
  TempDir v1, plain, v3;
  const std::string sha1 = Publish(v1.path(), 1.5f, 1);
  ASSERT_TRUE(UpdateFromDisk(v1.path()).ok());
  rl::v1::GetLoadResponse load = Load();
  EXPECT_EQ(load.weight_version(), 1);
  EXPECT_EQ(load.weights_sha256(), sha1);
  EXPECT_EQ(load.weights_sha256(), RankChecksum());  // it is the served weights' digest
  // An update without a manifest: the digest is no longer known.
  WritePerturbedStories(plain.path(), "mlp.down_proj", 0.5f);
  ASSERT_TRUE(UpdateFromDisk(plain.path()).ok());
  EXPECT_EQ(Load().weights_sha256(), "");
  // Stage + activate of a verified publication.
  const std::string sha3 = Publish(v3.path(), 2.0f, 3);
  rl::v1::StageWeightsRequest stage;
  stage.set_model_path(v3.path());
  rl::v1::AdminResponse resp;
  ASSERT_TRUE(Call(&Stub::StageWeights, stage, &resp).ok());
  EXPECT_EQ(Load().weights_sha256(), "");  // staged, not served yet
  ASSERT_TRUE(Call(&Stub::ActivateWeights, rl::v1::ActivateWeightsRequest(), &resp).ok());
  load = Load();
  EXPECT_EQ(load.weight_version(), 3);
  EXPECT_EQ(load.weights_sha256(), sha3);
}

}  // namespace
}  // namespace rl::worker::testing
