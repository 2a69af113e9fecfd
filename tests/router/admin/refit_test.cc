// The transactional fleet refit (Admin.RefitWeights through a router over in-process rl-workers
// on stories260K, issue 30): with every worker staging, all activate the new version (fleet
// version recorded, checksums changed and equal, exact-version requests served); with one of three
// workers refusing to stage (its own --max-path-bytes is shorter than the folder's path), none
// activates, every staged copy is dropped, the answer names each worker's reason and the fleet
// keeps serving the old version (same outputs; a request for the new version is UNAVAILABLE). Also
// the router's ActivateWeights: refused unless every live worker has the version staged. Staged
// tensor pushes (UpdateWeightsFromTensor{stage} through the router, then ActivateWeights): all
// three workers stage and then activate; one of three given a corrupted tensor (a NaN only it
// refuses) makes the others drop theirs, nothing activates anywhere and requests keep their
// version. Staged delta pushes (issue 30): fanned out like dense ones, verified against their
// manifest on every worker (GetServerInfo reports the staged digest), then activated everywhere;
// a worker that does not serve the delta's parent fails the whole stage (all or none). The
// router's ActivateWeights compares the staged digests first: two workers that staged different
// contents under one version activate nowhere.
#include <atomic>
#include <future>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "rl/v1/router.grpc.pb.h"
#include "tests/testing/router_fleet.h"
#include "tests/testing/tensor_stream.h"
#include "tests/testing/weight_state.h"
#include "tests/worker/worker_test_util.h"

namespace rl::router {
namespace {

using rl::testing::TempDir;
using ::testing::HasSubstr;

class RefitTest : public testing::RouterFleetTest {
 protected:
  void SetUp() override {
    next_ = std::make_unique<TempDir>();
    worker::testing::WritePerturbedStories(next_->path(), "mlp.down_proj", 1.7f);
  }

  grpc::Status Refit(int64_t version, rl::v1::AdminResponse* resp) {
    rl::v1::RefitWeightsRequest req;
    req.set_model_path(next_->path());
    req.set_weight_version(version);
    grpc::ClientContext ctx;
    return admin_->RefitWeights(&ctx, req, resp);
  }

  std::vector<int32_t> GreedyIds(int64_t exact_version = -1) {
    rl::v1::GenerateRequest req = TextRequest("Once upon a time", 8, false);
    if (exact_version >= 0) req.set_exact_weight_version(exact_version);
    rl::v1::GenerateFinal f;
    const grpc::Status s = Generate(req, &f);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return {f.output_ids().begin(), f.output_ids().end()};
  }

  // Every worker's (version, has staged weights), through the router.
  std::vector<std::pair<int64_t, bool>> WorkerStates() {
    rl::v1::GetServerInfoResponse info;
    grpc::ClientContext ctx;
    EXPECT_TRUE(admin_->GetServerInfo(&ctx, {}, &info).ok());
    std::vector<std::pair<int64_t, bool>> out;
    for (const auto& w : info.workers()) {
      out.emplace_back(w.info().weight_version(), w.info().has_staged_weights());
    }
    return out;
  }

  // Every live worker's rank checksum, through the router.
  std::vector<std::string> Checksums() {
    rl::v1::WeightsCheckerRequest req;
    req.set_action(rl::v1::WEIGHTS_CHECKER_ACTION_CHECKSUM);
    rl::v1::WeightsCheckerResponse resp;
    grpc::ClientContext ctx;
    EXPECT_TRUE(admin_->WeightsChecker(&ctx, req, &resp).ok());
    std::vector<std::string> out;
    for (const auto& w : resp.workers()) out.push_back(w.result().rank_sha256());
    return out;
  }

  std::unique_ptr<TempDir> next_;
};

TEST_F(RefitTest, EveryWorkerStagesThenAllActivate) {
  StartFleet(2);
  const std::vector<std::string> before = Checksums();
  ASSERT_EQ(before.size(), 2u);
  rl::v1::AdminResponse resp;
  const grpc::Status s = Refit(5, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(resp.success()) << resp.message();
  EXPECT_EQ(resp.weight_version(), 5);
  ASSERT_EQ(resp.results_size(), 2);
  for (const auto& r : resp.results()) EXPECT_TRUE(r.success()) << r.worker() << r.message();
  for (const auto& [version, staged] : WorkerStates()) {
    EXPECT_EQ(version, 5);
    EXPECT_FALSE(staged);
  }
  EXPECT_EQ(ListWorkers().fleet_weight_version(), 5);
  const std::vector<std::string> after = Checksums();
  ASSERT_EQ(after.size(), 2u);
  EXPECT_NE(after[0], before[0]);
  EXPECT_EQ(after[0], after[1]);  // one version, one content
  EXPECT_EQ(GreedyIds(/*exact_version=*/5).size(), 8u);
}

TEST_F(RefitTest, OneWorkerFailingToStageActivatesNowhere) {
  StartFleet(2);
  // The third worker refuses the folder: its own path limit is shorter than the path.
  worker::WorkerConfig strict;
  strict.limits.max_path_bytes = 16;  // the smallest allowed; shorter than the folder's path
  auto w = testing::StartTestWorker(strict);
  ASSERT_TRUE(w.ok()) << w.status();
  const std::string strict_address = (*w)->address();
  workers_.push_back(*std::move(w));
  AddWorker(strict_address);
  ASSERT_TRUE(WaitFor([&] { return Status(strict_address).state() == rl::v1::WORKER_STATE_LIVE; }));
  const std::vector<int32_t> before = GreedyIds();
  const std::vector<std::string> sums = Checksums();

  rl::v1::AdminResponse resp;
  const grpc::Status s = Refit(5, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(resp.success());
  EXPECT_THAT(resp.message(), HasSubstr("failed on 1 of 3 workers"));
  EXPECT_THAT(resp.message(), HasSubstr("none activated"));
  EXPECT_EQ(resp.weight_version(), 0);
  ASSERT_EQ(resp.results_size(), 3);
  for (const auto& r : resp.results()) {
    if (r.worker() == strict_address) {
      EXPECT_FALSE(r.success());
      EXPECT_EQ(r.code(), "INVALID_ARGUMENT");
      EXPECT_THAT(r.message(), HasSubstr("max-path-bytes"));
    } else {
      EXPECT_TRUE(r.success()) << r.message();
      EXPECT_THAT(r.message(), HasSubstr("dropped"));
    }
  }
  // Nothing activated, nothing left staged; the fleet serves the old version and outputs.
  const auto states = WorkerStates();
  ASSERT_EQ(states.size(), 3u);
  for (const auto& [version, staged] : states) {
    EXPECT_EQ(version, 0);
    EXPECT_FALSE(staged);
  }
  for (int i = 0; i < 3; ++i) EXPECT_EQ(GreedyIds(), before);
  EXPECT_EQ(Checksums(), sums);
  rl::v1::GenerateRequest want_new = TextRequest("Once upon a time", 4, false);
  want_new.set_min_weight_version(5);
  rl::v1::GenerateFinal f;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
  auto reader = stub_->Generate(&ctx, want_new);
  rl::v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(RefitTest, RouterActivateNeedsTheVersionStagedEverywhere) {
  StartFleet(2);
  // Staged on one worker only (directly): the router activates none.
  auto one = rl::v1::Admin::NewStub(
      grpc::CreateChannel(workers_[0]->address(), grpc::InsecureChannelCredentials()));
  rl::v1::StageWeightsRequest stage;
  stage.set_model_path(next_->path());
  stage.set_weight_version(3);
  rl::v1::AdminResponse resp;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(one->StageWeights(&ctx, stage, &resp).ok());
  }
  rl::v1::ActivateWeightsRequest activate;
  {
    grpc::ClientContext ctx;
    const grpc::Status s = admin_->ActivateWeights(&ctx, activate, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
    EXPECT_THAT(s.error_message(), HasSubstr("nothing staged"));
  }
  for (const auto& [version, staged] : WorkerStates()) EXPECT_EQ(version, 0);
  // Staged through the router on both: activation reaches both.
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_->StageWeights(&ctx, stage, &resp).ok());
    EXPECT_TRUE(resp.success()) << resp.message();
  }
  {
    grpc::ClientContext ctx;
    const grpc::Status s = admin_->ActivateWeights(&ctx, activate, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(resp.success()) << resp.message();
  }
  for (const auto& [version, staged] : WorkerStates()) {
    EXPECT_EQ(version, 3);
    EXPECT_FALSE(staged);
  }
  EXPECT_EQ(ListWorkers().fleet_weight_version(), 3);
}

// ---- staged tensor pushes ----

constexpr char kDownProj[] = "model.layers.0.mlp.down_proj.weight";  // [64, 172] F32

// A staged push of down_proj (layer 0) filled with `value`, one element replaced by `poison`.
grpc::Status PushStaged(rl::v1::Admin::Stub& admin, int64_t version, float value, float poison,
                        rl::v1::AdminResponse* resp) {
  std::vector<float> values(64 * 172, value);
  values[1000] = poison;
  rl::v1::UpdateWeightsFromTensorRequest options;
  options.set_stage(true);
  options.set_weight_version(version);
  grpc::ClientContext ctx;
  return rl::testing::SendTensorStream(
      admin, &ctx,
      {rl::testing::Chunk(kDownProj, {64, 172}, "F32",
                          std::string(reinterpret_cast<const char*>(values.data()),
                                      values.size() * sizeof(float)))},
      resp, options);
}

TEST_F(RefitTest, AStagedTensorPushActivatesEverywhere) {
  StartFleet(3);
  const std::vector<std::string> before = Checksums();
  rl::v1::AdminResponse resp;
  grpc::Status s = PushStaged(*admin_, 4, 0.05f, 0.05f, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(resp.success()) << resp.message();
  ASSERT_EQ(resp.results_size(), 3);
  for (const auto& [version, staged] : WorkerStates()) {
    EXPECT_EQ(version, 0);  // staged, not served
    EXPECT_TRUE(staged);
  }
  EXPECT_EQ(Checksums(), before);
  rl::v1::ActivateWeightsRequest activate;
  activate.set_weight_version(4);
  grpc::ClientContext ctx;
  s = admin_->ActivateWeights(&ctx, activate, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(resp.success()) << resp.message();
  for (const auto& [version, staged] : WorkerStates()) {
    EXPECT_EQ(version, 4);
    EXPECT_FALSE(staged);
  }
  EXPECT_EQ(ListWorkers().fleet_weight_version(), 4);
  const std::vector<std::string> after = Checksums();
  ASSERT_EQ(after.size(), 3u);
  EXPECT_NE(after[0], before[0]);
  EXPECT_EQ(after[0], after[1]);
  EXPECT_EQ(after[0], after[2]);
  EXPECT_EQ(GreedyIds(/*exact_version=*/4).size(), 8u);
}

TEST_F(RefitTest, OneOfThreeGivenACorruptedTensorActivatesNowhere) {
  // Two workers accept non-finite weights, the third (default) refuses them: a NaN in the push
  // is a corrupted tensor for that one worker only.
  worker::WorkerConfig lenient;
  lenient.allow_non_finite_weights = true;
  StartFleet(2, {}, lenient);
  auto w = testing::StartTestWorker();
  ASSERT_TRUE(w.ok()) << w.status();
  const std::string strict_address = (*w)->address();
  workers_.push_back(*std::move(w));
  AddWorker(strict_address);
  ASSERT_TRUE(WaitFor([&] { return Status(strict_address).state() == rl::v1::WORKER_STATE_LIVE; }));
  const std::vector<int32_t> before = GreedyIds();
  const std::vector<std::string> sums = Checksums();
  ASSERT_EQ(sums.size(), 3u);

  // Requests asking for the served version run meanwhile and keep it.
  std::atomic<bool> stop{false};
  std::atomic<int> served{0};
  auto traffic = std::async(std::launch::async, [&] {
    while (!stop.load()) {
      rl::v1::GenerateRequest req = TextRequest("Once upon a time", 4, false);
      req.set_exact_weight_version(0);
      rl::v1::GenerateFinal f;
      const grpc::Status g = Generate(req, &f);
      EXPECT_TRUE(g.ok()) << g.error_message();
      EXPECT_EQ(f.weight_version(), 0);
      EXPECT_EQ(f.dispatch_weight_version(), 0);
      ++served;
    }
  });
  rl::v1::AdminResponse resp;
  grpc::Status s = PushStaged(*admin_, 5, 0.05f, std::numeric_limits<float>::quiet_NaN(), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(resp.success());
  EXPECT_THAT(resp.message(), HasSubstr("staging failed on 1 of 3 workers"));
  ASSERT_EQ(resp.results_size(), 3);
  for (const auto& r : resp.results()) {
    if (r.worker() == strict_address) {
      EXPECT_FALSE(r.success());
      EXPECT_EQ(r.code(), "INVALID_ARGUMENT");
      EXPECT_THAT(r.message(), HasSubstr("NaN"));
    } else {
      EXPECT_TRUE(r.success()) << r.message();
      EXPECT_THAT(r.message(), HasSubstr("dropped"));
    }
    EXPECT_FALSE(r.left_out());
  }
  // Nothing staged anywhere, so the router's activation refuses and nothing changes.
  for (const auto& [version, staged] : WorkerStates()) {
    EXPECT_EQ(version, 0);
    EXPECT_FALSE(staged);
  }
  rl::v1::ActivateWeightsRequest activate;
  activate.set_weight_version(5);
  {
    grpc::ClientContext ctx;
    s = admin_->ActivateWeights(&ctx, activate, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  }
  stop = true;
  traffic.get();
  EXPECT_GT(served.load(), 0);
  for (const auto& [version, staged] : WorkerStates()) EXPECT_EQ(version, 0);
  EXPECT_EQ(Checksums(), sums);
  EXPECT_EQ(GreedyIds(), before);
  // A request for the refused version is refused (retryable), never served stale.
  rl::v1::GenerateRequest want_new = TextRequest("Once upon a time", 4, false);
  want_new.set_min_weight_version(5);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
  auto reader = stub_->Generate(&ctx, want_new);
  rl::v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
}

// ---- staged delta pushes (issue 30) ----

// A staged delta of down_proj (layer 0): 2% of its words changed from the served version 0,
// with the result's manifest. `next` becomes the new state.
std::vector<rl::v1::UpdateWeightsFromTensorRequest> DeltaPush(rl::testing::State* next,
                                                              int64_t parent, int64_t version,
                                                              std::mt19937& rng) {
  rl::testing::Tensor& t = next->at(kDownProj);
  const std::vector<uint8_t> child =
      rl::testing::Step(model_io::DType::kF32, t.bytes, 0.02, false, rng);
  rl::testing::Change change{kDownProj,
                             {t.dtype, t.shape, child},
                             *weight_sync::EncodeDelta(model_io::DType::kF32, t.bytes, child)};
  t.bytes = child;
  rl::v1::UpdateWeightsFromTensorRequest options;
  options.set_stage(true);
  options.set_parent_version(parent);
  options.set_weight_version(version);
  options.set_manifest_json(
      weight_sync::ManifestToJson(rl::testing::ManifestOf(*next, version, parent)));
  return rl::testing::StreamMessages(rl::testing::ChunksOf({change}, rng), options);
}

grpc::Status Send(rl::v1::Admin::Stub& admin,
                  const std::vector<rl::v1::UpdateWeightsFromTensorRequest>& messages,
                  rl::v1::AdminResponse* resp) {
  grpc::ClientContext ctx;
  return rl::testing::SendMessages(admin, &ctx, messages, resp);
}

TEST_F(RefitTest, AStagedDeltaPushIsVerifiedEverywhereThenActivates) {
  StartFleet(3);
  rl::testing::State state = rl::testing::ReadState(worker::testing::Stories());
  std::mt19937 rng(3);
  rl::v1::AdminResponse resp;
  grpc::Status s = Send(*admin_, DeltaPush(&state, 0, 1, rng), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(resp.success()) << resp.message();
  const std::string digest = rl::testing::ManifestOf(state, 1, 0).sha256;
  {
    rl::v1::GetServerInfoResponse info;
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_->GetServerInfo(&ctx, {}, &info).ok());
    ASSERT_EQ(info.workers_size(), 3);
    for (const auto& w : info.workers()) {
      EXPECT_TRUE(w.info().has_staged_weights());
      EXPECT_EQ(w.info().staged_weights_sha256(), digest);
      EXPECT_EQ(w.info().staged_parent_version(), 0);
      EXPECT_EQ(w.info().weight_version(), 0);
    }
  }
  rl::v1::ActivateWeightsRequest activate;
  activate.set_weight_version(1);
  grpc::ClientContext ctx;
  s = admin_->ActivateWeights(&ctx, activate, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(resp.success()) << resp.message();
  for (const auto& [version, staged] : WorkerStates()) {
    EXPECT_EQ(version, 1);
    EXPECT_FALSE(staged);
  }
  for (const std::string& sum : Checksums()) EXPECT_EQ(sum, digest);
  EXPECT_EQ(ListWorkers().fleet_weight_version(), 1);
}

TEST_F(RefitTest, AWorkerNotAtTheDeltasParentFailsTheWholeStage) {
  StartFleet(3);
  const std::vector<std::string> sums = Checksums();
  ASSERT_EQ(sums.size(), 3u);
  // The third worker is moved to version 2 behind the router's back (same content).
  auto third = rl::v1::Admin::NewStub(
      grpc::CreateChannel(workers_[2]->address(), grpc::InsecureChannelCredentials()));
  rl::testing::State state = rl::testing::ReadState(worker::testing::Stories());
  const rl::testing::Tensor& down = state.at(kDownProj);
  rl::v1::UpdateWeightsFromTensorRequest bump;
  bump.set_weight_version(2);
  rl::v1::AdminResponse resp;
  ASSERT_TRUE(Send(*third,
                   rl::testing::StreamMessages(
                       {rl::testing::Chunk(kDownProj, down.shape, down.dtype,
                                           std::string(down.bytes.begin(), down.bytes.end()))},
                       bump),
                   &resp)
                  .ok());
  std::mt19937 rng(4);
  const grpc::Status s = Send(*admin_, DeltaPush(&state, 0, 1, rng), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(resp.success());
  ASSERT_EQ(resp.results_size(), 3);
  for (const auto& r : resp.results()) {
    if (r.worker() == workers_[2]->address()) {
      EXPECT_FALSE(r.success());
      EXPECT_EQ(r.code(), "FAILED_PRECONDITION");
      EXPECT_THAT(r.message(), HasSubstr("applies to version 0"));
      EXPECT_THAT(r.message(), HasSubstr("serves version 2"));
    } else {
      EXPECT_TRUE(r.success()) << r.message();
      EXPECT_THAT(r.message(), HasSubstr("dropped"));
    }
  }
  for (const auto& [version, staged] : WorkerStates()) EXPECT_FALSE(staged);
  EXPECT_EQ(Checksums(), sums);
}

TEST_F(RefitTest, ActivateRefusesWorkersThatStagedDifferentContents) {
  StartFleet(2);
  const std::vector<std::string> sums = Checksums();
  // Each worker stages version 1 directly, with a different change (each verified against its
  // own manifest): one version number, two contents.
  std::vector<std::string> digests;
  for (int i = 0; i < 2; ++i) {
    auto one = rl::v1::Admin::NewStub(
        grpc::CreateChannel(workers_[i]->address(), grpc::InsecureChannelCredentials()));
    rl::testing::State state = rl::testing::ReadState(worker::testing::Stories());
    std::mt19937 rng(100 + i);
    rl::v1::AdminResponse resp;
    const grpc::Status s = Send(*one, DeltaPush(&state, 0, 1, rng), &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    digests.push_back(rl::testing::ManifestOf(state, 1, 0).sha256);
  }
  ASSERT_NE(digests[0], digests[1]);
  rl::v1::ActivateWeightsRequest activate;
  activate.set_weight_version(1);
  rl::v1::AdminResponse resp;
  grpc::ClientContext ctx;
  const grpc::Status s = admin_->ActivateWeights(&ctx, activate, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("staged different contents"));
  EXPECT_THAT(s.error_message(), HasSubstr(digests[0]));
  EXPECT_THAT(s.error_message(), HasSubstr(digests[1]));
  EXPECT_THAT(s.error_message(), HasSubstr(workers_[0]->address()));
  for (const auto& [version, staged] : WorkerStates()) {
    EXPECT_EQ(version, 0);  // nothing activated anywhere
    EXPECT_TRUE(staged);
  }
  EXPECT_EQ(Checksums(), sums);
}

}  // namespace
}  // namespace rl::router
