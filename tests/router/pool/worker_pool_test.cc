// WorkerPool (services/router/pool/worker_pool.h) over in-process fake workers: the registry
// (address checks, sorted listing, idempotent add, remove), picking (round-robin over routable
// workers only; exclusions; the policy seam; a dropped connection), state transitions driven by
// failed calls, MarkDead and health checks (with the calls of a dead worker cancelled), the
// version rule, and the fleet weights: observers and the catch-up hand-off.
#include "services/router/pool/worker_pool.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "services/router/pool/policies/make_policy.h"
#include "tests/testing/fake_pool_worker.h"

namespace rl::router {
namespace {

using testing::FakePoolWorker;

PoolOptions Manual() {
  PoolOptions o;
  o.health_interval = std::chrono::hours(1);  // rounds run by the test
  o.health_timeout = std::chrono::milliseconds(1000);
  return o;
}

// `n` fake workers, started and sorted by address.
std::vector<std::unique_ptr<FakePoolWorker>> Fakes(int n) {
  std::vector<std::unique_ptr<FakePoolWorker>> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(std::make_unique<FakePoolWorker>());
    EXPECT_TRUE(out.back()->ok());
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a->address() < b->address(); });
  return out;
}

rl::v1::WorkerStatus StatusOf(const WorkerPool& pool, const std::string& address) {
  for (const auto& s : pool.List()) {
    if (s.address() == address) return s;
  }
  ADD_FAILURE() << "not listed: " << address;
  return {};
}

std::string PickAddress(WorkerPool& pool, const std::set<std::string>* exclude = nullptr) {
  PickRequest r;
  r.exclude = exclude;
  Lease lease = pool.Pick(r);
  return lease ? lease->address() : "";
}

TEST(WorkerPoolTest, RegistryChecksAddressesSortsAndForgets) {
  WorkerPool pool(Manual());
  for (const std::string bad : {"nope", ":50", "host:0", "host:70000", "host:x", ""}) {
    EXPECT_TRUE(absl::IsInvalidArgument(pool.Add(bad))) << bad;
  }
  auto fakes = Fakes(3);
  fakes[1]->SetVersion(4);
  for (int i : {2, 0, 1}) ASSERT_TRUE(pool.Add(fakes[i]->address()).ok());
  ASSERT_TRUE(pool.Add(fakes[0]->address()).ok());  // idempotent
  std::vector<rl::v1::WorkerStatus> list = pool.List();
  ASSERT_EQ(list.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(list[i].address(), fakes[i]->address());
    EXPECT_TRUE(list[i].enabled());
  }
  EXPECT_EQ(list[1].weight_version(), 4);  // each worker's GetLoad, checked on add
  // No update recorded: the fleet's version is the newest live one (4); the others differ and
  // are listed, never routed.
  EXPECT_EQ(list[1].state(), rl::v1::WORKER_STATE_LIVE) << list[1].reason();
  EXPECT_EQ(list[1].reason(), "");
  for (int i : {0, 2}) {
    EXPECT_EQ(list[i].state(), rl::v1::WORKER_STATE_VERSION_MISMATCH);
    EXPECT_TRUE(list[i].version_mismatch());
    EXPECT_NE(list[i].reason().find("differs from 4"), std::string::npos) << list[i].reason();
  }
  for (int i = 0; i < 6; ++i) EXPECT_EQ(PickAddress(pool), fakes[1]->address());
  EXPECT_TRUE(pool.VersionMismatch());
  EXPECT_EQ(pool.LiveWorkers().size(), 3u);

  EXPECT_TRUE(absl::IsNotFound(pool.Remove("127.0.0.1:1")));
  EXPECT_TRUE(absl::IsNotFound(pool.SetEnabled("127.0.0.1:1", false)));
  EXPECT_FALSE(pool.IsEnabled("127.0.0.1:1"));
  std::shared_ptr<Worker> gone = pool.Find(fakes[1]->address());
  ASSERT_NE(gone, nullptr);
  ASSERT_TRUE(pool.Remove(fakes[1]->address()).ok());
  EXPECT_EQ(pool.List().size(), 2u);
  EXPECT_EQ(pool.Find(fakes[1]->address()), nullptr);
  EXPECT_FALSE(pool.StateOf(fakes[1]->address()).has_value());
  EXPECT_FALSE(pool.VersionMismatch());
  // The handle outlives its removal; reports about it change nothing, but a hang still cancels
  // the calls it runs.
  grpc::ClientContext still_running;
  CallGuard guard(&gone->calls(), &still_running);
  pool.ReportFailure(gone.get());
  pool.Hold(gone.get());
  pool.ReportVersion(gone.get(), 9);
  EXPECT_EQ(pool.List().size(), 2u);
  EXPECT_FALSE(guard.cancelled_by_pool());
  pool.MarkDead(gone.get(), "hung after removal");
  EXPECT_TRUE(guard.cancelled_by_pool());
  EXPECT_EQ(pool.List().size(), 2u);

  // An address nobody answers on is added, and listed dead with the reason.
  FakePoolWorker stopped;
  stopped.Stop();
  ASSERT_TRUE(pool.Add(stopped.address()).ok());
  const rl::v1::WorkerStatus dead = StatusOf(pool, stopped.address());
  EXPECT_EQ(dead.state(), rl::v1::WORKER_STATE_DEAD);
  EXPECT_NE(dead.reason().find("health check"), std::string::npos) << dead.reason();
}

TEST(WorkerPoolTest, PicksRoundRobinAndCountsInFlightAndServed) {
  WorkerPool pool(Manual());
  auto fakes = Fakes(3);
  for (const auto& f : fakes) ASSERT_TRUE(pool.Add(f->address()).ok());
  std::vector<Lease> leases;
  for (int i = 0; i < 6; ++i) {
    leases.push_back(pool.Pick());
    ASSERT_TRUE(leases.back());
    EXPECT_EQ(leases.back()->address(), fakes[i % 3]->address()) << i;
  }
  for (const auto& s : pool.List()) {
    EXPECT_EQ(s.in_flight(), 2) << s.address();
    EXPECT_EQ(s.requests_served(), 2) << s.address();
  }
  leases.clear();
  for (const auto& s : pool.List()) EXPECT_EQ(s.in_flight(), 0) << s.address();
}

TEST(WorkerPoolTest, OnlyRoutableWorkersArePicked) {
  WorkerPool pool(Manual());
  auto fakes = Fakes(3);
  for (const auto& f : fakes) ASSERT_TRUE(pool.Add(f->address()).ok());
  const std::string a = fakes[0]->address(), b = fakes[1]->address(), c = fakes[2]->address();
  auto picks = [&](int n, const std::set<std::string>* exclude = nullptr) {
    std::set<std::string> seen;
    for (int i = 0; i < n; ++i) seen.insert(PickAddress(pool, exclude));
    return seen;
  };
  const std::set<std::string> exclude = {a};
  EXPECT_EQ(picks(6, &exclude), (std::set<std::string>{b, c}));

  ASSERT_TRUE(pool.SetEnabled(b, false).ok());
  EXPECT_EQ(StatusOf(pool, b).reason(), "disabled by an operator");
  EXPECT_EQ(picks(6), (std::set<std::string>{a, c}));
  ASSERT_TRUE(pool.SetEnabled(b, true).ok());

  pool.Hold(pool.Find(a).get());
  pool.Hold(pool.Find(a).get());
  EXPECT_NE(StatusOf(pool, a).reason().find("held out of routing"), std::string::npos);
  pool.Release(pool.Find(a).get());
  EXPECT_EQ(picks(6), (std::set<std::string>{b, c}));  // one hold left
  pool.Release(pool.Find(a).get());

  fakes[2]->SetServing(false);
  pool.Probe(pool.Find(c));
  EXPECT_EQ(StatusOf(pool, c).state(), rl::v1::WORKER_STATE_LIVE);
  EXPECT_NE(StatusOf(pool, c).reason().find("NOT_SERVING"), std::string::npos);
  EXPECT_EQ(picks(6), (std::set<std::string>{a, b}));
  fakes[2]->SetServing(true);
  pool.Probe(pool.Find(c));
  EXPECT_EQ(picks(6), (std::set<std::string>{a, b, c}));

  // Behind a fleet version that cannot be replayed: listed STALE, never routed.
  FleetWeights fleet;
  fleet.version = 5;
  fleet.source = FleetWeights::Source::kTensor;
  pool.SetFleetWeights(fleet);
  EXPECT_EQ(PickAddress(pool), "");
  EXPECT_EQ(StatusOf(pool, a).state(), rl::v1::WORKER_STATE_STALE);
  EXPECT_NE(StatusOf(pool, a).reason().find("rlctl workers resync"), std::string::npos);
  fakes[1]->SetVersion(5);
  pool.CheckAll();
  EXPECT_EQ(picks(4), (std::set<std::string>{b}));
  EXPECT_TRUE(pool.Behind(pool.Find(a).get()));
  EXPECT_FALSE(pool.Behind(pool.Find(b).get()));
}

TEST(WorkerPoolTest, FailedCallsMakeAWorkerSuspectThenDeadAndCancelItsCalls) {
  WorkerPool pool(Manual());
  auto fakes = Fakes(2);
  for (const auto& f : fakes) ASSERT_TRUE(pool.Add(f->address()).ok());
  std::shared_ptr<Worker> w = pool.Find(fakes[0]->address());
  grpc::ClientContext open_call;
  auto guard = std::make_unique<CallGuard>(&w->calls(), &open_call);
  EXPECT_EQ(w->calls().size(), 1u);
  // A failed call wakes the health thread at once; its check of `w` waits here until released,
  // so what follows sees the failed calls' transitions alone.
  fakes[0]->service().hold_get_loads = true;

  pool.ReportFailure(w.get());
  EXPECT_EQ(pool.StateOf(w->address())->liveness(), Liveness::kSuspect);
  EXPECT_NE(StatusOf(pool, w->address()).reason().find("a call failed"), std::string::npos);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(PickAddress(pool), fakes[1]->address());
  EXPECT_FALSE(guard->cancelled_by_pool());

  pool.ReportFailure(w.get());  // the second in a row: dead, its calls cancelled
  EXPECT_EQ(StatusOf(pool, w->address()).state(), rl::v1::WORKER_STATE_DEAD);
  EXPECT_TRUE(guard->cancelled_by_pool());
  EXPECT_EQ(guard->reason(), "marked dead after 2 failed calls");
  EXPECT_EQ(pool.LiveWorkers().size(), 1u);
  {
    grpc::ClientContext late;
    CallGuard g(&w->calls(), &late);  // registered after: cancelled at once
    EXPECT_TRUE(g.cancelled_by_pool());
  }
  guard.reset();

  // It answers: live again, calls run normally.
  fakes[0]->service().hold_get_loads = false;
  fakes[0]->service().held_get_loads.Release();
  pool.CheckAll();
  EXPECT_EQ(StatusOf(pool, w->address()).state(), rl::v1::WORKER_STATE_LIVE);
  grpc::ClientContext fresh;
  CallGuard g(&w->calls(), &fresh);
  EXPECT_FALSE(g.cancelled_by_pool());
  std::set<std::string> seen;
  for (int i = 0; i < 4; ++i) seen.insert(PickAddress(pool));
  EXPECT_EQ(seen.size(), 2u);
}

TEST(WorkerPoolTest, MarkDeadCancelsAtOnceAndAHealthCheckReadmits) {
  WorkerPool pool(Manual());
  FakePoolWorker fake;
  ASSERT_TRUE(pool.Add(fake.address()).ok());
  std::shared_ptr<Worker> w = pool.Find(fake.address());
  grpc::ClientContext ctx;
  CallGuard guard(&w->calls(), &ctx);
  pool.MarkDead(w.get(), "FlushCache missed its per-worker deadline");
  EXPECT_TRUE(guard.cancelled_by_pool());
  EXPECT_EQ(guard.reason(), "FlushCache missed its per-worker deadline");
  const rl::v1::WorkerStatus dead = StatusOf(pool, fake.address());
  EXPECT_EQ(dead.state(), rl::v1::WORKER_STATE_DEAD);
  EXPECT_EQ(dead.reason(), "FlushCache missed its per-worker deadline");
  EXPECT_EQ(dead.consecutive_failures(), 2);
  EXPECT_FALSE(pool.Pick());
  pool.CheckAll();
  EXPECT_EQ(StatusOf(pool, fake.address()).state(), rl::v1::WORKER_STATE_LIVE);
  EXPECT_TRUE(pool.Pick());
}

// With no fleet version recorded, a worker comes back only at the newest live version.
TEST(WorkerPoolTest, WithoutAFleetVersionOnlyTheNewestLiveVersionIsAdmitted) {
  WorkerPool pool(Manual());
  FakePoolWorker current, old;
  current.SetVersion(3);
  old.SetVersion(1);
  ASSERT_TRUE(pool.Add(current.address()).ok());
  ASSERT_TRUE(pool.Add(old.address()).ok());
  const rl::v1::WorkerStatus s = StatusOf(pool, old.address());
  EXPECT_EQ(s.state(), rl::v1::WORKER_STATE_DEAD);
  EXPECT_EQ(s.weight_version(), 1);
  EXPECT_TRUE(s.version_mismatch());
  EXPECT_FALSE(pool.VersionMismatch());  // among live workers
  old.SetVersion(3);
  pool.CheckAll();
  EXPECT_EQ(StatusOf(pool, old.address()).state(), rl::v1::WORKER_STATE_LIVE);
}

// The versions a request accepts filter the routable workers (issue 30); RoutableVersions names
// what there is whatever a request accepts.
TEST(WorkerPoolTest, PickHonoursTheVersionsARequestAccepts) {
  WorkerPool pool(Manual());
  auto fakes = Fakes(2);
  for (const auto& f : fakes) {
    f->SetVersion(4);
    ASSERT_TRUE(pool.Add(f->address()).ok());
  }
  PickRequest r;
  EXPECT_TRUE(pool.Pick(r));
  r.versions.min = 4;
  EXPECT_TRUE(pool.Pick(r));
  r.versions.min = 5;
  EXPECT_FALSE(pool.Pick(r));
  r.versions = {};
  r.versions.exact = 4;
  EXPECT_TRUE(pool.Pick(r));
  r.versions.exact = 3;
  EXPECT_FALSE(pool.Pick(r));
  EXPECT_EQ(pool.RoutableVersions(), std::vector<int64_t>{4});
  // The fleet moves on: the request waiting for version 5 now finds a worker.
  for (const auto& f : fakes) f->SetVersion(5);
  pool.CheckAll();
  r.versions = {};
  r.versions.min = 5;
  EXPECT_TRUE(pool.Pick(r));
  EXPECT_EQ(pool.RoutableVersions(), std::vector<int64_t>{5});
}

// A policy gets the routable workers only, sorted, with their loads and versions.
TEST(WorkerPoolTest, ThePolicyChoosesAmongRoutableCandidates) {
  class Last final : public RoutingPolicy {
   public:
    const char* name() const override { return "last"; }
    Choice Choose(const PickRequest& r, absl::Span<const Candidate> c) override {
      seen.clear();
      for (const Candidate& x : c) seen.push_back({*x.address, x.in_flight, x.weight_version});
      key = std::string(r.routing_key);
      return Choice{c.size() - 1};
    }
    struct Seen {
      std::string address;
      int32_t in_flight;
      int64_t version;
    };
    std::vector<Seen> seen;
    std::string key;
  };
  auto policy = std::make_unique<Last>();
  Last* last = policy.get();
  WorkerPool pool(Manual(), std::move(policy));
  auto fakes = Fakes(3);
  for (const auto& f : fakes) f->SetVersion(2);
  for (const auto& f : fakes) ASSERT_TRUE(pool.Add(f->address()).ok());
  ASSERT_TRUE(pool.SetEnabled(fakes[2]->address(), false).ok());
  Lease held = pool.Pick();
  ASSERT_TRUE(held);
  EXPECT_EQ(held->address(), fakes[1]->address());
  PickRequest r;
  r.routing_key = "episode-7";
  Lease next = pool.Pick(r);
  ASSERT_EQ(last->seen.size(), 2u);
  EXPECT_EQ(last->seen[0].address, fakes[0]->address());
  EXPECT_EQ(last->seen[1].address, fakes[1]->address());
  EXPECT_EQ(last->seen[1].in_flight, 1);  // `held`
  EXPECT_EQ(last->seen[0].in_flight, 0);
  EXPECT_EQ(last->seen[0].version, 2);
  EXPECT_EQ(last->key, "episode-7");
}

// A chosen worker whose connection dropped is not used: it is suspect until a health check
// has seen it again, and another worker takes the request.
TEST(WorkerPoolTest, ADroppedConnectionIsNotPicked) {
  WorkerPool pool(Manual());
  auto fakes = Fakes(2);
  for (const auto& f : fakes) ASSERT_TRUE(pool.Add(f->address()).ok());
  { Lease l = pool.Pick(); }  // the first worker's turn is over; the next pick would be the second
  std::shared_ptr<Worker> dropped = pool.Find(fakes[1]->address());
  fakes[1]->Stop();
  bool gone = false;
  for (int i = 0; i < 300 && !gone; ++i) {
    gone = dropped->channel()->GetState(false) != GRPC_CHANNEL_READY;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(gone);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(PickAddress(pool), fakes[0]->address());
  EXPECT_NE(pool.StateOf(dropped->address())->liveness(), Liveness::kLive);
}

// Records every change of the fleet's weights.
class Recorder final : public FleetObserver {
 public:
  void OnFleetWeights(const FleetWeights& before, const FleetWeights& after) override {
    absl::MutexLock lock(&mu_);
    changes.emplace_back(before.version, after.version);
  }
  std::vector<std::pair<int64_t, int64_t>> Changes() {
    absl::MutexLock lock(&mu_);
    return changes;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::pair<int64_t, int64_t>> changes ABSL_GUARDED_BY(mu_);
};

TEST(WorkerPoolTest, FleetWeightsReachObserversAndBehindWorkersAreHandedToCatchUp) {
  WorkerPool pool(Manual());
  FakePoolWorker fake;
  ASSERT_TRUE(pool.Add(fake.address()).ok());
  Recorder recorder;
  pool.AddObserver(&recorder);
  absl::Mutex mu;
  std::vector<std::shared_ptr<Worker>> handed;
  pool.SetCatchUpHandler([&](std::shared_ptr<Worker> w) {
    absl::MutexLock lock(&mu);
    handed.push_back(std::move(w));
  });
  auto num_handed = [&] {
    absl::MutexLock lock(&mu);
    return handed.size();
  };
  FleetWeights fleet;
  fleet.version = 2;
  fleet.source = FleetWeights::Source::kDisk;
  fleet.path = "/ckpt/step-2";
  pool.SetFleetWeights(fleet);
  EXPECT_EQ(recorder.Changes(), (std::vector<std::pair<int64_t, int64_t>>{{-1, 2}}));
  EXPECT_EQ(pool.fleet_version(), 2);
  EXPECT_EQ(pool.fleet_weights().Describe(), "disk:/ckpt/step-2");
  ASSERT_EQ(num_handed(), 1u);  // behind a replayable version
  EXPECT_TRUE(pool.StateOf(fake.address())->syncing());
  const rl::v1::WorkerStatus syncing = StatusOf(pool, fake.address());
  EXPECT_EQ(syncing.state(), rl::v1::WORKER_STATE_SYNCING);
  EXPECT_NE(syncing.reason().find("catching up from /ckpt/step-2"), std::string::npos);
  EXPECT_FALSE(pool.Pick());

  pool.CheckAll();
  EXPECT_EQ(num_handed(), 1u);  // syncing already
  pool.FinishSync(pool.Find(fake.address()).get());
  pool.CheckAll();
  EXPECT_EQ(num_handed(), 2u);  // still behind: handed over again
  fake.SetVersion(2);
  pool.FinishSync(pool.Find(fake.address()).get());
  pool.CheckAll();
  EXPECT_EQ(num_handed(), 2u);
  EXPECT_TRUE(pool.Pick());

  // A worker that comes back live is handed over once (its pause state).
  pool.MarkDead(pool.Find(fake.address()).get(), "test");
  pool.CheckAll();
  EXPECT_EQ(num_handed(), 3u);
  pool.FinishSync(pool.Find(fake.address()).get());
  pool.CheckAll();
  EXPECT_EQ(num_handed(), 3u);

  // Same version again (a resync's folder): observers hear of it, with the version unchanged.
  fleet.path = "/ckpt/again";
  pool.SetFleetWeights(fleet);
  pool.RemoveObserver(&recorder);
  // Without a handler a behind worker is not left marked syncing.
  pool.SetCatchUpHandler(nullptr);
  fleet.version = 3;
  pool.SetFleetWeights(fleet);
  EXPECT_EQ(recorder.Changes(), (std::vector<std::pair<int64_t, int64_t>>{{-1, 2}, {2, 2}}));
  EXPECT_EQ(num_handed(), 3u);
  EXPECT_FALSE(pool.StateOf(fake.address())->syncing());
  EXPECT_TRUE(pool.Behind(pool.Find(fake.address()).get()));
}

// A lease holds its request's samples as load; the pool counts picks, keyed picks, moves and
// the load spread after each pick (routing metrics, docs/routing.md "Policies").
TEST(WorkerPoolTest, LeasesCarryTheirSamplesAndPicksAreCounted) {
  auto policy = MakeRoutingPolicy({"affinity", 1.25, /*load_slack=*/0});  // the relative bound
  ASSERT_TRUE(policy.ok());
  WorkerPool pool(Manual(), *std::move(policy));
  EXPECT_STREQ(pool.policy_name(), "affinity");
  EXPECT_EQ(pool.policy_load_factor(), 1.25);
  auto fakes = Fakes(2);
  for (const auto& f : fakes) ASSERT_TRUE(pool.Add(f->address()).ok());
  PickRequest group;
  group.routing_key = "group-1";
  group.units = 8;
  Lease g = pool.Pick(group);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->in_flight(), 1);
  EXPECT_EQ(g->load(), 8);
  EXPECT_EQ(StatusOf(pool, g->address()).load(), 8);
  EXPECT_EQ(pool.LoadSpread(), 2.0);  // 8 and 0: max / mean
  Lease other = pool.Pick();          // no key: the least loaded
  ASSERT_TRUE(other);
  EXPECT_NE(other->address(), g->address());
  RoutingStats stats = pool.routing_stats();
  EXPECT_EQ(stats.picks, 2);
  EXPECT_EQ(stats.keyed_picks, 1);
  EXPECT_EQ(stats.key_moves, 0);
  EXPECT_DOUBLE_EQ(stats.mean_load_spread, (2.0 + 16.0 / 9.0) / 2);
  // The same key while its worker holds 8 of 9 samples: over 1.25 x mean, so it moves.
  Lease moved = pool.Pick(group);
  ASSERT_TRUE(moved);
  EXPECT_EQ(moved->address(), other->address());
  EXPECT_EQ(pool.routing_stats().key_moves, 1);
  Worker* w = g.get();
  g = Lease();
  EXPECT_EQ(w->in_flight(), 0);
  EXPECT_EQ(w->load(), 0);
}
// A worker restarted between two health checks (no check failed: the new process answered at
// the same address) is seen by its new instance_id: the calls open to the old process end, its
// state is the new process's (version), and it rejoins through the catch-up hand-off as a
// worker that came back after failed checks does.
TEST(WorkerPoolTest, ANewInstanceIdIsSeenAsARestart) {
  WorkerPool pool(Manual());
  FakePoolWorker fake;
  fake.SetVersion(3);
  fake.SetIdentity("instance-a", "");
  ASSERT_TRUE(pool.Add(fake.address()).ok());
  absl::Mutex mu;
  int handed = 0;
  pool.SetCatchUpHandler([&](std::shared_ptr<Worker> w) {
    absl::MutexLock lock(&mu);
    ++handed;
    pool.FinishSync(w.get());
  });
  auto num_handed = [&] {
    absl::MutexLock lock(&mu);
    return handed;
  };
  pool.CheckAll();  // the first check's rejoin (no handler then) is consumed
  const int before = num_handed();
  pool.CheckAll();
  EXPECT_EQ(num_handed(), before);  // the same process: nothing to do
  std::shared_ptr<Worker> w = pool.Find(fake.address());
  grpc::ClientContext old_call;
  CallGuard guard(&w->calls(), &old_call);
  EXPECT_EQ(pool.StateOf(fake.address())->instance_id(), "instance-a");

  // Restarted at its start-up weights (version 0) with a new instance id.
  fake.SetVersion(0);
  fake.SetIdentity("instance-b", "");
  pool.CheckAll();
  const WorkerState st = *pool.StateOf(fake.address());
  EXPECT_EQ(st.instance_id(), "instance-b");
  EXPECT_EQ(st.restarts(), 1);
  EXPECT_EQ(st.weight_version(), 0);
  EXPECT_TRUE(guard.cancelled_by_pool());  // the old process's call ended
  EXPECT_EQ(num_handed(), before + 1);     // rejoined: reconciled with the fleet
  // New calls are accepted again (the registry reopened).
  grpc::ClientContext new_call;
  CallGuard fresh(&w->calls(), &new_call);
  EXPECT_FALSE(fresh.cancelled_by_pool());
  pool.CheckAll();
  EXPECT_EQ(pool.StateOf(fake.address())->restarts(), 1);
  EXPECT_EQ(num_handed(), before + 1);
  // A worker that reports no instance id (an older build) is never seen as restarted.
  fake.SetIdentity("", "");
  pool.CheckAll();
  EXPECT_EQ(pool.StateOf(fake.address())->restarts(), 1);
}

// Two live workers at the same version with different weights content: the one whose digest
// differs from the fleet's is listed VERSION_MISMATCH with the reason, counted, never routed;
// a worker that reports no digest is not judged; a resync to the fleet's content readmits it.
TEST(WorkerPoolTest, AWorkerWithOtherContentAtTheSameVersionIsTakenOut) {
  WorkerPool pool(Manual());
  auto fakes = Fakes(3);
  for (auto& f : fakes) f->SetVersion(5);
  fakes[0]->SetIdentity("i0", "aaaa");
  fakes[1]->SetIdentity("i1", "aaaa");
  fakes[2]->SetIdentity("i2", "");
  for (auto& f : fakes) ASSERT_TRUE(pool.Add(f->address()).ok());
  FleetWeights fleet;
  fleet.version = 5;
  fleet.source = FleetWeights::Source::kTensor;
  pool.SetFleetWeights(fleet);
  EXPECT_EQ(pool.ReferenceDigest(), "aaaa");
  EXPECT_EQ(pool.DigestMismatches(), 0);

  // Worker 1 now serves other content under the same number (an update that reused it).
  fakes[1]->SetIdentity("i1", "bbbb");
  pool.CheckAll();
  EXPECT_EQ(pool.DigestMismatches(), 1);
  const rl::v1::WorkerStatus bad = StatusOf(pool, fakes[1]->address());
  EXPECT_EQ(bad.state(), rl::v1::WORKER_STATE_VERSION_MISMATCH);
  EXPECT_NE(bad.reason().find("weights_sha256 bbbb at weight_version 5 differs from the fleet's "
                              "aaaa"),
            std::string::npos)
      << bad.reason();
  EXPECT_EQ(StatusOf(pool, fakes[0]->address()).state(), rl::v1::WORKER_STATE_LIVE);
  EXPECT_EQ(StatusOf(pool, fakes[2]->address()).state(), rl::v1::WORKER_STATE_LIVE);
  for (int i = 0; i < 12; ++i) EXPECT_NE(PickAddress(pool), fakes[1]->address());
  EXPECT_EQ(pool.RoutableVersions(), (std::vector<int64_t>{5}));

  // Resynced to the fleet's content: routed again.
  fakes[1]->SetIdentity("i1", "aaaa");
  pool.CheckAll();
  EXPECT_EQ(pool.DigestMismatches(), 0);
  std::set<std::string> picked;
  for (int i = 0; i < 12; ++i) picked.insert(PickAddress(pool));
  EXPECT_TRUE(picked.contains(fakes[1]->address()));

  // A new fleet version: the digest is relearned at it.
  for (auto& f : fakes) f->SetVersion(6);
  fakes[0]->SetIdentity("i0", "cccc");
  fakes[1]->SetIdentity("i1", "cccc");
  fleet.version = 6;
  pool.SetFleetWeights(fleet);
  pool.CheckAll();
  EXPECT_EQ(pool.ReferenceDigest(), "cccc");
  EXPECT_EQ(pool.DigestMismatches(), 0);
}

// The fleet's digest is the majority's: a worker with other content that reported first (the
// others did not know their digest yet, or a router restart) is outvoted once the others report,
// and only it is taken out.
TEST(WorkerPoolTest, TheFleetsDigestIsTheMajoritysNotTheFirstReported) {
  WorkerPool pool(Manual());
  auto fakes = Fakes(3);
  for (auto& f : fakes) f->SetVersion(5);
  fakes[0]->SetIdentity("i0", "bbbb");
  fakes[1]->SetIdentity("i1", "");
  fakes[2]->SetIdentity("i2", "");
  for (auto& f : fakes) ASSERT_TRUE(pool.Add(f->address()).ok());
  FleetWeights fleet;
  fleet.version = 5;
  fleet.source = FleetWeights::Source::kTensor;
  pool.SetFleetWeights(fleet);
  EXPECT_EQ(pool.ReferenceDigest(), "bbbb");
  fakes[1]->SetIdentity("i1", "aaaa");
  fakes[2]->SetIdentity("i2", "aaaa");
  pool.CheckAll();
  EXPECT_EQ(pool.ReferenceDigest(), "aaaa");
  EXPECT_EQ(pool.DigestMismatches(), 1);
  EXPECT_EQ(StatusOf(pool, fakes[0]->address()).state(), rl::v1::WORKER_STATE_VERSION_MISMATCH);
  EXPECT_EQ(StatusOf(pool, fakes[1]->address()).state(), rl::v1::WORKER_STATE_LIVE);
  EXPECT_EQ(StatusOf(pool, fakes[2]->address()).state(), rl::v1::WORKER_STATE_LIVE);
}

}  // namespace
}  // namespace rl::router
