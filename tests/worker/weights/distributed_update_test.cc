// UpdateWeightsFromDistributed end to end on one worker: the trainer side is an in-process
// WeightSender (rank 0, tcp), the worker joins through InitWeightsUpdateGroup, and each bucket's
// metadata goes over gRPC while its bytes go over the group. Staged group receives (issue 30):
// ReceiveWeights{stage} and CompleteWeightsUpdate{stage} keep serving the old weights (no pause)
// until ActivateWeights; a receive cut at any point (the trainer stops mid-broadcast, the group
// is destroyed) or holding a NaN leaves nothing staged.
#include <future>
#include <limits>
#include <optional>
#include <thread>

#include "common/weight_sync/bucket_plan.h"
#include "gmock/gmock.h"
#include "services/worker/weight_sync/weight_sync.h"
#include "services/worker/weights/weights_checker.h"
#include "tests/testing/grpc_health.h"
#include "tests/worker/worker_test_util.h"

namespace rl::worker::testing {
namespace {

using Stub = rl::v1::Admin::Stub;

class DistributedUpdateTest : public WorkerFixture {
 protected:
  void SetUp() override {
    StartWorker();
    weight_sync::GroupOptions options;
    options.rank = 0;
    options.world_size = 2;
    options.group_name = "train";
    options.timeout = std::chrono::seconds(20);
    auto sender = weight_sync::WeightSender::Create(options);
    ASSERT_TRUE(sender.ok()) << sender.status();
    sender_ = *std::move(sender);
    // The worker joins while the trainer waits for it.
    auto join = std::async(std::launch::async, [this] {
      rl::v1::InitWeightsUpdateGroupRequest init;
      init.set_master_address("127.0.0.1");
      init.set_master_port(sender_->port());
      init.set_rank_offset(1);
      init.set_world_size(2);
      init.set_group_name("train");
      init.set_backend(rl::v1::GROUP_BACKEND_TCP);
      rl::v1::AdminResponse resp;
      return Call(&Stub::InitWeightsUpdateGroup, init, &resp);
    });
    ASSERT_TRUE(sender_->WaitForReceivers().ok());
    grpc::Status s = join.get();
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  void TearDown() override {
    if (sender_) sender_->Close();
    WorkerFixture::TearDown();
  }

  // Sends `bucket` while the worker receives it under `specs` (normally the bucket's own).
  // The trainer's broadcast status goes to `sent`.
  grpc::Status SendBucket(const weight_sync::Bucket& bucket,
                          const std::vector<weight_sync::TensorSpec>& specs,
                          rl::v1::AdminResponse* resp, absl::Status* sent) {
    auto call = std::async(std::launch::async, [&] {
      rl::v1::UpdateWeightsFromDistributedRequest req;
      req.set_group_name("train");
      for (const auto& s : specs) {
        req.add_names(s.name);
        req.add_dtypes(s.dtype);
        req.add_shapes()->mutable_dims()->Assign(s.shape.begin(), s.shape.end());
      }
      return Call(&Stub::UpdateWeightsFromDistributed, req, resp);
    });
    *sent = sender_->Broadcast(bucket.specs, bucket.data).status();
    return call.get();
  }

  // Prepare → the trainer broadcasts `buckets` → Complete with `complete` (on group "train").
  grpc::Status TwoPhaseUpdate(const std::vector<weight_sync::Bucket>& buckets,
                              rl::v1::CompleteWeightsUpdateRequest complete,
                              rl::v1::AdminResponse* resp) {
    rl::v1::PrepareWeightsUpdateRequest prepare;
    AddBuckets(buckets, &prepare);
    grpc::Status s = Call(&Stub::PrepareWeightsUpdate, prepare, resp);
    if (!s.ok()) return s;
    if (absl::Status sent = BroadcastAll(sender_.get(), buckets); !sent.ok()) {
      return grpc::Status(grpc::StatusCode::INTERNAL, std::string(sent.message()));
    }
    complete.set_group_name("train");
    return Call(&Stub::CompleteWeightsUpdate, complete, resp);
  }

  void ExpectServes(const model_io::Checkpoint& ckpt) {
    rl::v1::WeightsCheckerRequest req;
    req.set_action(rl::v1::WEIGHTS_CHECKER_ACTION_CHECKSUM);
    rl::v1::WeightsCheckerResponse sums;
    ASSERT_TRUE(Call(&Stub::WeightsChecker, req, &sums).ok());
    for (const auto& [name, t] : ckpt.tensors()) {
      EXPECT_EQ(sums.tensor_sha256().at(name),
                TensorDigest({name, model_io::DTypeName(t.dtype), t.shape}, t.data))
          << name;
    }
  }

  // A staged ReceiveWeights on group "train" for `buckets`, as `version`.
  static rl::v1::ReceiveWeightsRequest StagedReceive(
      const std::vector<weight_sync::Bucket>& buckets, int64_t version) {
    rl::v1::ReceiveWeightsRequest req;
    AddBuckets(buckets, &req);
    req.set_stage(true);
    req.set_weight_version(version);
    return req;
  }
  grpc::Status Activate(int64_t version, rl::v1::AdminResponse* resp) {
    rl::v1::ActivateWeightsRequest req;
    req.set_weight_version(version);
    return Call(&Stub::ActivateWeights, req, resp);
  }

  std::unique_ptr<weight_sync::WeightSender> sender_;
};

// Prepare posts the receive and answers ready; generation goes on with the old weights while
// the trainer broadcasts and until Complete applies everything at once.
TEST_F(DistributedUpdateTest, TwoPhaseReceiveAppliesOnlyAtComplete) {
  TempDir dir;
  WritePerturbedStories(dir.path(), "attn", 1.25f);
  auto plan = PlanCheckpoint(dir.path(), 100 << 10);
  ASSERT_TRUE(plan.has_value());
  ASSERT_GT(plan->buckets.size(), 1u);
  const std::vector<int32_t> before = GreedyIds();

  rl::v1::PrepareWeightsUpdateRequest prepare;
  AddBuckets(plan->buckets, &prepare);
  rl::v1::AdminResponse resp;
  grpc::Status s = Call(&Stub::PrepareWeightsUpdate, prepare, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(resp.ready());
  EXPECT_EQ(Call(&Stub::PrepareWeightsUpdate, prepare, &resp).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);  // one prepared update per group
  EXPECT_EQ(GreedyIds(), before);
  ASSERT_TRUE(BroadcastAll(sender_.get(), plan->buckets).ok());
  EXPECT_EQ(GreedyIds(), before);  // received, not applied
  EXPECT_EQ(ServerInfo().weight_version(), 0);

  rl::v1::CompleteWeightsUpdateRequest complete;
  complete.set_group_name("train");
  complete.set_weight_version(7);
  s = Call(&Stub::CompleteWeightsUpdate, complete, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.weight_version(), 7);
  EXPECT_FALSE(ServerInfo().paused());
  EXPECT_NE(GreedyIds(), before);
  ExpectServes(plan->ckpt);
  EXPECT_EQ(Call(&Stub::CompleteWeightsUpdate, complete, &resp).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);  // nothing prepared any more
}

TEST_F(DistributedUpdateTest, PrepareChecksTheTensorsAndAFailedReceiveChangesNothing) {
  auto plan = PlanCheckpoint(Stories(), 1 << 30);
  ASSERT_TRUE(plan.has_value());
  rl::v1::PrepareWeightsUpdateRequest bad;
  AddBuckets(plan->buckets, &bad);
  bad.mutable_buckets(0)->set_names(0, "no.such.tensor");
  rl::v1::AdminResponse resp;
  EXPECT_EQ(Call(&Stub::PrepareWeightsUpdate, bad, &resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  rl::v1::CompleteWeightsUpdateRequest complete;
  complete.set_group_name("train");
  EXPECT_EQ(Call(&Stub::CompleteWeightsUpdate, complete, &resp).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);

  // Posted under one order, sent in another: the header check refuses the bucket, Complete
  // reports it and the worker keeps serving its weights, unpaused.
  const std::vector<int32_t> before = GreedyIds();
  std::vector<weight_sync::Bucket> swapped = plan->buckets;
  std::swap(swapped[0].specs[0], swapped[0].specs[1]);
  rl::v1::PrepareWeightsUpdateRequest prepare;
  AddBuckets(swapped, &prepare);
  ASSERT_TRUE(Call(&Stub::PrepareWeightsUpdate, prepare, &resp).ok());
  EXPECT_FALSE(BroadcastAll(sender_.get(), plan->buckets).ok());
  grpc::Status s = Call(&Stub::CompleteWeightsUpdate, complete, &resp);
  // Nothing was applied: a refusal naming the receive's own error.
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("INVALID_ARGUMENT"), std::string::npos) << s.error_message();
  EXPECT_FALSE(ServerInfo().paused());
  EXPECT_EQ(ServerInfo().weight_version(), 0);
  EXPECT_EQ(GreedyIds(), before);
}

TEST_F(DistributedUpdateTest, ReceiveWeightsIsOneCall) {
  TempDir dir;
  WritePerturbedStories(dir.path(), "mlp", 0.75f);
  auto plan = PlanCheckpoint(dir.path(), 100 << 10);
  ASSERT_TRUE(plan.has_value());
  const std::vector<int32_t> before = GreedyIds();
  rl::v1::ReceiveWeightsRequest req;
  AddBuckets(plan->buckets, &req);
  req.set_keep_pause(true);
  rl::v1::AdminResponse resp;
  auto call =
      std::async(std::launch::async, [&] { return Call(&Stub::ReceiveWeights, req, &resp); });
  ASSERT_TRUE(BroadcastAll(sender_.get(), plan->buckets).ok());
  grpc::Status s = call.get();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.weight_version(), 1);
  EXPECT_TRUE(ServerInfo().paused());  // keep_pause
  rl::v1::AdminResponse cont;
  ASSERT_TRUE(Call(&Stub::ContinueGeneration, rl::v1::ContinueGenerationRequest(), &cont).ok());
  EXPECT_NE(GreedyIds(), before);
  ExpectServes(plan->ckpt);
}

// Destroying the group while a receive waits on it (the trainer never sends) ends that receive
// promptly with an error and frees nothing under it; the old weights keep serving.
TEST_F(DistributedUpdateTest, DestroyDuringAReceiveEndsItSafely) {
  auto plan = PlanCheckpoint(Stories(), 100 << 10);
  ASSERT_TRUE(plan.has_value());
  const std::vector<int32_t> before = GreedyIds();
  rl::v1::ReceiveWeightsRequest req;
  AddBuckets(plan->buckets, &req);
  rl::v1::AdminResponse resp;
  auto call =
      std::async(std::launch::async, [&] { return Call(&Stub::ReceiveWeights, req, &resp); });
  // Destroy only once the receive waits on the group (it pauses the engine first).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!ServerInfo().paused() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(ServerInfo().paused());
  rl::v1::DestroyWeightsUpdateGroupRequest destroy;
  destroy.set_group_name("train");
  rl::v1::AdminResponse destroyed;
  ASSERT_TRUE(Call(&Stub::DestroyWeightsUpdateGroup, destroy, &destroyed).ok());
  grpc::Status s = call.get();
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(ServerInfo().weight_update_groups().empty());
  EXPECT_EQ(ServerInfo().weight_version(), 0);
  EXPECT_FALSE(ServerInfo().paused());  // the receive paused the engine itself: it resumes
  EXPECT_EQ(GreedyIds(), before);
}

// A refit held open (the worker waits on the trainer's broadcast): liveness, the overall
// grpc.health.v1 status, stays SERVING, so a liveness probe never restarts a worker in the middle
// of a long refit; readiness (the `rl.v1.Worker` service, and SGLang's HealthCheck that SMG asks)
// is NOT_SERVING until the refit ends, then SERVING again.
TEST_F(DistributedUpdateTest, RefitHeldOpenIsLiveButNotReady) {
  using rl::testing::HealthStatus;
  auto plan = PlanCheckpoint(Stories(), 100 << 10);
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(HealthStatus(channel_, ""), "SERVING");
  EXPECT_EQ(HealthStatus(channel_, "rl.v1.Worker"), "SERVING");
  rl::v1::ReceiveWeightsRequest req;
  AddBuckets(plan->buckets, &req);
  rl::v1::AdminResponse resp;
  auto call =
      std::async(std::launch::async, [&] { return Call(&Stub::ReceiveWeights, req, &resp); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (HealthStatus(channel_, "rl.v1.Worker") != "NOT_SERVING" &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(HealthStatus(channel_, "rl.v1.Worker"), "NOT_SERVING");
  // Held open: nothing was broadcast yet; the readiness stays off, liveness on, the whole time.
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(HealthStatus(channel_, ""), "SERVING");
    EXPECT_EQ(HealthStatus(channel_, "rl.v1.Worker"), "NOT_SERVING");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(call.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  ASSERT_TRUE(BroadcastAll(sender_.get(), plan->buckets).ok());
  grpc::Status s = call.get();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(HealthStatus(channel_, ""), "SERVING");
  EXPECT_EQ(HealthStatus(channel_, "rl.v1.Worker"), "SERVING");
  ExpectServes(plan->ckpt);
}

// A prepared receive owns the group's connection: a per-bucket update on the same group is
// refused until CompleteWeightsUpdate instead of interleaving with it.
TEST_F(DistributedUpdateTest, PerBucketUpdateWaitsForAPreparedReceive) {
  auto plan = PlanCheckpoint(Stories(), 100 << 10);
  ASSERT_TRUE(plan.has_value());
  rl::v1::PrepareWeightsUpdateRequest prepare;
  AddBuckets(plan->buckets, &prepare);
  rl::v1::AdminResponse resp;
  ASSERT_TRUE(Call(&Stub::PrepareWeightsUpdate, prepare, &resp).ok());
  rl::v1::UpdateWeightsFromDistributedRequest update;
  update.set_group_name("train");
  for (const auto& spec : plan->buckets.front().specs) {
    update.add_names(spec.name);
    update.add_dtypes(spec.dtype);
    update.add_shapes()->mutable_dims()->Assign(spec.shape.begin(), spec.shape.end());
  }
  grpc::Status s = Call(&Stub::UpdateWeightsFromDistributed, update, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  ASSERT_TRUE(BroadcastAll(sender_.get(), plan->buckets).ok());
  rl::v1::CompleteWeightsUpdateRequest complete;
  complete.set_group_name("train");
  s = Call(&Stub::CompleteWeightsUpdate, complete, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  ExpectServes(plan->ckpt);
}

TEST_F(DistributedUpdateTest, BucketsUpdateWeightsAndVersion) {
  TempDir dir;
  WritePerturbedStories(dir.path(), "mlp", 1.5f);
  auto plan = PlanCheckpoint(dir.path(), 100 << 10);  // several buckets
  ASSERT_TRUE(plan.has_value());
  ASSERT_GT(plan->buckets.size(), 1u);
  const std::vector<int32_t> before = GreedyIds();
  int64_t version = 0;
  for (const auto& b : plan->buckets) {
    rl::v1::AdminResponse resp;
    absl::Status sent;
    grpc::Status s = SendBucket(b, b.specs, &resp, &sent);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_TRUE(sent.ok()) << sent;
    EXPECT_EQ(resp.weight_version(), ++version);
  }
  EXPECT_NE(GreedyIds(), before);
  rl::v1::WeightsCheckerRequest req;
  req.set_action(rl::v1::WEIGHTS_CHECKER_ACTION_CHECKSUM);
  rl::v1::WeightsCheckerResponse sums;
  ASSERT_TRUE(Call(&Stub::WeightsChecker, req, &sums).ok());
  for (const auto& [name, t] : plan->ckpt.tensors()) {
    EXPECT_EQ(sums.tensor_sha256().at(name),
              TensorDigest({name, model_io::DTypeName(t.dtype), t.shape}, t.data))
        << name;
  }
  EXPECT_THAT(ServerInfo().weight_update_groups(), ::testing::ElementsAre("train"));
  rl::v1::DestroyWeightsUpdateGroupRequest destroy;
  destroy.set_group_name("train");
  rl::v1::AdminResponse resp;
  ASSERT_TRUE(Call(&Stub::DestroyWeightsUpdateGroup, destroy, &resp).ok());
  EXPECT_TRUE(ServerInfo().weight_update_groups().empty());
}

TEST_F(DistributedUpdateTest, MismatchedBucketLeavesTheWorkerPausedAndSaysSo) {
  auto plan = PlanCheckpoint(Stories(), 1 << 30);
  ASSERT_TRUE(plan.has_value());
  const weight_sync::Bucket& b = plan->buckets.front();
  std::vector<weight_sync::TensorSpec> wrong = b.specs;
  std::swap(wrong[0], wrong[1]);  // same tensors, other order: the header check refuses it
  rl::v1::AdminResponse resp;
  absl::Status sent;
  grpc::Status s = SendBucket(b, wrong, &resp, &sent);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_FALSE(sent.ok());  // the trainer learns that rank 1 rejected the bucket
  const auto info = ServerInfo();
  EXPECT_TRUE(info.paused());
  EXPECT_TRUE(info.update_failed());
  EXPECT_FALSE(info.last_error().empty());
  EXPECT_EQ(server_->weight_version(), 0);
  // The group stays usable: a correct bucket repairs the worker, then continue.
  ASSERT_TRUE(SendBucket(b, b.specs, &resp, &sent).ok());
  EXPECT_TRUE(sent.ok()) << sent;
  EXPECT_FALSE(ServerInfo().update_failed());
}

// An engine paused in place with a request queued: CompleteWeightsUpdate retracts by itself
// (decided on the engine thread) instead of refusing and dropping the received tensors; the
// request then runs on the new weights.
TEST_F(DistributedUpdateTest, CompleteRetractsAQueueThatAnInPlacePauseHolds) {
  TempDir dir;
  WritePerturbedStories(dir.path(), "attn", 1.25f);
  auto plan = PlanCheckpoint(dir.path(), 100 << 10);
  ASSERT_TRUE(plan.has_value());
  rl::v1::AdminResponse resp;
  rl::v1::PauseGenerationRequest pause;
  pause.set_mode(rl::v1::PAUSE_MODE_IN_PLACE);
  ASSERT_TRUE(Call(&Stub::PauseGeneration, pause, &resp).ok());
  rl::v1::GenerateFinal queued;
  auto generate =
      std::async(std::launch::async, [&] { return Generate(Greedy(kPromptIds, 8), &queued); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (ServerInfo().num_waiting() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(ServerInfo().num_waiting(), 1);

  rl::v1::CompleteWeightsUpdateRequest complete;
  complete.set_weight_version(4);
  grpc::Status s = TwoPhaseUpdate(plan->buckets, complete, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ExpectServes(plan->ckpt);
  s = generate.get();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(queued.output_ids_size(), 8);
  EXPECT_EQ(queued.weight_version(), 4);
}

// flush_cache is not read: the prefix cache is flushed on every update, flush_cache=false
// included (KV computed with the old weights is never reused).
TEST_F(DistributedUpdateTest, FlushCacheFalseStillFlushesThePrefixCache) {
  auto plan = PlanCheckpoint(Stories(), 100 << 10);
  ASSERT_TRUE(plan.has_value());
  rl::v1::AdminResponse resp;

  GreedyIds();
  ASSERT_GT(ServerInfo().tree_cache_tokens(), 0);
  rl::v1::CompleteWeightsUpdateRequest complete;
  complete.set_flush_cache(false);
  grpc::Status s = TwoPhaseUpdate(plan->buckets, complete, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(ServerInfo().tree_cache_tokens(), 0);

  GreedyIds();
  ASSERT_GT(ServerInfo().tree_cache_tokens(), 0);
  rl::v1::ReceiveWeightsRequest receive;
  AddBuckets(plan->buckets, &receive);
  receive.set_flush_cache(false);
  auto call =
      std::async(std::launch::async, [&] { return Call(&Stub::ReceiveWeights, receive, &resp); });
  ASSERT_TRUE(BroadcastAll(sender_.get(), plan->buckets).ok());
  s = call.get();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(ServerInfo().tree_cache_tokens(), 0);
  EXPECT_EQ(ServerInfo().weight_version(), 2);
}

// Two receives racing on one group over gRPC: one gets the group, the other is refused with
// FAILED_PRECONDITION naming it; the winner's update completes.
TEST_F(DistributedUpdateTest, RacingReceivesOnOneGroupAreRefusedNotInterleaved) {
  auto plan = PlanCheckpoint(Stories(), 100 << 10);
  ASSERT_TRUE(plan.has_value());
  rl::v1::PrepareWeightsUpdateRequest prepare;
  AddBuckets(plan->buckets, &prepare);
  rl::v1::ReceiveWeightsRequest receive;
  AddBuckets(plan->buckets, &receive);
  rl::v1::AdminResponse prepared, received;
  auto a = std::async(std::launch::async,
                      [&] { return Call(&Stub::PrepareWeightsUpdate, prepare, &prepared); });
  auto b = std::async(std::launch::async,
                      [&] { return Call(&Stub::ReceiveWeights, receive, &received); });
  grpc::Status sa = a.get();  // Prepare answers without data; ReceiveWeights may still wait
  bool receive_won = !sa.ok();
  if (sa.ok()) {
    // Prepare posted first: the receive is refused without touching the group.
    grpc::Status sb = b.get();
    EXPECT_EQ(sb.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << sb.error_message();
    EXPECT_THAT(sb.error_message(), ::testing::HasSubstr("group 'train'"));
  } else {
    EXPECT_EQ(sa.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << sa.error_message();
    EXPECT_THAT(sa.error_message(), ::testing::HasSubstr("group 'train'"));
  }
  ASSERT_TRUE(BroadcastAll(sender_.get(), plan->buckets).ok());
  if (receive_won) {
    grpc::Status sb = b.get();
    ASSERT_TRUE(sb.ok()) << sb.error_message();
  } else {
    rl::v1::CompleteWeightsUpdateRequest complete;
    complete.set_group_name("train");
    grpc::Status sc = Call(&Stub::CompleteWeightsUpdate, complete, &prepared);
    ASSERT_TRUE(sc.ok()) << sc.error_message();
  }
  EXPECT_EQ(ServerInfo().weight_version(), 1);
  ExpectServes(plan->ckpt);
}

// Asleep (ReleaseMemory), a two-phase update is checked against the served weights' names and
// shapes (read at start, no engine round trip), staged, and served on wake.
TEST_F(DistributedUpdateTest, TwoPhaseUpdateWhileAsleepServesOnWake) {
  TempDir dir;
  WritePerturbedStories(dir.path(), "attn", 0.8f);
  auto plan = PlanCheckpoint(dir.path(), 100 << 10);
  ASSERT_TRUE(plan.has_value());
  rl::v1::AdminResponse resp;
  ASSERT_TRUE(Call(&Stub::ReleaseMemory, rl::v1::ReleaseMemoryRequest(), &resp).ok());
  ASSERT_TRUE(ServerInfo().asleep());
  rl::v1::CompleteWeightsUpdateRequest complete;
  complete.set_weight_version(6);
  grpc::Status s = TwoPhaseUpdate(plan->buckets, complete, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(ServerInfo().weight_version(), 6);
  EXPECT_TRUE(ServerInfo().asleep());  // staged, still asleep
  s = Call(&Stub::ResumeMemory, rl::v1::ResumeMemoryRequest(), &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(ServerInfo().asleep());
  ExpectServes(plan->ckpt);
}

TEST(DistributedInitTest, InitWithoutATrainerTimesOutClearly) {
  WorkerConfig config;
  config.model_path = Stories();
  config.kv_cache_gb = 0.01;
  auto server = WorkerServer::Start(config);
  ASSERT_TRUE(server.ok());
  GroupRequest g;
  g.master_address = "127.0.0.1";
  g.master_port = 1;
  g.rank_offset = 1;
  g.world_size = 2;
  g.group_name = "nobody";
  g.backend = "tcp";
  g.timeout_ms = 300;
  auto r = (*server)->weights().InitWeightsUpdateGroup(g);
  EXPECT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("127.0.0.1"), std::string::npos) << r.status();
  g.rank_offset = 0;
  EXPECT_EQ((*server)->weights().InitWeightsUpdateGroup(g).status().code(),
            absl::StatusCode::kInvalidArgument);
  (*server)->Shutdown();
}

// ---- staged group receives ----

// ReceiveWeights{stage}: received while the engine keeps generating (never paused), staged, served
// only at ActivateWeights, with exactly the trainer's tensors.
TEST_F(DistributedUpdateTest, AStagedReceiveKeepsServingUntilActivate) {
  TempDir dir;
  WritePerturbedStories(dir.path(), "mlp", 0.75f);
  auto plan = PlanCheckpoint(dir.path(), 100 << 10);
  ASSERT_TRUE(plan.has_value());
  ASSERT_GT(plan->buckets.size(), 1u);
  const std::vector<int32_t> before = GreedyIds();
  rl::v1::AdminResponse resp;
  auto call = std::async(std::launch::async, [&] {
    return Call(&Stub::ReceiveWeights, StagedReceive(plan->buckets, 6), &resp);
  });
  // While the receive waits for the trainer the worker serves (and is not paused).
  for (int i = 0; i < 2000 && !ServerInfo().staging(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_TRUE(ServerInfo().staging());
  EXPECT_FALSE(ServerInfo().paused());
  EXPECT_EQ(GreedyIds(), before);
  ASSERT_TRUE(BroadcastAll(sender_.get(), plan->buckets).ok());
  grpc::Status s = call.get();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.weight_version(), 0);
  rl::v1::GetServerInfoResponse info = ServerInfo();
  EXPECT_TRUE(info.has_staged_weights());
  EXPECT_EQ(info.staged_source(), "group:train");
  EXPECT_EQ(info.staged_weight_version(), 6);
  EXPECT_FALSE(info.paused());
  EXPECT_EQ(GreedyIds(), before);  // staged, not served
  ASSERT_TRUE(Activate(6, &resp).ok());
  EXPECT_EQ(ServerInfo().weight_version(), 6);
  EXPECT_FALSE(ServerInfo().has_staged_weights());
  EXPECT_NE(GreedyIds(), before);
  ExpectServes(plan->ckpt);
  // Engine options belong to ActivateWeights.
  rl::v1::ReceiveWeightsRequest keep = StagedReceive(plan->buckets, 7);
  keep.set_keep_pause(true);
  EXPECT_EQ(Call(&Stub::ReceiveWeights, keep, &resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

// CompleteWeightsUpdate{stage}: the prepared receive becomes the staged version (no pause).
TEST_F(DistributedUpdateTest, AStagedCompleteKeepsTheReceiveForActivate) {
  TempDir dir;
  WritePerturbedStories(dir.path(), "attn", 1.25f);
  auto plan = PlanCheckpoint(dir.path(), 100 << 10);
  ASSERT_TRUE(plan.has_value());
  const std::vector<int32_t> before = GreedyIds();
  rl::v1::CompleteWeightsUpdateRequest complete;
  complete.set_stage(true);
  complete.set_weight_version(4);
  rl::v1::AdminResponse resp;
  grpc::Status s = TwoPhaseUpdate(plan->buckets, complete, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.weight_version(), 0);
  EXPECT_TRUE(ServerInfo().has_staged_weights());
  EXPECT_EQ(ServerInfo().staged_source(), "group:train");
  EXPECT_FALSE(ServerInfo().paused());
  EXPECT_EQ(GreedyIds(), before);
  // The group is free again (the prepared receive was taken).
  complete.set_stage(false);
  EXPECT_EQ(Call(&Stub::CompleteWeightsUpdate, complete, &resp).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  ASSERT_TRUE(Activate(4, &resp).ok());
  EXPECT_EQ(ServerInfo().weight_version(), 4);
  ExpectServes(plan->ckpt);
}

// A staged receive cut leaves nothing staged and nothing served: here the group is destroyed while
// it waits; below, the trainer dies after its first bucket.
TEST_F(DistributedUpdateTest, AStagedReceiveCutByDestroyStagesNothing) {
  TempDir dir;
  WritePerturbedStories(dir.path(), "mlp", 0.75f);
  auto plan = PlanCheckpoint(dir.path(), 100 << 10);
  ASSERT_TRUE(plan.has_value());
  ASSERT_GT(plan->buckets.size(), 1u);
  const std::vector<int32_t> before = GreedyIds();
  rl::v1::AdminResponse resp;
  // Cut 1: the group is destroyed while the receive waits (nothing sent yet).
  {
    auto call = std::async(std::launch::async, [&] {
      return Call(&Stub::ReceiveWeights, StagedReceive(plan->buckets, 6), &resp);
    });
    for (int i = 0; i < 2000 && !ServerInfo().staging(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_TRUE(ServerInfo().staging());
    rl::v1::DestroyWeightsUpdateGroupRequest destroy;
    destroy.set_group_name("train");
    ASSERT_TRUE(Call(&Stub::DestroyWeightsUpdateGroup, destroy, &resp).ok());
    const grpc::Status s = call.get();
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.error_message().find("nothing is staged"), std::string::npos) << s.error_message();
  }
  rl::v1::GetServerInfoResponse info = ServerInfo();
  EXPECT_FALSE(info.has_staged_weights());
  EXPECT_FALSE(info.staging());
  EXPECT_EQ(Activate(6, &resp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(GreedyIds(), before);
  EXPECT_EQ(ServerInfo().weight_version(), 0);
}

TEST_F(DistributedUpdateTest, AStagedReceiveCutAfterSomeBucketsStagesNothing) {
  TempDir dir;
  WritePerturbedStories(dir.path(), "mlp", 0.75f);
  auto plan = PlanCheckpoint(dir.path(), 100 << 10);
  ASSERT_TRUE(plan.has_value());
  ASSERT_GT(plan->buckets.size(), 1u);
  const std::vector<int32_t> before = GreedyIds();
  rl::v1::AdminResponse resp;
  auto call = std::async(std::launch::async, [&] {
    return Call(&Stub::ReceiveWeights, StagedReceive(plan->buckets, 6), &resp);
  });
  // The trainer sends the first bucket, then dies (its connection closes).
  ASSERT_TRUE(sender_->Broadcast(plan->buckets[0].specs, plan->buckets[0].data).ok());
  sender_->Close();
  const grpc::Status s = call.get();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.error_message().find("nothing is staged"), std::string::npos) << s.error_message();
  EXPECT_FALSE(ServerInfo().has_staged_weights());
  EXPECT_FALSE(ServerInfo().staging());
  EXPECT_EQ(Activate(6, &resp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(GreedyIds(), before);
}

// A NaN in a received tensor is refused while it is copied, naming it; nothing is staged.
TEST_F(DistributedUpdateTest, AStagedReceiveRefusesNonFiniteWeights) {
  TempDir dir;
  WritePerturbedStories(dir.path(), "mlp.down_proj", std::numeric_limits<float>::quiet_NaN());
  std::optional<PlannedCheckpoint> plan;
  {
    model_io::ScopedNonFiniteWeightsAllowed allow;  // the trainer's side reads its checkpoint
    plan = PlanCheckpoint(dir.path(), 100 << 10);
  }
  ASSERT_TRUE(plan.has_value());
  const std::vector<int32_t> before = GreedyIds();
  rl::v1::AdminResponse resp;
  auto call = std::async(std::launch::async, [&] {
    return Call(&Stub::ReceiveWeights, StagedReceive(plan->buckets, 6), &resp);
  });
  // The worker reads every bucket (the group stays in step) and refuses the receive.
  ASSERT_TRUE(BroadcastAll(sender_.get(), plan->buckets).ok());
  const grpc::Status s = call.get();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("NaN"), std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("down_proj"), std::string::npos) << s.error_message();
  EXPECT_FALSE(ServerInfo().has_staged_weights());
  EXPECT_EQ(GreedyIds(), before);
  // The group is still in step: a clean receive on it stages.
  auto clean = PlanCheckpoint(Stories(), 100 << 10);
  ASSERT_TRUE(clean.has_value());
  call = std::async(std::launch::async, [&] {
    return Call(&Stub::ReceiveWeights, StagedReceive(clean->buckets, 7), &resp);
  });
  ASSERT_TRUE(BroadcastAll(sender_.get(), clean->buckets).ok());
  const grpc::Status again = call.get();
  ASSERT_TRUE(again.ok()) << again.error_message();
  EXPECT_TRUE(ServerInfo().has_staged_weights());
}

}  // namespace
}  // namespace rl::worker::testing
