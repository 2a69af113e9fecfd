// WeightUpdateController without gRPC: an engine over the stories260K CPU runner and fake
// weight-update groups whose receives the test releases bucket by bucket, so the order of a
// receive and the calls around it is fixed by the test, not by timing.
#include "services/worker/weights/weight_update_controller.h"

#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/worker/model/cpu_model_runner.h"
#include "services/worker/weights/weights_checker.h"
#include "tests/worker/worker_test_util.h"

namespace rl::worker::testing {
namespace {

using ::testing::HasSubstr;

// Only a hang guard, never a speed assertion.
constexpr absl::Duration kHangGuard = absl::Seconds(60);

// The trainer's side of a fake group: what the worker's receiver hands out, and a gate the test
// opens once per bucket.
class FakeGroup {
 public:
  explicit FakeGroup(const model_io::Checkpoint* source) : source_(source) {}

  // Lets one pending (or future) Receive go on; `failure` makes it fail instead.
  void Release(absl::Status failure = absl::OkStatus()) {
    absl::MutexLock lock(&mu_);
    releases_.push_back(std::move(failure));
  }
  // Waits until `n` Receive calls have started; false on the hang guard.
  bool WaitEntered(int n) {
    absl::MutexLock lock(&mu_);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return entered_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&done), kHangGuard);
  }
  int entered() {
    absl::MutexLock lock(&mu_);
    return entered_;
  }

  // From now on every Receive fails with `status` before posting (a broken group).
  void Break(absl::Status status) {
    absl::MutexLock lock(&mu_);
    broken_ = std::move(status);
  }

  absl::Status Receive(const std::vector<weight_sync::TensorSpec>& specs,
                       const weight_sync::TensorCallback& on_tensor,
                       const std::function<void()>& on_posted) {
    absl::Status verdict;
    {
      absl::MutexLock lock(&mu_);
      if (!broken_.ok()) return broken_;
      ++entered_;
      if (on_posted) on_posted();
      auto open = [&]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closed_ || !releases_.empty(); };
      if (!mu_.AwaitWithTimeout(absl::Condition(&open), kHangGuard)) {
        return absl::DeadlineExceededError("fake group: never released");
      }
      if (closed_) return absl::FailedPreconditionError("fake group: closed");
      verdict = releases_.front();
      releases_.erase(releases_.begin());
    }
    if (!verdict.ok()) return verdict;
    for (const auto& spec : specs) {
      const auto& t = source_->tensors().at(spec.name);
      if (absl::Status s = on_tensor(spec, t.data); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }

 private:
  const model_io::Checkpoint* source_;
  absl::Mutex mu_;
  int entered_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Status> releases_ ABSL_GUARDED_BY(mu_);
};

class FakeReceiver final : public weight_sync::WeightReceiver {
 public:
  FakeReceiver(std::shared_ptr<FakeGroup> group, weight_sync::GroupOptions options)
      : group_(std::move(group)), options_(std::move(options)) {}
  absl::Status Receive(const std::vector<weight_sync::TensorSpec>& specs,
                       const weight_sync::TensorCallback& on_tensor,
                       const std::function<void()>& on_posted) override {
    return group_->Receive(specs, on_tensor, on_posted);
  }
  void Close() override { group_->Close(); }
  const weight_sync::GroupOptions& options() const override { return options_; }

 private:
  std::shared_ptr<FakeGroup> group_;
  weight_sync::GroupOptions options_;
};

// Holds the controller's served-digest jobs (Deps::before_digest) while closed.
class DigestGate {
 public:
  void Close() {
    absl::MutexLock lock(&mu_);
    open_ = false;
  }
  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  // On the hashing thread: counts the job, then waits while the gate is closed.
  void Pass() {
    absl::MutexLock lock(&mu_);
    ++entered_;
    auto open = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return open_; };
    mu_.Await(absl::Condition(&open));
  }
  // Waits until `n` jobs reached the gate; false on the hang guard.
  bool WaitEntered(int n) {
    absl::MutexLock lock(&mu_);
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return entered_ >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&done), kHangGuard);
  }

 private:
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = true;
  int entered_ ABSL_GUARDED_BY(mu_) = 0;
};

class WeightUpdateControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WritePerturbedStories(dir_.path(), "attn", 1.25f);
    auto ckpt = model_io::OpenCheckpoint(dir_.path());
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    source_ = std::make_unique<model_io::Checkpoint>(*std::move(ckpt));
    group_ = std::make_shared<FakeGroup>(source_.get());

    model::RunnerOptions runner_options;
    runner_options.model_dir = Stories();
    runner_options.num_threads = 1;
    runner_options.kv_cache_bytes = 8 << 20;
    auto runner = model::CreateCpuModelRunner(runner_options);
    ASSERT_TRUE(runner.ok()) << runner.status();
    auto engine = engine::Engine::Create(*std::move(runner), engine::EngineOptions{});
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);

    WeightUpdateController::Deps deps;
    deps.engine = engine_.get();
    auto config = model_io::LoadModelConfig(Stories());
    ASSERT_TRUE(config.ok()) << config.status();
    deps.model_config = *config;
    deps.connect = [group = group_](const weight_sync::GroupOptions& options)
        -> absl::StatusOr<std::unique_ptr<weight_sync::WeightReceiver>> {
      return std::make_unique<FakeReceiver>(group, options);
    };
    deps.before_digest = [gate = digest_gate_] { gate->Pass(); };
    auto updates = WeightUpdateController::Create(std::move(deps));
    ASSERT_TRUE(updates.ok()) << updates.status();
    updates_ = *std::move(updates);
    GroupRequest join;
    join.master_address = "127.0.0.1";
    join.master_port = 1;
    join.rank_offset = 1;
    join.world_size = 2;
    join.group_name = "train";
    ASSERT_TRUE(updates_->InitWeightsUpdateGroup(join).ok());
  }

  void TearDown() override {
    digest_gate_->Open();  // a held digest job ends (the controller joins it)
    if (updates_) updates_->Shutdown();
    updates_.reset();
    engine_.reset();
  }

  // Every tensor of the perturbed checkpoint, as one bucket.
  std::vector<std::vector<model::TensorInfo>> Buckets() const {
    std::vector<model::TensorInfo> bucket;
    for (const auto& [name, t] : source_->tensors()) {
      bucket.push_back({name, std::string(model_io::DTypeName(t.dtype)), t.shape});
    }
    return {bucket};
  }

  // Whether the engine serves exactly the perturbed checkpoint's tensors.
  bool ServesSource() {
    absl::StatusOr<CheckerResult> sums = absl::InternalError("not run");
    EXPECT_TRUE(engine_
                    ->RunOnEngineThread([&](engine::EngineContext& ctx) {
                      sums = WeightsChecker::Checksum(ctx.runner());
                      return absl::OkStatus();
                    })
                    .ok());
    if (!sums.ok()) return false;
    for (const auto& [name, t] : source_->tensors()) {
      if (sums->tensor_sha256.at(name) !=
          TensorDigest({name, std::string(model_io::DTypeName(t.dtype)), t.shape}, t.data)) {
        return false;
      }
    }
    return true;
  }

  // The weights checker's rank digest of what the engine serves.
  std::string RankChecksum() {
    std::string rank;
    EXPECT_TRUE(engine_
                    ->RunOnEngineThread([&](engine::EngineContext& ctx) {
                      absl::StatusOr<CheckerResult> sums = WeightsChecker::Checksum(ctx.runner());
                      if (sums.ok()) rank = sums->rank_sha256;
                      return sums.status();
                    })
                    .ok());
    return rank;
  }

  // Tensor `name` of the source checkpoint with every byte of it XORed with `mask` (new content).
  NamedTensor Changed(const std::string& name, uint8_t mask) const {
    const model_io::TensorView& t = source_->tensors().at(name);
    NamedTensor out{{name, std::string(model_io::DTypeName(t.dtype)), t.shape},
                    std::vector<uint8_t>(t.data.begin(), t.data.end())};
    // Flip low mantissa bits of F32 words only: finite values stay finite.
    for (size_t i = 0; i + 4 <= out.bytes.size(); i += 4) out.bytes[i] ^= mask;
    return out;
  }

  // Submits a greedy request of `max_new_tokens`; its result arrives in the returned future.
  std::future<engine::GenerateResult> Submit(const std::string& id, int max_new_tokens) {
    engine::GenerateRequest request;
    request.id = id;
    request.input_ids = kPromptIds;
    request.sampling.temperature = 0;
    request.sampling.max_new_tokens = max_new_tokens;
    request.sampling.ignore_eos = true;
    auto finished = std::make_shared<std::promise<engine::GenerateResult>>();
    engine::RequestCallbacks callbacks;
    callbacks.on_finish = [finished](engine::GenerateResult r) {
      finished->set_value(std::move(r));
    };
    EXPECT_TRUE(engine_->Submit(request, std::move(callbacks)).ok());
    return finished->get_future();
  }

  static UpdatePolicy Version(int64_t v) {
    UpdatePolicy p;
    p.weight_version = v;
    return p;
  }

  // Every tensor of the source checkpoint, the first one Changed by `mask` (0: unchanged).
  std::vector<NamedTensor> AllTensors(uint8_t mask = 0) const {
    std::vector<NamedTensor> all;
    for (const auto& [n, t] : source_->tensors()) {
      all.push_back(mask != 0 && all.empty()
                        ? Changed(n, mask)
                        : NamedTensor{{n, std::string(model_io::DTypeName(t.dtype)), t.shape},
                                      std::vector<uint8_t>(t.data.begin(), t.data.end())});
    }
    return all;
  }
  // Their per-tensor digests.
  static std::map<std::string, std::string> Digests(const std::vector<NamedTensor>& tensors) {
    std::map<std::string, std::string> out;
    for (const NamedTensor& t : tensors) out[t.info.name] = TensorDigest(t.info, t.bytes);
    return out;
  }

  TempDir dir_;
  std::shared_ptr<DigestGate> digest_gate_ = std::make_shared<DigestGate>();
  std::unique_ptr<model_io::Checkpoint> source_;
  std::shared_ptr<FakeGroup> group_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<WeightUpdateController> updates_;
};

// Review finding c: ready means the first bucket's receive is posted, not that a thread was made.
TEST_F(WeightUpdateControllerTest, PrepareAnswersReadyOnlyOnceTheReceiveIsPosted) {
  for (int i = 0; i < 20; ++i) {
    auto prepared = updates_->PrepareWeightsUpdate("train", Buckets());
    ASSERT_TRUE(prepared.ok()) << prepared.status();
    EXPECT_TRUE(prepared->ready);
    EXPECT_EQ(group_->entered(), i + 1);  // already inside Receive when Prepare answered
    group_->Release();
    auto done = updates_->CompleteWeightsUpdate("train", Version(i + 1));
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_EQ(done->weight_version, i + 1);
  }
  EXPECT_TRUE(ServesSource());
}

// A group that cannot receive (closed, broken) makes Prepare fail with the receive's error
// instead of answering ready; nothing stays prepared.
TEST_F(WeightUpdateControllerTest, PrepareOnABrokenGroupFailsInsteadOfAnsweringReady) {
  group_->Break(absl::FailedPreconditionError("fake: group broken by an earlier error"));
  auto prepared = updates_->PrepareWeightsUpdate("train", Buckets());
  EXPECT_EQ(prepared.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(prepared.status().message(), HasSubstr("could not be posted"));
  EXPECT_THAT(prepared.status().message(), HasSubstr("group broken"));
  EXPECT_THAT(updates_->CompleteWeightsUpdate("train", {}).status().message(),
              HasSubstr("no prepared update"));
}

// Review finding b: one receive per group; a second call on a group that a receive holds is
// refused with FAILED_PRECONDITION naming the group, and the group is free again afterwards.
TEST_F(WeightUpdateControllerTest, ASecondReceiveOnABusyGroupIsRefused) {
  auto receive = std::async(
      std::launch::async, [&] { return updates_->ReceiveWeights("train", Buckets(), Version(5)); });
  ASSERT_TRUE(group_->WaitEntered(1));  // the receive holds the group

  auto prepared = updates_->PrepareWeightsUpdate("train", Buckets());
  EXPECT_EQ(prepared.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(prepared.status().message(), HasSubstr("group 'train' is busy"));
  auto again = updates_->ReceiveWeights("train", Buckets(), {});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.status().message(), HasSubstr("group 'train' is busy"));
  auto bucket = updates_->UpdateWeightsFromDistributed("train", Buckets()[0], {});
  EXPECT_EQ(bucket.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(bucket.status().message(), HasSubstr("group 'train' is busy"));
  EXPECT_EQ(group_->entered(), 1);  // none of them reached the group's connection

  group_->Release();
  auto received = receive.get();
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_EQ(received->weight_version, 5);
  EXPECT_TRUE(ServesSource());

  // Free again: a two-phase update goes through, and while it is prepared a receive is refused.
  ASSERT_TRUE(updates_->PrepareWeightsUpdate("train", Buckets()).ok());
  auto during = updates_->ReceiveWeights("train", Buckets(), {});
  EXPECT_EQ(during.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(during.status().message(), HasSubstr("group 'train' has a prepared update"));
  group_->Release();
  EXPECT_TRUE(updates_->CompleteWeightsUpdate("train", {}).ok());
}

// Racing callers (no ordering from the test): exactly one of two Prepares wins, the other is
// refused naming the group.
TEST_F(WeightUpdateControllerTest, ConcurrentPreparesOnOneGroupPostOneReceive) {
  for (int round = 0; round < 10; ++round) {
    auto a = std::async(std::launch::async,
                        [&] { return updates_->PrepareWeightsUpdate("train", Buckets()); });
    auto b = std::async(std::launch::async,
                        [&] { return updates_->PrepareWeightsUpdate("train", Buckets()); });
    absl::StatusOr<AdminOutcome> ra = a.get(), rb = b.get();
    ASSERT_NE(ra.ok(), rb.ok()) << ra.status() << " / " << rb.status();
    const absl::Status& refused = ra.ok() ? rb.status() : ra.status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(refused.message(), HasSubstr("group 'train'"));
    EXPECT_EQ(group_->entered(), round + 1);
    group_->Release();
    ASSERT_TRUE(updates_->CompleteWeightsUpdate("train", {}).ok());
  }
}

// Review finding a: with the engine paused in place and a request queued, Complete retracts by
// itself (decided on the engine thread) instead of refusing and dropping the tensors; the
// request then runs to its end on the new weights.
TEST_F(WeightUpdateControllerTest, CompleteSelfPausesAnEnginePausedInPlaceWithAQueue) {
  ASSERT_TRUE(engine_->Pause(engine::PauseMode::kInPlace).ok());
  engine::GenerateRequest request;
  request.id = "queued";
  request.input_ids = kPromptIds;
  request.sampling.temperature = 0;
  request.sampling.max_new_tokens = 16;
  request.sampling.ignore_eos = true;
  std::promise<engine::GenerateResult> finished;
  engine::RequestCallbacks callbacks;
  callbacks.on_finish = [&finished](engine::GenerateResult r) { finished.set_value(std::move(r)); };
  ASSERT_TRUE(engine_->Submit(request, std::move(callbacks)).ok());

  ASSERT_TRUE(updates_->PrepareWeightsUpdate("train", Buckets()).ok());
  group_->Release();
  auto done = updates_->CompleteWeightsUpdate("train", Version(3));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->weight_version, 3);
  EXPECT_TRUE(ServesSource());
  EXPECT_FALSE(engine_->GetServerInfo().paused);  // resumed (keep_pause unset)

  std::future<engine::GenerateResult> result = finished.get_future();
  ASSERT_EQ(result.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  const engine::GenerateResult r = result.get();
  EXPECT_EQ(r.finish_reason.kind, engine::FinishKind::kLength);
  EXPECT_EQ(r.output_ids.size(), 16u);
  EXPECT_EQ(r.weight_version, 3);
}

// A self-pausing update on a running engine that fails resumes it; one on a paused engine
// leaves it paused.
TEST_F(WeightUpdateControllerTest, AFailedReceiveResumesOnlyARunningEngine) {
  auto receive = std::async(std::launch::async,
                            [&] { return updates_->ReceiveWeights("train", Buckets(), {}); });
  ASSERT_TRUE(group_->WaitEntered(1));
  group_->Release(absl::DataLossError("fake checksum mismatch"));
  EXPECT_EQ(receive.get().status().code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(engine_->GetServerInfo().paused);
  EXPECT_EQ(engine_->weight_version(), 0);

  ASSERT_TRUE(engine_->Pause(engine::PauseMode::kInPlace).ok());
  receive = std::async(std::launch::async,
                       [&] { return updates_->ReceiveWeights("train", Buckets(), {}); });
  ASSERT_TRUE(group_->WaitEntered(2));
  group_->Release(absl::DataLossError("fake checksum mismatch"));
  EXPECT_EQ(receive.get().status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(engine_->GetServerInfo().paused);
}

// Review finding a, second half: a Complete that fails before applying keeps the prepared
// receive (a retry completes it); one whose receive failed says so and drops it.
TEST_F(WeightUpdateControllerTest, ACompleteThatFailsBeforeApplyingCanBeRetried) {
  ASSERT_TRUE(updates_->PrepareWeightsUpdate("train", Buckets()).ok());
  group_->Release();
  auto bad = updates_->CompleteWeightsUpdate("train", Version(-1));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("weight_version"));
  EXPECT_THAT(bad.status().message(), HasSubstr("prepared update is kept"));
  EXPECT_FALSE(ServesSource());

  auto retry = updates_->CompleteWeightsUpdate("train", Version(9));
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_EQ(retry->weight_version, 9);
  EXPECT_TRUE(ServesSource());
  EXPECT_EQ(updates_->CompleteWeightsUpdate("train", {}).status().code(),
            absl::StatusCode::kFailedPrecondition);  // consumed

  ASSERT_TRUE(updates_->PrepareWeightsUpdate("train", Buckets()).ok());
  group_->Release(absl::DataLossError("fake checksum mismatch"));
  auto lost = updates_->CompleteWeightsUpdate("train", {});
  // Nothing changed: a refusal (the router keeps the worker routed), the cause named.
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(lost.status().message(), HasSubstr("prepare again"));
  EXPECT_THAT(lost.status().message(), HasSubstr("DATA_LOSS: fake checksum mismatch"));
  auto none = updates_->CompleteWeightsUpdate("train", {});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.status().message(), HasSubstr("no prepared update"));
  EXPECT_EQ(engine_->weight_version(), 9);
}

// Destroying a group while a Prepare is posted ends its receive; a later Prepare on a
// re-joined group of the same name works.
TEST_F(WeightUpdateControllerTest, DestroyEndsAPostedReceive) {
  ASSERT_TRUE(updates_->PrepareWeightsUpdate("train", Buckets()).ok());
  ASSERT_TRUE(updates_->DestroyWeightsUpdateGroup("train").ok());
  EXPECT_TRUE(updates_->status().groups.empty());
  EXPECT_EQ(updates_->CompleteWeightsUpdate("train", {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(ServesSource());
}

// Issue 30: activating a staged version holds the engine thread for one step (pause, swap, flush
// or keep the KV, bump, resume), not a pause step and then an apply step; with keep_kv the
// running request keeps going on its KV, with retract it is recomputed, and both end on the
// new version.
TEST_F(WeightUpdateControllerTest, ActivatingAStagedVersionHoldsTheEngineForOneStep) {
  for (const bool keep_kv : {true, false}) {
    SCOPED_TRACE(keep_kv ? "keep_kv" : "retract");
    ASSERT_TRUE(updates_->StageWeightsFromDisk(dir_.path(), std::nullopt).ok());
    std::future<engine::GenerateResult> running = Submit(keep_kv ? "kept" : "retracted", 200);
    // Held in place (with whatever KV it computed) so that it surely spans the activation.
    ASSERT_TRUE(engine_->Pause(engine::PauseMode::kInPlace).ok());
    const int64_t version = engine_->weight_version();
    UpdatePolicy policy;
    policy.keep_kv = keep_kv;
    const int64_t before = engine_->num_commands();
    auto out = updates_->ActivateStagedWeights(policy);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(engine_->num_commands() - before, 1);  // one engine-thread hop, the whole update
    EXPECT_EQ(out->weight_version, version + 1);
    EXPECT_TRUE(ServesSource());
    EXPECT_FALSE(engine_->GetServerInfo().paused);
    ASSERT_EQ(running.wait_for(std::chrono::seconds(60)), std::future_status::ready);
    const engine::GenerateResult r = running.get();
    EXPECT_EQ(r.finish_reason.kind, engine::FinishKind::kLength);
    EXPECT_EQ(r.weight_version, version + 1);
    // Back to the stories weights for the next round (stage + activate the original folder).
    ASSERT_TRUE(updates_->StageWeightsFromDisk(Stories(), std::nullopt).ok());
    ASSERT_TRUE(updates_->ActivateStagedWeights({}).ok());
  }
  // A receive still pauses in a step of its own before it waits for data (two hops at least).
  const int64_t before = engine_->num_commands();
  group_->Release();
  ASSERT_TRUE(updates_->ReceiveWeights("train", Buckets(), {}).ok());
  EXPECT_GE(engine_->num_commands() - before, 2);
}

// Issue 30: the served digest (GetLoad / GetServerInfo weights_sha256) is known after group
// receives and staged tensor activations: a receive of every tensor gives it alone, an update of
// some tensors on a known digest updates it, anything on an unknown one leaves it unknown; it is
// the weights checker's rank digest of what is served every time it is known.
TEST_F(WeightUpdateControllerTest, ServedDigestIsKnownAfterReceivesAndStagedTensors) {
  EXPECT_EQ(updates_->served_sha256(), "");  // start-up weights: not hashed
  // One-call receive of every tensor.
  group_->Release();
  ASSERT_TRUE(updates_->ReceiveWeights("train", Buckets(), Version(1)).ok());
  updates_->WaitForServedDigest();  // hashed after the answer
  const std::string source_sha = updates_->served_sha256();
  EXPECT_FALSE(source_sha.empty());
  EXPECT_EQ(source_sha, RankChecksum());
  // Some tensors, in one call, on that known digest.
  const std::string name = source_->tensors().begin()->first;
  ASSERT_TRUE(updates_->UpdateWeightsFromTensors({Changed(name, 1)}, Version(2)).ok());
  updates_->WaitForServedDigest();
  const std::string changed_sha = updates_->served_sha256();
  EXPECT_NE(changed_sha, source_sha);
  EXPECT_EQ(changed_sha, RankChecksum());
  // Two-phase receive of every tensor: back to the source's digest.
  ASSERT_TRUE(updates_->PrepareWeightsUpdate("train", Buckets()).ok());
  group_->Release();
  ASSERT_TRUE(updates_->CompleteWeightsUpdate("train", Version(3)).ok());
  updates_->WaitForServedDigest();
  EXPECT_EQ(updates_->served_sha256(), source_sha);
  // A staged tensor stream of one tensor, digested while staging, activated.
  auto ticket = updates_->BeginStage("tensor", 4);
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  ASSERT_TRUE((*ticket)->Commit({Changed(name, 2)}).ok());
  EXPECT_EQ(updates_->served_sha256(), source_sha);  // staged, not served yet
  EXPECT_EQ(updates_->status().staged.sha256, "");   // its result depends on what is served
  ASSERT_TRUE(updates_->ActivateStagedWeights({}).ok());
  const std::string staged_sha = updates_->served_sha256();
  EXPECT_NE(staged_sha, source_sha);
  EXPECT_EQ(staged_sha, RankChecksum());
  // A per-bucket distributed update writes as it arrives and is not digested: unknown, and an
  // update of some tensors on an unknown digest stays unknown.
  group_->Release();
  ASSERT_TRUE(updates_->UpdateWeightsFromDistributed("train", Buckets()[0], Version(5)).ok());
  EXPECT_EQ(updates_->served_sha256(), "");
  ASSERT_TRUE(updates_->UpdateWeightsFromTensors({Changed(name, 4)}, Version(6)).ok());
  EXPECT_FALSE(updates_->served_digest_pending());  // not even hashed: it could not be known
  EXPECT_EQ(updates_->served_sha256(), "");
  // A staged stream of every tensor is known again.
  ticket = updates_->BeginStage("tensor", 7);
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  std::vector<NamedTensor> all;
  for (const auto& [n, t] : source_->tensors()) {
    all.push_back({{n, std::string(model_io::DTypeName(t.dtype)), t.shape},
                   std::vector<uint8_t>(t.data.begin(), t.data.end())});
  }
  ASSERT_TRUE((*ticket)->Commit(std::move(all)).ok());
  EXPECT_EQ(updates_->status().staged.sha256, source_sha);  // a full state: known when staged
  ASSERT_TRUE(updates_->ActivateStagedWeights({}).ok());
  EXPECT_EQ(updates_->served_sha256(), source_sha);
}

// Session 42: Complete and the one-call ReceiveWeights answer once the weights are served,
// before the tensors they applied are hashed: the served digest is pending (never the previous
// version's) until the hashing thread, which holds the tensors, publishes it.
TEST_F(WeightUpdateControllerTest, CompleteAndReceiveAnswerBeforeTheDigestIsComputed) {
  for (bool two_phase : {true, false}) {
    SCOPED_TRACE(two_phase ? "Prepare + Complete" : "ReceiveWeights");
    const int64_t version = two_phase ? 1 : 2;
    // A known digest before, to be sure the answer does not report it for the new weights.
    ASSERT_TRUE(updates_->UpdateWeightsFromTensors(AllTensors(7), Version(version * 10)).ok());
    const std::string before = updates_->served_sha256();
    ASSERT_FALSE(before.empty());
    digest_gate_->Close();
    if (two_phase) ASSERT_TRUE(updates_->PrepareWeightsUpdate("train", Buckets()).ok());
    group_->Release();
    std::future<absl::StatusOr<AdminOutcome>> call = std::async(std::launch::async, [&] {
      return two_phase ? updates_->CompleteWeightsUpdate("train", Version(version))
                       : updates_->ReceiveWeights("train", Buckets(), Version(version));
    });
    // Answered while the hash is held (an answer that waited for the hash never comes: the gate
    // is opened after the hang guard so the call can end).
    if (call.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
      digest_gate_->Open();
      FAIL() << "the call waited for the digest";
    }
    absl::StatusOr<AdminOutcome> out = call.get();
    // The weights are served, the digest is pending.
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->weight_version, version);
    EXPECT_TRUE(ServesSource());
    EXPECT_FALSE(engine_->GetServerInfo().paused);
    ASSERT_TRUE(digest_gate_->WaitEntered(static_cast<int>(version)));
    EXPECT_TRUE(updates_->served_digest_pending());
    EXPECT_EQ(updates_->served_sha256(), "");
    digest_gate_->Open();
    updates_->WaitForServedDigest();
    EXPECT_FALSE(updates_->served_digest_pending());
    EXPECT_EQ(updates_->served_sha256(), RankChecksum());
    EXPECT_NE(updates_->served_sha256(), before);
  }
}

// An update that starts while the digest of the previous one is being computed drops
// that hash (it stops, nothing of it is published): the digest is then the new update's own.
TEST_F(WeightUpdateControllerTest, AnUpdateDuringTheHashDropsIt) {
  // A per-bucket distributed update (digest unknown) while the hash is held.
  digest_gate_->Close();
  group_->Release();
  ASSERT_TRUE(updates_->ReceiveWeights("train", Buckets(), Version(1)).ok());
  ASSERT_TRUE(digest_gate_->WaitEntered(1));
  group_->Release();
  ASSERT_TRUE(updates_->UpdateWeightsFromDistributed("train", Buckets()[0], Version(2)).ok());
  const int64_t hashed = updates_->hashed_bytes();
  digest_gate_->Open();
  updates_->WaitForServedDigest();
  EXPECT_EQ(updates_->hashed_bytes(), hashed);  // stopped before its first tensor
  EXPECT_FALSE(updates_->served_digest_pending());
  EXPECT_EQ(updates_->served_sha256(), "");
  // A verified full state while the hash is held: its digest stands.
  digest_gate_->Close();
  ASSERT_TRUE(updates_->PrepareWeightsUpdate("train", Buckets()).ok());
  group_->Release();
  ASSERT_TRUE(updates_->CompleteWeightsUpdate("train", Version(3)).ok());
  ASSERT_TRUE(digest_gate_->WaitEntered(2));
  std::vector<NamedTensor> changed = AllTensors(3);
  UpdatePolicy verified = Version(4);
  verified.verified_sha256 = RankDigest(Digests(changed));
  ASSERT_TRUE(updates_->UpdateWeightsFromTensors(std::move(changed), verified).ok());
  EXPECT_EQ(updates_->served_sha256(), verified.verified_sha256);
  digest_gate_->Open();
  updates_->WaitForServedDigest();
  EXPECT_EQ(updates_->hashed_bytes(), hashed);
  EXPECT_EQ(updates_->served_sha256(), verified.verified_sha256);
  EXPECT_EQ(updates_->served_sha256(), RankChecksum());
}

// A receive that starts while the previous update's digest is being computed stops that hash,
// so the tensors it holds are freed before the new ones arrive (one received copy at a time);
// the earlier version's digest is then unknown, the new one's computed as usual.
TEST_F(WeightUpdateControllerTest, AReceiveDuringTheHashDropsIt) {
  digest_gate_->Close();
  group_->Release();
  ASSERT_TRUE(updates_->ReceiveWeights("train", Buckets(), Version(1)).ok());
  ASSERT_TRUE(digest_gate_->WaitEntered(1));
  const int64_t hashed = updates_->hashed_bytes();
  // The Prepare stops the hash and waits until its tensors are freed: it answers once the gate
  // lets the held job run (and end at once).
  const uint64_t receives = updates_->receives_started();
  std::future<absl::StatusOr<AdminOutcome>> prepare = std::async(
      std::launch::async, [&] { return updates_->PrepareWeightsUpdate("train", Buckets()); });
  // Open once the Prepare has started its receive (the hash must see it to stop).
  for (int i = 0; i < 60000 && updates_->receives_started() == receives; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_NE(updates_->receives_started(), receives);
  digest_gate_->Open();
  ASSERT_EQ(prepare.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  ASSERT_TRUE(prepare.get().ok());
  EXPECT_EQ(updates_->hashed_bytes(), hashed);  // stopped before its first tensor
  EXPECT_FALSE(updates_->served_digest_pending());
  EXPECT_EQ(updates_->served_sha256(), "");
  group_->Release();
  ASSERT_TRUE(updates_->CompleteWeightsUpdate("train", Version(2)).ok());
  updates_->WaitForServedDigest();
  EXPECT_EQ(updates_->served_sha256(), RankChecksum());
}

// Issue 30: tensors of every served weight in its held dtype become the served weights by a
// pointer swap (their own buffers, no copy in the pause), staged or in one call; some tensors
// are still copied in.
TEST_F(WeightUpdateControllerTest, AFullStateOfTensorsIsSwappedInNotCopied) {
  auto everything = [&] {
    std::vector<NamedTensor> all;
    for (const auto& [n, t] : source_->tensors()) {
      all.push_back({{n, std::string(model_io::DTypeName(t.dtype)), t.shape},
                     std::vector<uint8_t>(t.data.begin(), t.data.end())});
    }
    return all;
  };
  // Where the engine serves tensor `name` from.
  auto served_at = [&](const std::string& name) {
    const uint8_t* at = nullptr;
    EXPECT_TRUE(engine_
                    ->RunOnEngineThread([&](engine::EngineContext& ctx) {
                      return ctx.runner().VisitWeights(
                          [&](const model::TensorInfo& info, absl::Span<const uint8_t> bytes) {
                            if (info.name == name) at = bytes.data();
                          });
                    })
                    .ok());
    return at;
  };
  const std::string name = source_->tensors().begin()->first;
  // Staged.
  std::vector<NamedTensor> all = everything();
  const uint8_t* staged_at = all.front().bytes.data();
  ASSERT_EQ(all.front().info.name, name);
  auto ticket = updates_->BeginStage("tensor", 1);
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  auto staged = (*ticket)->Commit(std::move(all));
  ASSERT_TRUE(staged.ok()) << staged.status();
  EXPECT_THAT(staged->message, HasSubstr("activated by a swap"));
  ASSERT_TRUE(updates_->ActivateStagedWeights({}).ok());
  EXPECT_EQ(served_at(name), staged_at);
  EXPECT_TRUE(ServesSource());
  // One call.
  all = everything();
  const uint8_t* pushed_at = all.front().bytes.data();
  ASSERT_TRUE(updates_->UpdateWeightsFromTensors(std::move(all), Version(2)).ok());
  EXPECT_EQ(served_at(name), pushed_at);
  EXPECT_TRUE(ServesSource());
  // Some tensors: copied in.
  NamedTensor one = Changed(name, 1);
  const uint8_t* one_at = one.bytes.data();
  ASSERT_TRUE(updates_->UpdateWeightsFromTensors({std::move(one)}, Version(3)).ok());
  EXPECT_NE(served_at(name), one_at);
  EXPECT_FALSE(ServesSource());
}

}  // namespace
}  // namespace rl::worker::testing
