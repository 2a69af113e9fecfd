// rl-router over in-process rl-workers on loopback (stories260K): balancing, the text cache
// with exact tokens / masks / logprobs, GC by weight version (the cache following the fleet's
// version), retries around a dead worker (and the streams of a worker marked dead cancelled and
// retried), the admin fan-out (broadcast, lock timeout, disable/restore) and auth.
#include <atomic>
#include <cmath>
#include <set>
#include <thread>

#include "rl/v1/router.grpc.pb.h"
#include "services/router/router_server.h"
#include "tests/testing/router_fleet.h"
#include "tests/worker/worker_test_util.h"

namespace rl::router {
namespace {

using worker::testing::kGoldenIds;
using worker::testing::Stories;

class RouterTest : public testing::RouterFleetTest {};

TEST_F(RouterTest, GreedyThroughTheRouterMatchesTheGolden) {
  StartFleet(2);
  rl::v1::GenerateFinal f;
  std::string streamed;
  ASSERT_TRUE(Generate(TextRequest("Once upon a time", 20), &f, &streamed).ok());
  EXPECT_EQ(std::vector<int32_t>(f.output_ids().begin(), f.output_ids().end()), kGoldenIds);
  EXPECT_EQ(f.text(), ", there was a little girl named Lily. She loved to play outsid");
  EXPECT_EQ(streamed, f.text());
  EXPECT_FALSE(f.worker().empty());
  EXPECT_EQ(f.attempts(), 1);
  // The trajectory: 5 prompt tokens (mask 0, unknown logprob), 20 generated (mask 1).
  const rl::v1::Trajectory& t = f.trajectory();
  ASSERT_EQ(t.tokens_size(), 25);
  for (int i = 0; i < 25; ++i) {
    EXPECT_EQ(t.loss_mask(i), i < 5 ? 0 : 1);
    if (i < 5) {
      EXPECT_TRUE(std::isnan(t.rollout_logp(i)));
    } else {
      EXPECT_EQ(t.rollout_logp(i), f.output_logprobs(i - 5).logprob());
    }
  }
}

TEST_F(RouterTest, RoundRobinIsEven) {
  StartFleet(3);
  std::map<std::string, int> served;
  for (int i = 0; i < 12; ++i) {
    rl::v1::GenerateRequest req;
    req.mutable_input_ids()->add_ids(1);
    req.mutable_sampling_params()->set_max_new_tokens(2);
    rl::v1::GenerateFinal f;
    ASSERT_TRUE(Generate(req, &f).ok());
    served[f.worker()]++;
  }
  ASSERT_EQ(served.size(), 3u);
  for (const auto& [w, n] : served) EXPECT_EQ(n, 4) << w;
  const auto after = ListWorkers();
  for (const auto& w : after.workers()) EXPECT_EQ(w.in_flight(), 0);
}

TEST_F(RouterTest, MultiTurnHitsTheCacheAndRetrieveIsExact) {
  StartFleet(2);
  rl::v1::GenerateFinal turn1;
  ASSERT_TRUE(Generate(TextRequest("Once upon a time", 12), &turn1).ok());
  const std::string text1 = "Once upon a time" + turn1.text();
  // Retrieve returns exactly the tokens, masks and logprobs of turn 1.
  rl::v1::RetrieveFromTextRequest rreq;
  rreq.set_text(text1);
  rl::v1::RetrieveFromTextResponse r;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->RetrieveFromText(&ctx, rreq, &r).ok());
  }
  EXPECT_EQ(r.matched_bytes(), static_cast<int64_t>(text1.size()));
  const rl::v1::Trajectory& t1 = turn1.trajectory();
  ASSERT_EQ(r.trajectory().tokens_size(), t1.tokens_size());
  for (int i = 0; i < t1.tokens_size(); ++i) {
    EXPECT_EQ(r.trajectory().tokens(i), t1.tokens(i));
    EXPECT_EQ(r.trajectory().loss_mask(i), t1.loss_mask(i));
    if (!std::isnan(t1.rollout_logp(i)))
      EXPECT_EQ(r.trajectory().rollout_logp(i), t1.rollout_logp(i));
  }
  // Turn 2 extends turn 1: the cached tokens are reused exactly, generated ones keep mask 1.
  const std::string text2 = text1 + " The end. One day,";
  rl::v1::GenerateFinal turn2;
  ASSERT_TRUE(Generate(TextRequest(text2, 8), &turn2).ok());
  const rl::v1::Trajectory& t2 = turn2.trajectory();
  for (int i = 0; i < t1.tokens_size(); ++i) {
    EXPECT_EQ(t2.tokens(i), t1.tokens(i));
    EXPECT_EQ(t2.loss_mask(i), t1.loss_mask(i));
  }
  for (int i = t1.tokens_size(); i < t2.tokens_size() - 8; ++i) EXPECT_EQ(t2.loss_mask(i), 0);
  for (int i = t2.tokens_size() - 8; i < t2.tokens_size(); ++i) EXPECT_EQ(t2.loss_mask(i), 1);
  rl::v1::GetMetricsResponse m;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->GetMetrics(&ctx, {}, &m).ok());
  EXPECT_GE(m.cache().hits(), 2);
  EXPECT_GT(m.cache().size_tokens(), 0);
  EXPECT_NE(m.prometheus_text().find("rl_router_cache_hits_total"), std::string::npos);
}

TEST_F(RouterTest, GcCollectsOldVersionsAfterWeightUpdates) {
  RouterConfig config;
  config.max_cache_size = 30;
  config.gc_threshold_k = 1;
  StartFleet(1, config);
  rl::v1::GenerateFinal f;
  ASSERT_TRUE(Generate(TextRequest("Once upon a time", 20), &f).ok());
  EXPECT_EQ(router_->cache().GetStats().size_tokens, 25);
  for (int v = 1; v <= 2; ++v) {
    rl::v1::UpdateWeightsFromDiskRequest req;
    req.set_model_path(Stories());
    rl::v1::AdminResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_->UpdateWeightsFromDisk(&ctx, req, &resp).ok());
    EXPECT_TRUE(resp.success());
    EXPECT_EQ(resp.weight_version(), v);
  }
  ASSERT_TRUE(Generate(TextRequest("A cat sat", 20), &f).ok());
  EXPECT_EQ(f.weight_version(), 2);
  const TextCacheStats s = router_->cache().GetStats();
  EXPECT_GE(s.gc_runs, 1);
  EXPECT_EQ(s.gc_removed_tokens, 25);  // the version-0 trajectory went
  rl::v1::RetrieveFromTextRequest rreq;
  rreq.set_text("Once upon a time");
  rl::v1::RetrieveFromTextResponse r;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->RetrieveFromText(&ctx, rreq, &r).ok());
  EXPECT_EQ(r.matched_bytes(), 0);
}

TEST_F(RouterTest, DeadWorkerIsRoutedAroundAndNothingIsLost) {
  StartFleet(2);
  workers_[1]->Shutdown();
  int ok = 0;
  for (int i = 0; i < 10; ++i) {
    rl::v1::GenerateFinal f;
    grpc::Status s = Generate(TextRequest("Once upon a time", 4, false), &f);
    EXPECT_TRUE(s.ok()) << s.error_message();
    ok += s.ok();
  }
  EXPECT_EQ(ok, 10);
  router_->pool().CheckAll();
  router_->pool().CheckAll();
  const auto list = ListWorkers();
  int live = 0;
  for (const auto& w : list.workers()) live += w.state() == rl::v1::WORKER_STATE_LIVE;
  EXPECT_EQ(live, 1);
}

TEST_F(RouterTest, AdminBroadcastUnderLoadAndRestoresRouting) {
  StartFleet(2);
  std::atomic<int> failures{0};
  std::vector<std::thread> load;
  for (int i = 0; i < 4; ++i) {
    load.emplace_back([&] {
      for (int j = 0; j < 5; ++j) {
        rl::v1::GenerateFinal f;
        if (!Generate(TextRequest("Once upon a time", 8, false), &f).ok()) failures++;
      }
    });
  }
  rl::v1::PauseGenerationRequest pause;
  pause.set_mode(rl::v1::PAUSE_MODE_RETRACT);
  rl::v1::AdminResponse resp;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_->PauseGeneration(&ctx, pause, &resp).ok());
  }
  EXPECT_TRUE(resp.success());
  ASSERT_EQ(resp.results_size(), 2);
  rl::v1::UpdateWeightsFromDiskRequest update;
  update.set_model_path(Stories());
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_->UpdateWeightsFromDisk(&ctx, update, &resp).ok());
  }
  EXPECT_TRUE(resp.success()) << resp.message();
  EXPECT_EQ(resp.weight_version(), 1);
  for (auto& t : load) t.join();
  EXPECT_EQ(failures.load(), 0);
  const auto listing = ListWorkers();
  for (const auto& w : listing.workers()) {
    EXPECT_TRUE(w.enabled());
    EXPECT_EQ(w.weight_version(), 1);
    EXPECT_FALSE(w.version_mismatch());
  }
}

// While an admin broadcast holds the pool with every worker out of routing, a generation
// waits for the broadcast instead of failing, and goes through once routing is restored.
TEST_F(RouterTest, GenerateWaitsForAHoldingBroadcast) {
  StartFleet(2);
  WorkerPool& pool = router_->pool();
  pool.BeginHold();
  for (const auto& w : workers_) ASSERT_TRUE(pool.SetEnabled(w->address(), false).ok());
  std::atomic<bool> done{false};
  grpc::Status status;
  rl::v1::GenerateFinal f;
  std::thread t([&] {
    status = Generate(TextRequest("Once upon a time", 4, false), &f);
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // > the whole retry budget
  EXPECT_FALSE(done.load());
  for (const auto& w : workers_) ASSERT_TRUE(pool.SetEnabled(w->address(), true).ok());
  pool.EndHold();
  t.join();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(f.completion_tokens(), 4);
}

// A failed disk load leaves the old weights serving: every worker routes again at once.
TEST_F(RouterTest, FailedDiskUpdateRestoresRoutingAtOnce) {
  StartFleet(2);
  rl::v1::UpdateWeightsFromDiskRequest update;
  update.set_model_path("/nonexistent");
  rl::v1::AdminResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(admin_->UpdateWeightsFromDisk(&ctx, update, &resp).ok());
  EXPECT_FALSE(resp.success());
  for (const auto& r : resp.results()) {
    EXPECT_EQ(r.code(), "INVALID_ARGUMENT");
    EXPECT_FALSE(r.left_out());
  }
  const auto listing = ListWorkers();
  EXPECT_EQ(listing.fleet_weight_version(), -1);  // nothing was installed
  for (const auto& w : listing.workers()) {
    EXPECT_TRUE(w.enabled());
    EXPECT_EQ(w.state(), rl::v1::WORKER_STATE_LIVE);
    EXPECT_EQ(w.reason(), "");
  }
  std::set<std::string> served;
  for (int i = 0; i < 4; ++i) {
    rl::v1::GenerateFinal f;
    ASSERT_TRUE(Generate(TextRequest("Once", 2, false), &f).ok());
    served.insert(f.worker());
  }
  EXPECT_EQ(served.size(), 2u);
}

TEST_F(RouterTest, AdminLockTimesOut) {
  RouterConfig config;
  config.admin_lock_timeout_ms = 200;
  StartFleet(1, config);
  // Hold the lock with a slow call: a group init that waits for a trainer that never comes.
  std::thread slow([&] {
    rl::v1::InitWeightsUpdateGroupRequest init;
    init.set_master_address("127.0.0.1");
    init.set_master_port(1);  // nothing listens there
    init.set_world_size(2);
    init.set_rank_offset(1);
    init.set_group_name("g");
    init.set_backend(rl::v1::GROUP_BACKEND_TCP);
    init.set_timeout_ms(1500);
    rl::v1::AdminResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_->InitWeightsUpdateGroup(&ctx, init, &resp).ok());
    EXPECT_FALSE(resp.success());
    EXPECT_NE(resp.results(0).message().find("127.0.0.1"), std::string::npos);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  rl::v1::PauseGenerationRequest pause;
  pause.set_mode(rl::v1::PAUSE_MODE_IN_PLACE);
  rl::v1::AdminResponse resp;
  grpc::ClientContext ctx;
  grpc::Status s = admin_->PauseGeneration(&ctx, pause, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(s.error_message().find("admin lock"), std::string::npos);
  slow.join();
  // The worker whose group init failed stays disabled, with the reason.
  const auto listing = ListWorkers();
  EXPECT_FALSE(listing.workers(0).enabled());
  EXPECT_NE(listing.workers(0).reason().find("weights may be partial"), std::string::npos)
      << listing.workers(0).reason();
}

TEST_F(RouterTest, DifferentWeightVersionsAreFlagged) {
  StartFleet(2);
  // Update one worker behind the router's back.
  auto direct = rl::v1::Admin::NewStub(
      grpc::CreateChannel(workers_[0]->address(), grpc::InsecureChannelCredentials()));
  rl::v1::UpdateWeightsFromDiskRequest update;
  update.set_model_path(Stories());
  rl::v1::AdminResponse resp;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(direct->UpdateWeightsFromDisk(&ctx, update, &resp).ok());
  }
  router_->pool().CheckAll();
  const auto listing = ListWorkers();
  int flagged = 0;
  for (const auto& w : listing.workers()) flagged += w.version_mismatch();
  EXPECT_EQ(flagged, 1);  // the stale one
  rl::v1::GetMetricsResponse m;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->GetMetrics(&ctx, {}, &m).ok());
  EXPECT_TRUE(m.weight_version_mismatch());
  EXPECT_NE(m.prometheus_text().find("rl_router_weight_version_mismatch 1"), std::string::npos);
}

TEST_F(RouterTest, SleepingWorkersAreNotRouted) {
  StartFleet(2);
  rl::v1::AdminResponse resp;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_->ReleaseMemory(&ctx, {}, &resp).ok());
  }
  EXPECT_TRUE(resp.success()) << resp.message();
  rl::v1::GenerateFinal f;
  grpc::Status s = Generate(TextRequest("Once", 2, false), &f);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  router_->pool().CheckAll();  // health says NOT_SERVING: still live, still not routed
  const auto listing = ListWorkers();
  for (const auto& w : listing.workers()) EXPECT_EQ(w.state(), rl::v1::WORKER_STATE_LIVE);
  EXPECT_EQ(Generate(TextRequest("Once", 2, false), &f).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_->ResumeMemory(&ctx, {}, &resp).ok());
  }
  EXPECT_TRUE(resp.success());
  EXPECT_TRUE(Generate(TextRequest("Once", 2, false), &f).ok());
}

TEST_F(RouterTest, ReadOnlyAdminCallsListEveryWorker) {
  StartFleet(2);
  rl::v1::GetModelInfoResponse info;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_->GetModelInfo(&ctx, {}, &info).ok());
  }
  EXPECT_EQ(info.vocab_size(), 512);
  EXPECT_EQ(info.workers_size(), 2);
  rl::v1::GetServerInfoResponse server;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_->GetServerInfo(&ctx, {}, &server).ok());
  }
  EXPECT_EQ(server.workers_size(), 2);
  EXPECT_EQ(server.kv_tokens_total(), server.workers(0).info().kv_tokens_total() +
                                          server.workers(1).info().kv_tokens_total());
  rl::v1::WeightsCheckerRequest req;
  req.set_action(rl::v1::WEIGHTS_CHECKER_ACTION_CHECKSUM);
  rl::v1::WeightsCheckerResponse sums;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_->WeightsChecker(&ctx, req, &sums).ok());
  }
  ASSERT_EQ(sums.workers_size(), 2);
  EXPECT_TRUE(sums.success());
  EXPECT_EQ(sums.workers(0).result().rank_sha256(), sums.workers(1).result().rank_sha256());
  EXPECT_EQ(sums.workers(0).result().rank_sha256().size(), 64u);
}

TEST_F(RouterTest, AuthIsCheckedAndForwarded) {
  RouterConfig config;
  config.admin_api_key = "k";
  worker::WorkerConfig wc;
  wc.admin_api_key = "k";
  StartFleet(1, config, wc);
  rl::v1::AdminResponse resp;
  rl::v1::PauseGenerationRequest pause;
  pause.set_mode(rl::v1::PAUSE_MODE_IN_PLACE);
  {
    grpc::ClientContext ctx;
    EXPECT_EQ(admin_->PauseGeneration(&ctx, pause, &resp).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer k");
    ASSERT_TRUE(admin_->PauseGeneration(&ctx, pause, &resp).ok());
    EXPECT_TRUE(resp.success()) << resp.message();  // the worker accepted the forwarded key
  }
  rl::v1::WorkerListResponse list;
  grpc::ClientContext ctx;
  EXPECT_EQ(stub_->ListWorkers(&ctx, {}, &list).error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

// A request waiting on a worker the pool marks dead is cancelled at once and retried on
// another worker (nothing was streamed yet).
TEST_F(RouterTest, MarkingAWorkerDeadCancelsItsStreamsAndRetriesThem) {
  StartFleet(2);
  WorkerPool& pool = router_->pool();
  const std::string stuck = workers_[0]->address();
  const std::string good = workers_[1]->address();
  // The stuck worker holds requests: the fleet is paused in place through the router (a worker
  // paused behind the router's back refuses requests the router sends while its fleet runs);
  // the good one is continued directly and is out of routing for now.
  {
    rl::v1::PauseGenerationRequest pause;
    pause.set_mode(rl::v1::PAUSE_MODE_IN_PLACE);
    rl::v1::AdminResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_->PauseGeneration(&ctx, pause, &resp).ok());
    ASSERT_TRUE(resp.success()) << resp.message();
  }
  ASSERT_TRUE(workers_[1]->control().Continue().ok());
  ASSERT_TRUE(pool.SetEnabled(good, false).ok());
  grpc::Status status;
  rl::v1::GenerateFinal f;
  std::thread client([&] { status = Generate(TextRequest("Once upon a time", 4), &f); });
  ASSERT_TRUE(WaitFor([&] { return Status(stuck).in_flight() == 1; }));
  ASSERT_TRUE(pool.SetEnabled(good, true).ok());
  pool.MarkDead(pool.Find(stuck).get(), "test: hung");
  client.join();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(f.worker(), good);
  EXPECT_EQ(f.attempts(), 2);
  EXPECT_EQ(f.completion_tokens(), 4);
  ASSERT_TRUE(workers_[0]->control().Continue().ok());
}

// The text cache learns of a fleet-wide weight update from the pool (the observer wired in
// RouterServer), before any response at the new version was inserted.
TEST_F(RouterTest, CacheFollowsTheFleetVersion) {
  StartFleet(2);
  rl::v1::UpdateWeightsFromDiskRequest update;
  update.set_model_path(Stories());
  update.set_weight_version(7);
  rl::v1::AdminResponse resp;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(admin_->UpdateWeightsFromDisk(&ctx, update, &resp).ok());
  }
  ASSERT_TRUE(resp.success()) << resp.message();
  EXPECT_EQ(router_->cache().GetStats().current_version, 7);
  EXPECT_EQ(ListWorkers().fleet_weight_version(), 7);
  rl::v1::GetMetricsResponse m;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->GetMetrics(&ctx, {}, &m).ok());
  EXPECT_EQ(m.cache().current_weight_version(), 7);
}

}  // namespace
}  // namespace rl::router
