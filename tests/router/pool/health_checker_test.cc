// HealthChecker (services/router/pool/health_checker.h) against in-process fake workers: what a
// check reports (reachable, serving, version; NOT_SERVING; a key-guarded GetLoad; a closed port;
// a black hole), the round thread (rounds every interval, Wake for one now), and a round over
// many hung workers costing one timeout, not one per worker (through the pool).
#include "services/router/pool/health_checker.h"

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "services/router/pool/worker_pool.h"
#include "tests/testing/black_hole.h"
#include "tests/testing/fake_pool_worker.h"

namespace rl::router {
namespace {

using rl::testing::BlackHole;
using testing::FakePoolWorker;

// Collects the reports a checker sends, per address.
class Reports {
 public:
  HealthChecker::Sink sink() {
    return [this](const std::shared_ptr<Worker>& w, const HealthReport& r) {
      absl::MutexLock lock(&mu_);
      last_[w->address()] = r;
      ++count_[w->address()];
    };
  }
  HealthReport last(const std::string& address) {
    absl::MutexLock lock(&mu_);
    return last_[address];
  }
  int count(const std::string& address) {
    absl::MutexLock lock(&mu_);
    return count_[address];
  }
  // Waits (bounded: 30 s) until `address` has at least `n` reports.
  bool WaitCount(const std::string& address, int n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return count_[address] >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(30));
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, HealthReport> last_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> count_ ABSL_GUARDED_BY(mu_);
};

HealthCheckOptions Manual(std::chrono::milliseconds timeout = std::chrono::milliseconds(2000)) {
  HealthCheckOptions o;
  o.interval = std::chrono::hours(1);  // rounds run by the test
  o.timeout = timeout;
  return o;
}

TEST(HealthCheckerTest, ReportsServingAndVersion) {
  FakePoolWorker fake;
  ASSERT_TRUE(fake.ok());
  fake.SetVersion(7);
  auto w = std::make_shared<Worker>(fake.address());
  Reports reports;
  HealthChecker checker(
      Manual(), [w] { return std::vector<std::shared_ptr<Worker>>{w}; }, reports.sink());
  checker.Probe(w);
  HealthReport r = reports.last(fake.address());
  EXPECT_TRUE(r.reachable) << r.error;
  EXPECT_TRUE(r.serving);
  ASSERT_TRUE(r.weight_version.has_value());
  EXPECT_EQ(*r.weight_version, 7);
  EXPECT_EQ(fake.service().get_loads.load(), 1);

  // NOT_SERVING (asleep, updating) is reachable, not serving.
  fake.SetServing(false);
  fake.SetVersion(8);
  checker.Probe(w);
  r = reports.last(fake.address());
  EXPECT_TRUE(r.reachable) << r.error;
  EXPECT_FALSE(r.serving);
  EXPECT_EQ(r.weight_version.value_or(-1), 8);
}

// A worker with a readiness service (rl.v1.Worker, as rl-worker has): its status decides serving,
// whatever the overall status (liveness) says. A refit or sleep leaves the overall SERVING.
TEST(HealthCheckerTest, ReadinessServiceDecidesServing) {
  FakePoolWorker fake;
  ASSERT_TRUE(fake.ok());
  fake.SetReady(false);  // overall stays SERVING: a worker under a refit
  auto w = std::make_shared<Worker>(fake.address());
  Reports reports;
  HealthChecker checker(
      Manual(), [w] { return std::vector<std::shared_ptr<Worker>>{w}; }, reports.sink());
  checker.Probe(w);
  HealthReport r = reports.last(fake.address());
  EXPECT_TRUE(r.reachable) << r.error;
  EXPECT_FALSE(r.serving);
  fake.SetReady(true);
  checker.Probe(w);
  r = reports.last(fake.address());
  EXPECT_TRUE(r.reachable) << r.error;
  EXPECT_TRUE(r.serving);
  // Readiness wins over the overall status both ways.
  fake.SetServing(false);
  checker.Probe(w);
  EXPECT_TRUE(reports.last(fake.address()).serving);
}

// A worker whose data plane needs a key answers GetLoad UNAUTHENTICATED: reachable all the
// same, its version unknown (the pool keeps the last one).
TEST(HealthCheckerTest, KeyGuardedGetLoadIsReachableWithoutAVersion) {
  FakePoolWorker fake;
  ASSERT_TRUE(fake.ok());
  fake.service().require_key = true;
  auto w = std::make_shared<Worker>(fake.address());
  Reports reports;
  HealthChecker checker(
      Manual(), [w] { return std::vector<std::shared_ptr<Worker>>{w}; }, reports.sink());
  checker.Probe(w);
  const HealthReport r = reports.last(fake.address());
  EXPECT_TRUE(r.reachable) << r.error;
  EXPECT_TRUE(r.serving);
  EXPECT_FALSE(r.weight_version.has_value());
}

TEST(HealthCheckerTest, ClosedPortAndBlackHoleAreUnreachable) {
  FakePoolWorker stopped;
  ASSERT_TRUE(stopped.ok());
  stopped.Stop();
  BlackHole hole;
  ASSERT_TRUE(hole.ok());
  auto closed = std::make_shared<Worker>(stopped.address());
  auto hung = std::make_shared<Worker>(hole.address());
  Reports reports;
  HealthChecker checker(
      Manual(std::chrono::milliseconds(300)),
      [=] {
        return std::vector<std::shared_ptr<Worker>>{closed, hung};
      },
      reports.sink());
  checker.CheckAll();
  for (const std::string& address : {stopped.address(), hole.address()}) {
    const HealthReport r = reports.last(address);
    EXPECT_FALSE(r.reachable) << address;
    EXPECT_FALSE(r.error.empty()) << address;
    EXPECT_FALSE(r.weight_version.has_value()) << address;
    EXPECT_EQ(reports.count(address), 1) << address;
  }
}

// The thread runs a round every interval; Wake starts one at once.
TEST(HealthCheckerTest, RoundsRunEveryIntervalAndOnWake) {
  FakePoolWorker fake;
  ASSERT_TRUE(fake.ok());
  auto w = std::make_shared<Worker>(fake.address());
  {
    Reports reports;
    HealthCheckOptions o;
    o.interval = std::chrono::milliseconds(20);
    HealthChecker checker(
        o, [w] { return std::vector<std::shared_ptr<Worker>>{w}; }, reports.sink());
    EXPECT_TRUE(reports.WaitCount(fake.address(), 3));
  }
  Reports reports;
  HealthChecker checker(
      Manual(), [w] { return std::vector<std::shared_ptr<Worker>>{w}; }, reports.sink());
  EXPECT_EQ(reports.count(fake.address()), 0);  // an hour to the first round
  checker.Wake();
  EXPECT_TRUE(reports.WaitCount(fake.address(), 1));
}

// One health round costs one health timeout whatever the pool size: sequential checks of N
// black holes would take at least N timeouts.
TEST(HealthCheckerTest, ChecksRunConcurrently) {
  constexpr int kHoles = 10;
  PoolOptions options;
  options.health_interval = std::chrono::milliseconds(600000);  // rounds run by the test
  options.health_timeout = std::chrono::milliseconds(300);
  options.failure_threshold = 1;
  WorkerPool pool(options);
  FakePoolWorker live;
  ASSERT_TRUE(live.ok());
  ASSERT_TRUE(pool.Add(live.address()).ok());
  std::vector<std::unique_ptr<BlackHole>> holes;
  for (int i = 0; i < kHoles; ++i) {
    holes.push_back(std::make_unique<BlackHole>());
    ASSERT_TRUE(holes.back()->ok());
    ASSERT_TRUE(pool.Add(holes.back()->address()).ok());
  }
  const auto start = std::chrono::steady_clock::now();
  pool.CheckAll();
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_LT(elapsed, kHoles * options.health_timeout);
  int live_count = 0;
  for (const auto& w : pool.List()) {
    if (w.address() == live.address()) {
      EXPECT_EQ(w.state(), rl::v1::WORKER_STATE_LIVE);
      ++live_count;
    } else {
      EXPECT_EQ(w.state(), rl::v1::WORKER_STATE_DEAD);
      EXPECT_NE(w.reason().find("health check"), std::string::npos) << w.reason();
    }
  }
  EXPECT_EQ(live_count, 1);
}

}  // namespace
}  // namespace rl::router
