// The fleet's record across a restart (services/router/state/fleet_record.h) and the pool's
// pause rule (worker_pool.h SetFleetPaused): a worker paused while the fleet is not is never
// picked, with the reason; the fleet's weights and pause state written through the pool's
// observer come back into a new pool over the same folder, where a worker behind the restored
// version is not routed, one ahead of it only once an operator adopted its version, and the
// workers added or removed at run time are the registry to start with.
#include "services/router/state/fleet_record.h"

#include <chrono>
#include <string>
#include <vector>

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

// A disk update's chain (the folders before it, replayed to a worker behind a delta) comes back
// with the record; a chain that does not fit the restored version is dropped, not trusted.
TEST(FleetRecordTest, TheDiskChainSurvivesARestart) {
  ::rl::testing::TempDir dir;
  FleetWeights fleet;
  fleet.version = 3;
  fleet.source = FleetWeights::Source::kDisk;
  fleet.path = "/pub/v3 delta";
  fleet.chain = {{1, "/pub/v1 full"}, {2, "/pub/v2"}};
  {
    std::unique_ptr<CacheStore> store = OpenStore(dir.path());
    ASSERT_NE(store, nullptr);
    FleetRecord record(store.get());
    WorkerPool pool(Manual());
    ASSERT_TRUE(record.Restore(&pool).ok());
    pool.AddObserver(&record);
    pool.SetFleetWeights(fleet);
    pool.RemoveObserver(&record);
  }
  {
    std::unique_ptr<CacheStore> store = OpenStore(dir.path());
    ASSERT_NE(store, nullptr);
    FleetRecord record(store.get());
    WorkerPool pool(Manual());
    ASSERT_TRUE(record.Restore(&pool).ok());
    const FleetWeights restored = pool.fleet_weights();
    EXPECT_EQ(restored.version, 3);
    EXPECT_EQ(restored.path, "/pub/v3 delta");
    EXPECT_EQ(restored.chain, fleet.chain);
    // A chain from a crash between the two writes (not below the version): dropped.
    ASSERT_TRUE(store->PutMeta("fleet.weights.chain", "1 /pub/v1\n3 /pub/v3").ok());
  }
  std::unique_ptr<CacheStore> store = OpenStore(dir.path());
  ASSERT_NE(store, nullptr);
  FleetRecord record(store.get());
  WorkerPool pool(Manual());
  ASSERT_TRUE(record.Restore(&pool).ok());
  EXPECT_EQ(pool.fleet_version(), 3);
  EXPECT_TRUE(pool.fleet_weights().chain.empty());
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

TEST(FleetRecordTest, WorkersAddedAndRemovedAtRunTimeSurviveARestart) {
  ::rl::testing::TempDir dir;
  {
    std::unique_ptr<CacheStore> store = OpenStore(dir.path());
    ASSERT_NE(store, nullptr);
    FleetRecord record(store.get());
    WorkerPool pool(Manual());
    ASSERT_TRUE(record.Restore(&pool).ok());
    EXPECT_EQ(record.StartWorkers({"a:1", "b:2"}), (std::vector<std::string>{"a:1", "b:2"}));
    ASSERT_TRUE(record.RecordAdded("c:3").ok());
    ASSERT_TRUE(record.RecordRemoved("b:2").ok());  // a --worker flag
    ASSERT_TRUE(record.RecordAdded("d:4").ok());
    ASSERT_TRUE(record.RecordRemoved("d:4").ok());  // added, then removed: gone
    ASSERT_TRUE(record.RecordRemoved("e:5").ok());
    ASSERT_TRUE(record.RecordAdded("e:5").ok());  // removed, then added back: kept
  }
  std::unique_ptr<CacheStore> store = OpenStore(dir.path());
  ASSERT_NE(store, nullptr);
  FleetRecord record(store.get());
  WorkerPool pool(Manual());
  ASSERT_TRUE(record.Restore(&pool).ok());
  EXPECT_EQ(record.StartWorkers({"a:1", "b:2", "e:5"}),
            (std::vector<std::string>{"a:1", "e:5", "c:3"}));
}

// A worker ahead of the recorded version (the router died in the middle of an update) is never
// routed, with the reason, until the operator adopts its version; the adopted version is the
// fleet's (persisted), and the workers now behind it are caught up from the named folder or,
// without one, listed STALE.
TEST(FleetRecordTest, AWorkerAheadIsKeptOutUntilItsVersionIsAdopted) {
  ::rl::testing::TempDir dir;
  FakePoolWorker current, ahead;
  current.SetVersion(5);
  ahead.SetVersion(6);
  {
    std::unique_ptr<CacheStore> store = OpenStore(dir.path());
    ASSERT_NE(store, nullptr);
    FleetRecord record(store.get());
    WorkerPool pool(Manual());
    ASSERT_TRUE(record.Restore(&pool).ok());
    pool.AddObserver(&record);
    FleetWeights fleet;
    fleet.version = 5;
    fleet.source = FleetWeights::Source::kDisk;
    fleet.path = "/ckpt/step-5";
    pool.SetFleetWeights(fleet);
    pool.RemoveObserver(&record);
  }
  std::unique_ptr<CacheStore> store = OpenStore(dir.path());
  ASSERT_NE(store, nullptr);
  {
    FleetRecord record(store.get());
    WorkerPool pool(Manual());
    ASSERT_TRUE(record.Restore(&pool).ok());
    pool.AddObserver(&record);
    ASSERT_TRUE(pool.Add(current.address()).ok());
    ASSERT_TRUE(pool.Add(ahead.address()).ok());
    for (int i = 0; i < 6; ++i) {
      Lease l = pool.Pick();
      ASSERT_TRUE(l);
      EXPECT_EQ(l->address(), current.address());
    }
    rl::v1::WorkerStatus s = StatusOf(pool, ahead.address());
    EXPECT_EQ(s.state(), rl::v1::WORKER_STATE_VERSION_MISMATCH);
    EXPECT_NE(s.reason().find("ahead of the fleet's 5"), std::string::npos) << s.reason();
    EXPECT_NE(s.reason().find("rlctl workers adopt"), std::string::npos) << s.reason();
    // Only a live worker ahead of the fleet can be adopted.
    EXPECT_EQ(pool.AdoptWorkerVersion(current.address(), "").status().code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(pool.AdoptWorkerVersion("nowhere:1", "").status().code(),
              absl::StatusCode::kNotFound);
    pool.BeginHold();  // an admin broadcast moves versions: not now
    EXPECT_EQ(pool.AdoptWorkerVersion(ahead.address(), "").status().code(),
              absl::StatusCode::kFailedPrecondition);
    pool.EndHold();
    absl::StatusOr<FleetWeights> adopted = pool.AdoptWorkerVersion(ahead.address(), "");
    ASSERT_TRUE(adopted.ok()) << adopted.status();
    EXPECT_EQ(adopted->version, 6);
    EXPECT_EQ(pool.fleet_weights().Describe(), "adopted:" + ahead.address());
    for (int i = 0; i < 6; ++i) {
      Lease l = pool.Pick();
      ASSERT_TRUE(l);
      EXPECT_EQ(l->address(), ahead.address());
    }
    // No folder named: the worker now behind is caught up from a live peer at the adopted
    // version (the adopted worker), not from disk.
    s = StatusOf(pool, current.address());
    EXPECT_EQ(s.state(), rl::v1::WORKER_STATE_SYNCING);
    EXPECT_NE(s.reason().find("adopted without its folder"), std::string::npos) << s.reason();
    EXPECT_NE(s.reason().find("catching up from a live peer"), std::string::npos) << s.reason();
    pool.RemoveObserver(&record);
  }
  // The adoption is the fleet's record after the next restart.
  FleetRecord record(store.get());
  WorkerPool pool(Manual());
  ASSERT_TRUE(record.Restore(&pool).ok());
  EXPECT_EQ(pool.fleet_version(), 6);
  EXPECT_EQ(pool.fleet_weights().source, FleetWeights::Source::kAdopted);
}

}  // namespace
}  // namespace rl::router
