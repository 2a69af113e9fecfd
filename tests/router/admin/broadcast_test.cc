// The router's admin broadcast engine (services/router/admin/broadcast.h) on the asynchronous
// client API, against in-process fake workers (tests/testing/fake_worker.h):
// - a broadcast over many workers whose calls hang adds no thread per worker to the process
//   (one admin-executor thread waits for all), and every worker's answer is aggregated once
//   they answer;
// - a storm of Router.Abort calls forwarded to a hung worker (64, the cap, each held by the
//   worker) does not delay FlushCache / PauseGeneration / ContinueGeneration broadcasts through
//   a router with a single admin thread: each completes within a generous deadline (the
//   forwarding holds no thread).
// - one admin operation may hold the admin lock across several broadcasts (BroadcastLocked)
//   while other callers wait and are refused UNAVAILABLE; an unknown resync target is NOT_FOUND
//   before any wait; a broadcast records whether it leaves the fleet paused.
// Every wait is bounded (deadlines on calls, at most 60 s per wait). No timed assertions.
#include "services/router/admin/broadcast.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/server_runner.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "rl/v1/admin.grpc.pb.h"
#include "services/router/router_server.h"
#include "tests/testing/fake_worker.h"
#include "tests/testing/router_fleet.h"

namespace rl::router {
namespace {

using testing::CountThreads;
using testing::FakeAdmin;
using testing::HoldingWorker;

// Waits (bounded) until the router lists `n` live workers.
bool WaitLive(rl::v1::Router::Stub* stub, int n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    grpc::ClientContext ctx;
    rl::v1::WorkerListResponse list;
    if (stub->ListWorkers(&ctx, rl::v1::ListWorkersRequest(), &list).ok()) {
      int live = 0;
      for (const auto& w : list.workers()) live += w.state() == rl::v1::WORKER_STATE_LIVE;
      if (live == n) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// One fake worker process: a hung data plane and an Admin service.
struct FakeNode {
  explicit FakeNode(bool hold_flush) : admin(hold_flush) {
    ServerOptions so;
    so.drain = std::chrono::milliseconds(100);
    auto s = GrpcServer::Start(so, {&worker, &admin});
    if (s.ok()) server = *std::move(s);
  }
  HoldingWorker worker;
  FakeAdmin admin;
  std::unique_ptr<GrpcServer> server;
};

TEST(BroadcastTest, BroadcastOverManyHungWorkersAddsNoThreadPerWorker) {
  constexpr int kWorkers = 48;
  std::vector<std::unique_ptr<FakeNode>> nodes;
  RouterConfig config;
  for (int i = 0; i < kWorkers; ++i) {
    nodes.push_back(std::make_unique<FakeNode>(/*hold_flush=*/true));
    ASSERT_NE(nodes.back()->server, nullptr);
    config.workers.push_back(nodes.back()->server->address());
  }
  config.admin_threads = 1;
  auto router = testing::StartTestRouter(config);
  ASSERT_TRUE(router.ok()) << router.status();
  auto channel = grpc::CreateChannel((*router)->address(), grpc::InsecureChannelCredentials());
  auto stub = rl::v1::Router::NewStub(channel);
  auto admin = rl::v1::Admin::NewStub(channel);
  ASSERT_TRUE(WaitLive(stub.get(), kWorkers));

  const int threads_before = CountThreads();
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  rl::v1::FlushCacheRequest req;
  rl::v1::AdminResponse resp;
  grpc::Status status;
  absl::Notification done;
  admin->async()->FlushCache(&ctx, &req, &resp, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  // Every worker holds its call: the broadcast is waiting on all of them at once.
  for (auto& n : nodes) ASSERT_TRUE(n->admin.flushes.WaitHeld(1));
  const int threads_during = CountThreads();
  EXPECT_FALSE(done.HasBeenNotified());
  // A thread per worker would add kWorkers; gRPC's own pools may grow a little.
  EXPECT_LT(threads_during - threads_before, kWorkers / 2)
      << threads_before << " threads before, " << threads_during << " with " << kWorkers
      << " worker calls held";

  for (auto& n : nodes) n->admin.flushes.Release();
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(60)));
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(resp.success()) << resp.message();
  ASSERT_EQ(resp.results_size(), kWorkers);
  for (const auto& r : resp.results()) {
    EXPECT_TRUE(r.success()) << r.worker() << ": " << r.message();
    EXPECT_FALSE(r.left_out());
  }
  (*router)->Shutdown();
  for (auto& n : nodes) n->server->Shutdown();
}

TEST(BroadcastTest, AbortStormAgainstHungWorkerDoesNotDelayBroadcasts) {
  constexpr int kAborts = 64;  // the router's cap on forwarded aborts in flight
  FakeNode node(/*hold_flush=*/false);
  ASSERT_NE(node.server, nullptr);
  RouterConfig config;
  config.workers.push_back(node.server->address());
  config.admin_threads = 1;  // a forward holding it would stall every broadcast
  auto router = testing::StartTestRouter(config);
  ASSERT_TRUE(router.ok()) << router.status();
  auto channel = grpc::CreateChannel((*router)->address(), grpc::InsecureChannelCredentials());
  auto stub = rl::v1::Router::NewStub(channel);
  auto admin = rl::v1::Admin::NewStub(channel);
  ASSERT_TRUE(WaitLive(stub.get(), 1));

  // A generation the worker holds, registered under its id.
  rl::v1::GenerateRequest gen;
  gen.set_request_id("held");
  for (int id : {300, 301, 302}) gen.mutable_input_ids()->add_ids(id);
  gen.mutable_sampling_params()->set_max_new_tokens(4);
  absl::Notification gen_done;
  auto* held = testing::AsyncGenerate<rl::v1::Router::Stub>::Start(
      stub.get(), gen, [&](const grpc::Status&, bool) { gen_done.Notify(); }, "", true,
      std::chrono::milliseconds(120000));
  const auto gen_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (node.worker.generates.load() < 1 && std::chrono::steady_clock::now() < gen_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(node.worker.generates.load(), 1);

  // The storm: every abort is forwarded to the worker, which holds it.
  struct Call {
    grpc::ClientContext ctx;
    rl::v1::AbortRequest req;
    rl::v1::AbortResponse resp;
    grpc::Status status;
  };
  std::vector<std::unique_ptr<Call>> aborts;
  std::atomic<int> aborts_done{0};
  for (int i = 0; i < kAborts; ++i) {
    aborts.push_back(std::make_unique<Call>());
    Call* c = aborts.back().get();
    c->req.set_request_id("held");
    c->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    stub->async()->Abort(&c->ctx, &c->req, &c->resp, [c, &aborts_done](grpc::Status s) {
      c->status = std::move(s);
      aborts_done.fetch_add(1);
    });
  }
  ASSERT_TRUE(node.worker.aborts.WaitHeld(kAborts)) << node.worker.aborts.calls();

  // Broadcasts still go through the single admin thread while all of them hang.
  auto broadcast = [&](const char* what, auto method, const auto& request) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    rl::v1::AdminResponse resp;
    grpc::Status s = (admin.get()->*method)(&ctx, request, &resp);
    EXPECT_TRUE(s.ok()) << what << ": " << s.error_message();
    EXPECT_TRUE(resp.success()) << what << ": " << resp.message();
    EXPECT_EQ(resp.results_size(), 1) << what;
  };
  broadcast("FlushCache", &rl::v1::Admin::Stub::FlushCache, rl::v1::FlushCacheRequest());
  rl::v1::PauseGenerationRequest pause;
  pause.set_mode(rl::v1::PAUSE_MODE_RETRACT);
  broadcast("PauseGeneration", &rl::v1::Admin::Stub::PauseGeneration, pause);
  broadcast("ContinueGeneration", &rl::v1::Admin::Stub::ContinueGeneration,
            rl::v1::ContinueGenerationRequest());
  EXPECT_EQ(aborts_done.load(), 0);  // the storm is still in flight

  node.worker.Release();
  const auto done_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (aborts_done.load() < kAborts && std::chrono::steady_clock::now() < done_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(aborts_done.load(), kAborts);
  for (const auto& c : aborts) {
    EXPECT_TRUE(c->status.ok()) << c->status.error_message();
    EXPECT_EQ(c->resp.num_aborted(), 1);
  }
  // The worker still holds the generation (aborts only mark it): it ends when cancelled.
  ASSERT_FALSE(gen_done.HasBeenNotified());
  held->Cancel();
  EXPECT_TRUE(gen_done.WaitForNotificationWithTimeout(absl::Seconds(60)));
  (*router)->Shutdown();
  node.server->Shutdown();
}

TEST(BroadcastTest, AnOperationHoldsTheLockAcrossBroadcastsAndRecordsThePauseState) {
  FakeNode node(/*hold_flush=*/false);
  ASSERT_NE(node.server, nullptr);
  PoolOptions po;
  po.health_interval = std::chrono::hours(1);
  WorkerPool pool(po);
  ASSERT_TRUE(pool.Add(node.server->address()).ok());
  admin::BroadcastOptions bo;
  bo.lock_timeout = std::chrono::milliseconds(50);
  admin::Broadcaster b(&pool, bo);
  const admin::WorkerCall flush = [](Worker& w, size_t, grpc::ClientContext* ctx,
                                     rl::v1::AdminResponse* r, admin::Done done) {
    admin::CallOwning(w, &admin::AsyncAdmin::FlushCache, rl::v1::FlushCacheRequest(), ctx, r,
                      std::move(done));
  };
  const admin::Plan plan{.what = "FlushCache"};
  rl::v1::AdminResponse resp;
  ASSERT_TRUE(b.lock().Acquire("refit").ok());
  const absl::Status busy = b.Broadcast(plan, nullptr, flush, &resp);
  EXPECT_TRUE(absl::IsUnavailable(busy)) << busy;
  EXPECT_NE(busy.message().find("admin lock"), std::string::npos) << busy;
  for (int i = 0; i < 2; ++i) {  // the holder's broadcasts run
    resp.Clear();
    ASSERT_TRUE(b.BroadcastLocked(plan, nullptr, flush, &resp).ok());
    EXPECT_TRUE(resp.success()) << resp.message();
    ASSERT_EQ(resp.results_size(), 1);
    EXPECT_EQ(resp.results(0).worker(), node.server->address());
  }
  // An unknown worker is refused at once, before any wait for the lock.
  const admin::Plan resync{.what = "resync", .only = {"127.0.0.1:1"}};
  EXPECT_TRUE(absl::IsNotFound(b.Broadcast(resync, nullptr, flush, &resp)));
  b.lock().Release();
  resp.Clear();
  EXPECT_TRUE(b.Broadcast(plan, nullptr, flush, &resp).ok());
  EXPECT_TRUE(resp.success()) << resp.message();

  EXPECT_FALSE(b.fleet_paused());
  const admin::WorkerCall pause = [](Worker& w, size_t, grpc::ClientContext* ctx,
                                     rl::v1::AdminResponse* r, admin::Done done) {
    admin::CallOwning(w, &admin::AsyncAdmin::PauseGeneration, rl::v1::PauseGenerationRequest(), ctx,
                      r, std::move(done));
  };
  resp.Clear();
  ASSERT_TRUE(b.Broadcast({.what = "PauseGeneration", .hold = true, .sets_paused = true}, nullptr,
                          pause, &resp)
                  .ok());
  EXPECT_TRUE(b.fleet_paused());
  EXPECT_TRUE(pool.Pick());  // the hold ended with the call
  node.server->Shutdown();
}

}  // namespace
}  // namespace rl::router
