// The fleet's record across a restart (services/router/state/fleet_record.h) and the pool's
// pause rule (worker_pool.h SetFleetPaused): a worker paused while the fleet is not is never
// picked, with the reason; the fleet's weights and pause state written through the pool's
// observer come back into a new pool over the same folder, where a worker behind the restored
// version is not routed.
#include "services/router/state/fleet_record.h"

#include <chrono>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/fake_pool_worker.h"
#include "tests/testing/test_data.h"

namespace rl::router {
namespace {

using testing::FakePoolWorker;

PoolOptions Manual() {
  PoolOptions o;
  o.health_interval = std::chrono::hours(1);
  o.health_timeout = std::chrono::milliseconds(1000);
  return o;
}

rl::v1::WorkerStatus StatusOf(const WorkerPool& pool, const std::string& address) {
  for (const auto& s : pool.List()) {
    if (s.address() == address) return s;
  }
  return {};
}

std::unique_ptr<CacheStore> OpenStore(const std::string& dir) {
  CacheStoreOptions o;
  o.dir = dir;
  auto s = CacheStore::Open(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

TEST(FleetPauseTest, AWorkerPausedBehindTheRoutersBackIsNotRouted) {
  WorkerPool pool(Manual());
  FakePoolWorker a, b;
  ASSERT_TRUE(pool.Add(a.address()).ok());
  ASSERT_TRUE(pool.Add(b.address()).ok());
  a.SetPaused(true);  // paused directly, not through the router
  pool.CheckAll();
  for (int i = 0; i < 6; ++i) {
    Lease l = pool.Pick();
    ASSERT_TRUE(l);
    EXPECT_EQ(l->address(), b.address());
  }
  EXPECT_NE(StatusOf(pool, a.address()).reason().find("paused while the fleet is not"),
            std::string::npos);
  // Both paused, the fleet not: nothing to route to (the request is refused, retryable).
  b.SetPaused(true);
  pool.CheckAll();
  EXPECT_FALSE(pool.Pick());
  // The router's own pause: requests may queue on the paused workers until the continue.
  pool.SetFleetPaused(true);
  EXPECT_TRUE(pool.Pick());
  EXPECT_EQ(StatusOf(pool, a.address()).reason(), "");
  // A continue reached every worker: routable at once, before the next health check.
  a.SetPaused(false);
  b.SetPaused(false);
  pool.SetFleetPaused(false);
  EXPECT_TRUE(pool.Pick());
}

TEST(FleetRecordTest, WeightsAndPauseSurviveARestartAndOldWorkersStayOut) {
  ::rl::testing::TempDir dir;
  FakePoolWorker current, old;
  current.SetVersion(5);
  old.SetVersion(0);
  {
    std::unique_ptr<CacheStore> store = OpenStore(dir.path());
    ASSERT_NE(store, nullptr);
    FleetRecord record(store.get());
    WorkerPool pool(Manual());
    ASSERT_TRUE(record.Restore(&pool).ok());
    EXPECT_EQ(pool.fleet_version(), -1);  // nothing recorded yet
    pool.AddObserver(&record);
    FleetWeights fleet;
    fleet.version = 5;
    fleet.source = FleetWeights::Source::kTensor;
    pool.SetFleetWeights(fleet);
    pool.SetFleetPaused(true);
    pool.RemoveObserver(&record);
  }
  // The restart: a new store and pool over the same folder, the record restored first.
  std::unique_ptr<CacheStore> store = OpenStore(dir.path());
  ASSERT_NE(store, nullptr);
  FleetRecord record(store.get());
  WorkerPool pool(Manual());
  ASSERT_TRUE(record.Restore(&pool).ok());
  EXPECT_EQ(pool.fleet_version(), 5);
  EXPECT_EQ(pool.fleet_weights().Describe(), "tensor");
  EXPECT_TRUE(pool.fleet_paused());
  ASSERT_TRUE(pool.Add(current.address()).ok());
  ASSERT_TRUE(pool.Add(old.address()).ok());
  for (int i = 0; i < 6; ++i) {
    Lease l = pool.Pick();
    ASSERT_TRUE(l);
    EXPECT_EQ(l->address(), current.address());
  }
  // Behind the restored in-memory version, which `current` still serves: it can be caught up from
  // that peer (SYNCING; the pool here has no catch-up handler), never routed meanwhile.
  rl::v1::WorkerStatus s = StatusOf(pool, old.address());
  EXPECT_EQ(s.state(), rl::v1::WORKER_STATE_SYNCING);
  EXPECT_NE(s.reason().find("behind the fleet's 5"), std::string::npos) << s.reason();
  EXPECT_NE(s.reason().find("from a live peer"), std::string::npos) << s.reason();
  // With no peer at version 5 left it is STALE, and only a resync brings it back.
  current.Stop();
  for (int i = 0; i < 3; ++i) pool.CheckAll();
  s = StatusOf(pool, old.address());
  EXPECT_EQ(s.state(), rl::v1::WORKER_STATE_STALE);
  EXPECT_NE(s.reason().find("rlctl workers resync"), std::string::npos) << s.reason();
}

TEST(FleetRecordTest, AnUnreadableRecordRefusesToStart) {
  ::rl::testing::TempDir dir;
  std::unique_ptr<CacheStore> store = OpenStore(dir.path());
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->PutMeta("fleet.weights", "five tensor").ok());
  FleetRecord record(store.get());
  WorkerPool pool(Manual());
  const absl::Status s = record.Restore(&pool);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("fleet.weights"), std::string::npos);
}

}  // namespace
}  // namespace rl::router
