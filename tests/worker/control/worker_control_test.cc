// WorkerController (the worker's control plane) without gRPC: pause / continue / flush, sleep /
// wake and the weights checker as state transitions of a real engine over the stories260K CPU
// runner; the one owner of the asleep state (the sleepable runner) as the control plane, the
// data-plane admission check, the weight-update unit and the worker info all see it; the
// serving state derived from asleep and the update in progress.
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "common/model_io/model_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/worker/control/worker_controller.h"
#include "services/worker/model/cpu_model_runner.h"
#include "services/worker/model/sleepable_runner.h"
#include "services/worker/weights/weight_update_controller.h"
#include "tests/testing/test_data.h"

namespace rl::worker {
namespace {

using ::rl::testing::Stories;
using ::rl::testing::TempDir;
using ::testing::HasSubstr;

const std::vector<int32_t> kPromptIds = {1, 403, 407, 261, 378};

// A weight-update unit whose state the test sets (an update in progress, the last failure).
class StateWeights final : public WeightUpdates {
 public:
  bool updating_ = false;
  WeightUpdateStatus status_;

  bool updating() const override { return updating_; }
  WeightUpdateStatus status() const override { return status_; }
  const WeightShapes& served_shapes() const override { return shapes_; }
  absl::StatusOr<AdminOutcome> UpdateWeightsFromDisk(const std::string&,
                                                     const UpdatePolicy&) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<AdminOutcome> UpdateWeightsFromTensors(std::vector<NamedTensor>,
                                                        const UpdatePolicy&) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<AdminOutcome> UpdateWeightsFromDistributed(const std::string&,
                                                            std::vector<model::TensorInfo>,
                                                            const UpdatePolicy&) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<AdminOutcome> PrepareWeightsUpdate(const std::string&, WeightBuckets) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<AdminOutcome> CompleteWeightsUpdate(const std::string&,
                                                     const UpdatePolicy&) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<AdminOutcome> ReceiveWeights(const std::string&, WeightBuckets,
                                              const UpdatePolicy&) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<AdminOutcome> InitWeightsUpdateGroup(const GroupRequest&) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<AdminOutcome> DestroyWeightsUpdateGroup(const std::string&) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<std::vector<model::TensorInfo>> ListWeights() override {
    return absl::UnimplementedError("fake");
  }

 private:
  WeightShapes shapes_;
};

class WorkerControlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model::RunnerOptions options;
    options.model_dir = Stories();
    options.num_threads = 1;
    options.kv_cache_bytes = 8 << 20;
    options.page_size = 1;  // every finished request leaves its tokens in the prefix cache
    auto runner = model::SleepableRunner::Create(
        [options] { return model::CreateCpuModelRunner(options); }, spill_.path(), Stories());
    ASSERT_TRUE(runner.ok()) << runner.status();
    runner_ = runner->get();
    auto engine = engine::Engine::Create(*std::move(runner), engine::EngineOptions{});
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);

    WeightUpdateController::Deps weights;
    weights.engine = engine_.get();
    weights.sleep = runner_;
    auto config = model_io::LoadModelConfig(Stories());
    ASSERT_TRUE(config.ok()) << config.status();
    weights.model_config = *config;
    auto updates = WeightUpdateController::Create(std::move(weights));
    ASSERT_TRUE(updates.ok()) << updates.status();
    weights_ = *std::move(updates);
    control_ = MakeControl(weights_.get());
  }

  void TearDown() override {
    control_.reset();
    weights_.reset();
    engine_.reset();
  }

  std::unique_ptr<WorkerController> MakeControl(const WeightUpdates* weights) {
    WorkerController::Deps deps;
    deps.engine = engine_.get();
    deps.runner = runner_;
    deps.weights = weights;
    deps.identity.model_path = Stories();
    deps.identity.backend = "cpu";
    deps.build_version = "test-version";
    deps.serving_changed = [this] { ++serving_changes_; };
    return std::make_unique<WorkerController>(std::move(deps));
  }

  // Submits a greedy request; its result arrives on `finished`.
  void Submit(const std::string& id, int max_new_tokens,
              std::promise<engine::GenerateResult>* finished) {
    engine::GenerateRequest request;
    request.id = id;
    request.input_ids = kPromptIds;
    request.sampling.temperature = 0;
    request.sampling.max_new_tokens = max_new_tokens;
    request.sampling.ignore_eos = true;
    engine::RequestCallbacks callbacks;
    callbacks.on_finish = [finished](engine::GenerateResult r) {
      finished->set_value(std::move(r));
    };
    ASSERT_TRUE(engine_->Submit(request, std::move(callbacks)).ok());
  }

  // A copy of every served tensor's digest (the checker's checksum).
  std::string Checksum() {
    auto sum = control_->CheckWeights(CheckerAction::kChecksum);
    EXPECT_TRUE(sum.ok()) << sum.status();
    return sum.ok() ? sum->rank_sha256 : "";
  }

  TempDir spill_;
  model::SleepableRunner* runner_ = nullptr;  // owned by engine_
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<WeightUpdateController> weights_;
  std::unique_ptr<WorkerController> control_;
  int serving_changes_ = 0;
};

TEST_F(WorkerControlTest, PauseContinueAndFlushMoveTheEngine) {
  auto paused = control_->Pause(engine::PauseMode::kInPlace);
  ASSERT_TRUE(paused.ok()) << paused.status();
  EXPECT_EQ(paused->message, "paused (in_place)");
  EXPECT_EQ(paused->num_aborted, 0);
  EXPECT_TRUE(engine_->GetServerInfo().paused);

  // Paused in place with a queued request: the flush is refused, the request survives.
  std::promise<engine::GenerateResult> finished;
  Submit("queued", 4, &finished);
  auto refused = control_->FlushCache();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(engine_->GetServerInfo().scheduler.num_waiting, 1);

  auto resumed = control_->Continue();
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->message, "resumed");
  EXPECT_FALSE(engine_->GetServerInfo().paused);
  auto result = finished.get_future();
  ASSERT_EQ(result.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  EXPECT_EQ(result.get().output_ids.size(), 4u);

  // Idle: the flush empties the prefix cache.
  EXPECT_GT(engine_->GetServerInfo().scheduler.tree_cache_tokens, 0);
  auto flushed = control_->FlushCache();
  ASSERT_TRUE(flushed.ok()) << flushed.status();
  EXPECT_EQ(flushed->message, "cache flushed");
  EXPECT_EQ(engine_->GetServerInfo().scheduler.tree_cache_tokens, 0);
}

TEST_F(WorkerControlTest, PauseWithAbortCountsTheAbortedRequests) {
  ASSERT_TRUE(control_->Pause(engine::PauseMode::kInPlace).ok());
  std::promise<engine::GenerateResult> a, b;
  Submit("a", 8, &a);
  Submit("b", 8, &b);
  auto aborted = control_->Pause(engine::PauseMode::kAbort);
  ASSERT_TRUE(aborted.ok()) << aborted.status();
  EXPECT_EQ(aborted->num_aborted, 2);
  EXPECT_EQ(a.get_future().get().finish_reason.kind, engine::FinishKind::kAbort);
  EXPECT_EQ(b.get_future().get().finish_reason.kind, engine::FinishKind::kAbort);
}

// The sleepable runner owns the asleep state; the control plane, the admission check, the
// worker info, the serving state and the weight-update unit all read that one fact.
TEST_F(WorkerControlTest, SleepAndWakeHaveOneOwner) {
  const std::string before = Checksum();
  EXPECT_FALSE(control_->asleep());
  EXPECT_TRUE(control_->CheckAdmission().ok());

  auto slept = control_->ReleaseMemory();
  ASSERT_TRUE(slept.ok()) << slept.status();
  EXPECT_THAT(slept->message, HasSubstr("memory released"));
  EXPECT_TRUE(runner_->released());
  EXPECT_TRUE(control_->asleep());
  EXPECT_TRUE(control_->worker_info().asleep);
  EXPECT_EQ(control_->serving_state(), ServingState::kAsleep);
  EXPECT_FALSE(control_->serving());
  EXPECT_EQ(serving_changes_, 1);
  EXPECT_TRUE(engine_->GetServerInfo().paused);
  EXPECT_EQ(control_->CheckAdmission().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(control_->CheckAdmission().message(), HasSubstr("asleep"));
  auto cont = control_->Continue();
  EXPECT_EQ(cont.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(cont.status().message(), HasSubstr("ResumeMemory"));
  EXPECT_EQ(control_->CheckWeights(CheckerAction::kChecksum).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(weights_->ListWeights().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(control_->ReleaseMemory().ok());  // idempotent
  EXPECT_TRUE(runner_->released());

  auto woke = control_->ResumeMemory();
  ASSERT_TRUE(woke.ok()) << woke.status();
  EXPECT_EQ(woke->message, "memory resumed");
  EXPECT_FALSE(runner_->released());
  EXPECT_FALSE(control_->asleep());
  EXPECT_FALSE(control_->worker_info().asleep);
  EXPECT_EQ(control_->serving_state(), ServingState::kServing);
  EXPECT_TRUE(control_->CheckAdmission().ok());
  EXPECT_FALSE(engine_->GetServerInfo().paused);
  EXPECT_TRUE(weights_->ListWeights().ok());
  EXPECT_EQ(Checksum(), before);
  EXPECT_TRUE(control_->ResumeMemory().ok());  // idempotent
}

// A weight update while asleep is staged by the runner and bumps the version without waking
// or resuming the engine (the weight-update unit reads the same asleep state).
TEST_F(WorkerControlTest, AnUpdateWhileAsleepDoesNotResumeTheEngine) {
  ASSERT_TRUE(control_->ReleaseMemory().ok());
  UpdatePolicy policy;
  policy.weight_version = 7;
  auto updated = weights_->UpdateWeightsFromDisk(Stories(), policy);
  ASSERT_TRUE(updated.ok()) << updated.status();
  EXPECT_EQ(updated->weight_version, 7);
  EXPECT_TRUE(control_->asleep());
  EXPECT_TRUE(engine_->GetServerInfo().paused);
  ASSERT_TRUE(control_->ResumeMemory().ok());
  EXPECT_FALSE(engine_->GetServerInfo().paused);
  EXPECT_EQ(engine_->weight_version(), 7);
}

TEST_F(WorkerControlTest, SleepIsRefusedWhileRequestsAreActive) {
  ASSERT_TRUE(control_->Pause(engine::PauseMode::kInPlace).ok());
  std::promise<engine::GenerateResult> finished;
  Submit("queued", 2, &finished);
  auto refused = control_->ReleaseMemory();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(), HasSubstr("requests are active"));
  EXPECT_FALSE(control_->asleep());
  EXPECT_EQ(serving_changes_, 0);
  ASSERT_TRUE(control_->Continue().ok());
  EXPECT_EQ(finished.get_future().get().output_ids.size(), 2u);
}

TEST_F(WorkerControlTest, CheckerSnapshotResetCompareAndChecksum) {
  EXPECT_EQ(control_->CheckWeights(CheckerAction::kCompare).status().code(),
            absl::StatusCode::kFailedPrecondition);  // no snapshot yet
  auto snap = control_->CheckWeights(CheckerAction::kSnapshot);
  ASSERT_TRUE(snap.ok()) << snap.status();
  auto same = control_->CheckWeights(CheckerAction::kCompare);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_TRUE(same->changed.empty());
  const std::string before = Checksum();

  auto reset = control_->CheckWeights(CheckerAction::kResetTensors);
  ASSERT_TRUE(reset.ok()) << reset.status();
  auto changed = control_->CheckWeights(CheckerAction::kCompare);
  ASSERT_TRUE(changed.ok()) << changed.status();
  const size_t num_weights = weights_->served_weights().size();
  EXPECT_EQ(changed->changed.size(), num_weights);
  EXPECT_TRUE(changed->missing.empty() && changed->unexpected.empty());
  EXPECT_NE(Checksum(), before);
  auto sums = control_->CheckWeights(CheckerAction::kChecksum);
  ASSERT_TRUE(sums.ok());
  EXPECT_EQ(sums->tensor_sha256.size(), num_weights);

  // Changed-in-memory weights survive a sleep (spilled and restored).
  const std::string reset_sum = Checksum();
  ASSERT_TRUE(control_->ReleaseMemory().ok());
  ASSERT_TRUE(control_->ResumeMemory().ok());
  EXPECT_EQ(Checksum(), reset_sum);
}

// Serving state: asleep first, then an update in progress, else serving; Continue and the
// worker info report the weight-update unit's last failure.
TEST_F(WorkerControlTest, ServingStateAndInfoFollowTheWeightUpdates) {
  StateWeights state;
  std::unique_ptr<WorkerController> control = MakeControl(&state);
  EXPECT_EQ(control->serving_state(), ServingState::kServing);
  EXPECT_TRUE(control->serving());
  state.updating_ = true;
  EXPECT_EQ(control->serving_state(), ServingState::kUpdating);
  EXPECT_FALSE(control->serving());
  EXPECT_TRUE(control->CheckAdmission().ok());  // requests queue behind an update
  ASSERT_TRUE(control->ReleaseMemory().ok());
  EXPECT_EQ(control->serving_state(), ServingState::kAsleep);
  ASSERT_TRUE(control->ResumeMemory().ok());
  state.updating_ = false;
  EXPECT_EQ(control->serving_state(), ServingState::kServing);

  EXPECT_STREQ(ServingStateName(ServingState::kServing), "serving");
  EXPECT_STREQ(ServingStateName(ServingState::kAsleep), "asleep (memory released)");
  EXPECT_STREQ(ServingStateName(ServingState::kUpdating), "weight update in progress");
  EXPECT_STREQ(ServingStateName(ServingState::kDraining), "draining (shutting down)");

  // A drain (SIGTERM) wins over everything, refuses new work retryably, and is never undone.
  control->BeginDrain();
  EXPECT_TRUE(control->draining());
  EXPECT_EQ(control->serving_state(), ServingState::kDraining);
  state.updating_ = true;
  EXPECT_EQ(control->serving_state(), ServingState::kDraining);
  state.updating_ = false;
  const absl::Status admitted = control->CheckAdmission();
  EXPECT_EQ(admitted.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(admitted.message().find("draining"), std::string::npos) << admitted;

  state.status_.update_failed = true;
  state.status_.last_error = "bucket 3: checksum mismatch";
  state.status_.groups = {"train"};
  ASSERT_TRUE(control->Pause(engine::PauseMode::kRetract).ok());
  auto resumed = control->Continue();
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->message,
            "resumed; note: the last weight update failed: bucket 3: checksum mismatch");
  const WorkerInfo info = control->worker_info();
  EXPECT_TRUE(info.update_failed);
  EXPECT_EQ(info.last_error, "bucket 3: checksum mismatch");
  EXPECT_EQ(info.weight_update_groups, std::vector<std::string>{"train"});
  EXPECT_EQ(info.backend, "cpu");
  EXPECT_EQ(info.version, "test-version");
  EXPECT_EQ(control->model_identity().model_path, Stories());
}

}  // namespace
}  // namespace rl::worker
