// The SGLang side's readiness on rl-router (sglang_readiness.h): what the SMG gateway asks on
// --sglang-port (grpc.health.v1 and SGLang's HealthCheck) follows the routable workers and the
// drain, while liveness stays SERVING; and the watch that publishes it.
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "grpcpp/create_channel.h"
#include "gtest/gtest.h"
#include "services/router/router_server.h"
#include "services/router/sglang/sglang_readiness.h"
#include "sglang_scheduler.grpc.pb.h"
#include "tests/testing/grpc_health.h"
#include "tests/testing/router_fleet.h"

namespace rl::router {
namespace {

using rl::testing::HealthStatus;

// Polls `pred` every 20 ms for up to 30 s (a bound against a hang, not a timing assertion).
bool WaitFor(const std::function<bool()>& pred) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

sgl::HealthCheckResponse SglangHealth(const std::string& address) {
  auto stub = sgl::SglangScheduler::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  sgl::HealthCheckResponse resp;
  const grpc::Status s = stub->HealthCheck(&ctx, sgl::HealthCheckRequest(), &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp;
}

TEST(RouterSglangReadinessTest, FollowsRoutableWorkersAndTheDrainWhileLivenessStays) {
  RouterConfig config;
  config.sglang_port = 0;
  config.drain_grace_s = 5;
  auto router = testing::StartTestRouter(config);
  ASSERT_TRUE(router.ok()) << router.status();
  RouterServer& r = **router;
  const std::string sglang = r.sglang_address();
  const std::string main = r.address();
  ASSERT_FALSE(sglang.empty());
  const auto ready_on = [](const std::string& address, const std::string& service) {
    return HealthStatus(address, service);
  };

  // No worker: the gateway is told not to send; the router itself is live, and its main-port
  // readiness (admin calls, trainers) does not follow the workers.
  EXPECT_EQ(ready_on(sglang, ""), "SERVING");
  EXPECT_EQ(ready_on(sglang, kSglangReadinessService), "NOT_SERVING");
  EXPECT_EQ(ready_on(sglang, RouterServer::kReadinessService), "NOT_SERVING");
  EXPECT_EQ(ready_on(main, kSglangReadinessService), "NOT_SERVING");
  EXPECT_EQ(ready_on(main, RouterServer::kReadinessService), "SERVING");
  sgl::HealthCheckResponse h = SglangHealth(sglang);
  EXPECT_FALSE(h.healthy());
  EXPECT_NE(h.message().find("no routable worker"), std::string::npos) << h.message();

  // A routable worker: ready on both names of the SGLang listener.
  auto worker = testing::StartTestWorker();
  ASSERT_TRUE(worker.ok()) << worker.status();
  const std::string w = (*worker)->address();
  ASSERT_TRUE(r.pool().Add(w).ok());
  EXPECT_TRUE(WaitFor([&] {
    return ready_on(sglang, kSglangReadinessService) == "SERVING" &&
           ready_on(sglang, RouterServer::kReadinessService) == "SERVING" &&
           ready_on(main, kSglangReadinessService) == "SERVING";
  }));
  h = SglangHealth(sglang);
  EXPECT_TRUE(h.healthy()) << h.message();

  // Out of routing (an operator disables it): not ready, and HealthCheck says why.
  ASSERT_TRUE(r.pool().SetEnabled(w, false).ok());
  EXPECT_TRUE(WaitFor([&] { return ready_on(sglang, kSglangReadinessService) == "NOT_SERVING"; }));
  h = SglangHealth(sglang);
  EXPECT_FALSE(h.healthy());
  EXPECT_NE(h.message().find("disabled"), std::string::npos) << h.message();
  ASSERT_TRUE(r.pool().SetEnabled(w, true).ok());
  EXPECT_TRUE(WaitFor([&] { return ready_on(sglang, kSglangReadinessService) == "SERVING"; }));

  // The drain turns it off at once (no interval later), liveness stays.
  r.Drain();
  EXPECT_EQ(ready_on(sglang, kSglangReadinessService), "NOT_SERVING");
  EXPECT_EQ(ready_on(sglang, RouterServer::kReadinessService), "NOT_SERVING");
  EXPECT_EQ(ready_on(main, RouterServer::kReadinessService), "NOT_SERVING");
  EXPECT_EQ(ready_on(sglang, ""), "SERVING");
  EXPECT_EQ(ready_on(main, ""), "SERVING");
  h = SglangHealth(sglang);
  EXPECT_FALSE(h.healthy());
  EXPECT_NE(h.message().find("draining"), std::string::npos) << h.message();
  r.Shutdown();
  (*worker)->Shutdown();
}

// The watch publishes the first value at once, then only changes, Refresh without waiting for
// the interval, and nothing once destroyed.
TEST(ReadinessWatchTest, PublishesChangesOnlyAndStopsWhenDestroyed) {
  absl::Mutex mu;
  bool ready = false;
  std::vector<bool> published;
  auto get = [&] {
    absl::MutexLock lock(&mu);
    return ready;
  };
  auto publish = [&](bool v) {
    absl::MutexLock lock(&mu);
    published.push_back(v);
  };
  const auto seen = [&] {
    absl::MutexLock lock(&mu);
    return published;
  };
  {
    // An hour's interval: only Refresh publishes after the first value.
    ReadinessWatch watch(get, publish, std::chrono::hours(1));
    EXPECT_EQ(seen(), std::vector<bool>{false});
    watch.Refresh();
    EXPECT_EQ(seen(), std::vector<bool>{false});
    {
      absl::MutexLock lock(&mu);
      ready = true;
    }
    watch.Refresh();
    EXPECT_EQ(seen(), (std::vector<bool>{false, true}));
  }
  {
    // A short interval: the thread follows changes by itself.
    ReadinessWatch watch(get, publish, std::chrono::milliseconds(10));
    EXPECT_EQ(seen(), (std::vector<bool>{false, true, true}));
    {
      absl::MutexLock lock(&mu);
      ready = false;
    }
    EXPECT_TRUE(WaitFor([&] { return seen().size() == 4; }));
    EXPECT_EQ(seen().back(), false);
  }
  // Destroyed: a change is published by nobody.
  {
    absl::MutexLock lock(&mu);
    ready = true;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(seen().size(), 4u);
}

}  // namespace
}  // namespace rl::router
