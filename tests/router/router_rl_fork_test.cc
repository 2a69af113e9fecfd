// The RL fork's additions through rl-router: R3 routed experts pass through Generate (with the
// trajectory) from a Qwen3-MoE worker, and the two-phase (Prepare/Complete) and single-call
// (ReceiveWeights) receives fan out to every worker of a tcp group formed through the router.
#include <future>

#include "common/model_io/model_maker.h"
#include "common/weight_sync/bucket_plan.h"
#include "gtest/gtest.h"
#include "services/worker/weight_sync/weight_sync.h"
#include "tests/testing/router_fleet.h"
#include "tests/worker/worker_test_util.h"

namespace rl::router {
namespace {

using worker::testing::AddBuckets;
using worker::testing::BroadcastAll;
using worker::testing::TempDir;

class RouterRlForkTest : public ::testing::Test {
 protected:
  // `n` workers on `model` (stories260K when empty) and a router over them with its tokenizer.
  void StartFleet(int n, const std::string& model = "", bool r3 = false) {
    RouterConfig config;
    for (int i = 0; i < n; ++i) {
      worker::WorkerConfig wc;
      wc.enable_return_routed_experts = r3;
      auto w = testing::StartTestWorker(wc, model);
      ASSERT_TRUE(w.ok()) << w.status();
      config.workers.push_back((*w)->address());
      workers_.push_back(*std::move(w));
    }
    auto r = testing::StartTestRouter(config, model);
    ASSERT_TRUE(r.ok()) << r.status();
    router_ = *std::move(r);
    auto channel = grpc::CreateChannel(router_->address(), grpc::InsecureChannelCredentials());
    stub_ = rl::v1::Router::NewStub(channel);
    admin_ = rl::v1::Admin::NewStub(channel);
  }

  void TearDown() override {
    if (sender_) sender_->Close();
    if (router_) router_->Shutdown();
    for (auto& w : workers_) w->Shutdown();
  }

  // A tcp group of the trainer (rank 0) and every worker, formed through the router.
  void FormGroup() {
    weight_sync::GroupOptions options;
    options.rank = 0;
    options.world_size = static_cast<int>(workers_.size()) + 1;
    options.group_name = "train";
    options.timeout = std::chrono::seconds(20);
    auto sender = weight_sync::WeightSender::Create(options);
    ASSERT_TRUE(sender.ok()) << sender.status();
    sender_ = *std::move(sender);
    auto join = std::async(std::launch::async, [this] {
      rl::v1::InitWeightsUpdateGroupRequest init;
      init.set_master_address("127.0.0.1");
      init.set_master_port(sender_->port());
      init.set_rank_offset(1);
      init.set_world_size(static_cast<int>(workers_.size()) + 1);
      init.set_group_name("train");
      init.set_backend(rl::v1::GROUP_BACKEND_TCP);
      rl::v1::AdminResponse resp;
      grpc::ClientContext ctx;
      grpc::Status s = admin_->InitWeightsUpdateGroup(&ctx, init, &resp);
      return s.ok() && resp.success();
    });
    ASSERT_TRUE(sender_->WaitForReceivers().ok());
    ASSERT_TRUE(join.get());
  }

  std::vector<int64_t> WorkerVersions() {
    std::vector<int64_t> v;
    for (auto& w : workers_) v.push_back(w->weight_version());
    return v;
  }

  std::vector<std::unique_ptr<worker::WorkerServer>> workers_;
  std::unique_ptr<RouterServer> router_;
  std::unique_ptr<rl::v1::Router::Stub> stub_;
  std::unique_ptr<rl::v1::Admin::Stub> admin_;
  std::unique_ptr<weight_sync::WeightSender> sender_;
};

TEST_F(RouterRlForkTest, TwoPhaseAndSingleCallReceiveFanOut) {
  StartFleet(2);
  FormGroup();
  TempDir dir;
  worker::testing::WritePerturbedStories(dir.path(), "attn", 1.25f);
  auto ckpt = model_io::OpenCheckpoint(dir.path());
  ASSERT_TRUE(ckpt.ok());
  auto buckets = weight_sync::PlanBuckets(*ckpt, 100 << 10);
  ASSERT_TRUE(buckets.ok());

  rl::v1::PrepareWeightsUpdateRequest prepare;
  AddBuckets(*buckets, &prepare);
  rl::v1::AdminResponse resp;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_->PrepareWeightsUpdate(&ctx, prepare, &resp).ok());
  }
  EXPECT_TRUE(resp.success()) << resp.message();
  EXPECT_TRUE(resp.ready());
  ASSERT_EQ(resp.results_size(), 2);
  ASSERT_TRUE(BroadcastAll(sender_.get(), *buckets).ok());
  EXPECT_EQ(WorkerVersions(), (std::vector<int64_t>{0, 0}));  // received, not applied
  rl::v1::CompleteWeightsUpdateRequest complete;
  complete.set_group_name("train");
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_->CompleteWeightsUpdate(&ctx, complete, &resp).ok());
  }
  EXPECT_TRUE(resp.success()) << resp.message();
  EXPECT_EQ(resp.weight_version(), 1);
  EXPECT_EQ(WorkerVersions(), (std::vector<int64_t>{1, 1}));

  rl::v1::ReceiveWeightsRequest receive;
  AddBuckets(*buckets, &receive);
  receive.set_weight_version(5);
  auto call = std::async(std::launch::async, [&] {
    grpc::ClientContext ctx;
    rl::v1::AdminResponse r;
    grpc::Status s = admin_->ReceiveWeights(&ctx, receive, &r);
    return s.ok() && r.success() && r.weight_version() == 5;
  });
  ASSERT_TRUE(BroadcastAll(sender_.get(), *buckets).ok());
  EXPECT_TRUE(call.get());
  EXPECT_EQ(WorkerVersions(), (std::vector<int64_t>{5, 5}));
}

TEST_F(RouterRlForkTest, RoutedExpertsPassThroughWithTheTrajectory) {
  TempDir dir;
  model_io::MakeModelOptions mo;
  mo.arch = "qwen3_moe";
  mo.seed = 31;
  mo.out_dir = dir.path();
  ASSERT_TRUE(model_io::MakeModel(mo).ok());
  StartFleet(1, dir.path(), /*r3=*/true);
  rl::v1::GenerateRequest req;
  req.set_text("Once upon a time");
  req.mutable_sampling_params()->set_temperature(0);
  req.mutable_sampling_params()->set_max_new_tokens(5);
  req.mutable_sampling_params()->set_ignore_eos(true);
  req.set_return_trajectory(true);
  req.set_return_routed_experts(true);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, req);
  rl::v1::GenerateResponse msg;
  rl::v1::GenerateFinal f;
  while (reader->Read(&msg)) {
    if (msg.has_final()) f = msg.final();
  }
  grpc::Status s = reader->Finish();
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(f.output_ids_size(), 5);
  const int tokens = f.trajectory().tokens_size();
  ASSERT_EQ(f.routed_experts().shape_size(), 3);
  EXPECT_EQ(f.routed_experts().shape(0), tokens - 1);  // every token but the last output
  EXPECT_EQ(f.routed_experts().shape(1), 2);
  EXPECT_EQ(f.routed_experts().shape(2), 4);
  EXPECT_EQ(f.routed_experts().expert_ids().size(), static_cast<size_t>((tokens - 1) * 2 * 4 * 4));
  EXPECT_TRUE(f.routed_experts().expert_weights().empty());
  const auto* ids = reinterpret_cast<const int32_t*>(f.routed_experts().expert_ids().data());
  for (int i = 0; i < (tokens - 1) * 8; ++i) {
    ASSERT_GE(ids[i], 0);
    ASSERT_LT(ids[i], 16);
  }
}

}  // namespace
}  // namespace rl::router
