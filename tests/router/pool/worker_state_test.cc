// WorkerState (services/router/pool/worker_state.h): every transition of the worker state
// machine, without a process: liveness (dead → live ⇄ suspect → dead), the readmission rule by
// weight version, routability (enabled, holds, serving, behind the fleet), the partial-weights
// disable, and the catch-up marks.
#include "services/router/pool/worker_state.h"

#include "gtest/gtest.h"

namespace rl::router {
namespace {

using Change = WorkerState::Change;

constexpr int64_t kNoFleet = -1;
constexpr int64_t kNoneLive = -1;

HealthReport Pass(int64_t version, bool serving = true) {
  HealthReport r;
  r.reachable = true;
  r.serving = serving;
  r.weight_version = version;
  return r;
}

HealthReport Fail(const std::string& error) {
  HealthReport r;
  r.error = error;
  return r;
}

WorkerState Live(int64_t version = 0) {
  WorkerState s;
  EXPECT_EQ(s.OnHealthCheck(Pass(version), HealthThresholds{}, kNoFleet, kNoneLive),
            Change::kRevived);
  return s;
}

TEST(WorkerStateTest, StartsDeadAndUncheckedThenAPassMakesItLive) {
  WorkerState s;
  EXPECT_EQ(s.liveness(), Liveness::kDead);
  EXPECT_EQ(s.last_error(), "not checked yet");
  EXPECT_FALSE(s.Routable(kNoFleet));
  EXPECT_EQ(s.weight_version(), -1);
  EXPECT_EQ(s.OnHealthCheck(Pass(3), HealthThresholds{}, kNoFleet, kNoneLive), Change::kRevived);
  EXPECT_EQ(s.liveness(), Liveness::kLive);
  EXPECT_EQ(s.last_error(), "");
  EXPECT_EQ(s.weight_version(), 3);
  EXPECT_TRUE(s.rejoin_pending());
  EXPECT_TRUE(s.Routable(kNoFleet));
  // Another pass changes nothing.
  EXPECT_EQ(s.OnHealthCheck(Pass(3), HealthThresholds{}, kNoFleet, 3), Change::kNone);
}

TEST(WorkerStateTest, SuccessThresholdNeedsPassesInARow) {
  HealthThresholds t;
  t.success_threshold = 2;
  WorkerState s;
  EXPECT_EQ(s.OnHealthCheck(Pass(0), t, kNoFleet, kNoneLive), Change::kNone);
  EXPECT_FALSE(s.live());
  EXPECT_EQ(s.OnHealthCheck(Fail("refused"), t, kNoFleet, kNoneLive), Change::kNone);
  EXPECT_EQ(s.OnHealthCheck(Pass(0), t, kNoFleet, kNoneLive), Change::kNone);  // restarted count
  EXPECT_EQ(s.OnHealthCheck(Pass(0), t, kNoFleet, kNoneLive), Change::kRevived);
}

TEST(WorkerStateTest, FailedChecksKillAtTheThresholdOnly) {
  WorkerState s = Live();
  const HealthThresholds t;  // 2 failures
  EXPECT_EQ(s.OnHealthCheck(Fail("deadline"), t, kNoFleet, 0), Change::kNone);
  EXPECT_EQ(s.liveness(), Liveness::kLive);  // one failed check alone does not stop routing
  EXPECT_TRUE(s.Routable(kNoFleet));
  EXPECT_EQ(s.OnHealthCheck(Fail("deadline"), t, kNoFleet, 0), Change::kDied);
  EXPECT_EQ(s.liveness(), Liveness::kDead);
  EXPECT_EQ(s.last_error(), "health check: deadline");
  EXPECT_EQ(s.failures(), 2);
  // Dead already: more failures are no new death.
  EXPECT_EQ(s.OnHealthCheck(Fail("deadline"), t, kNoFleet, kNoneLive), Change::kNone);
}

TEST(WorkerStateTest, AFailedCallMakesItSuspectUntilACheckPasses) {
  WorkerState s = Live();
  const HealthThresholds t;
  EXPECT_EQ(s.OnCallFailed(t), Change::kNone);
  EXPECT_EQ(s.liveness(), Liveness::kSuspect);
  EXPECT_TRUE(s.live());
  EXPECT_FALSE(s.Routable(kNoFleet));
  EXPECT_EQ(s.OnHealthCheck(Pass(0), t, kNoFleet, 0), Change::kNone);
  EXPECT_EQ(s.liveness(), Liveness::kLive);
  EXPECT_EQ(s.failures(), 0);
  EXPECT_TRUE(s.Routable(kNoFleet));
  // `failure_threshold` failed calls in a row: dead.
  EXPECT_EQ(s.OnCallFailed(t), Change::kNone);
  EXPECT_EQ(s.OnCallFailed(t), Change::kDied);
  EXPECT_EQ(s.liveness(), Liveness::kDead);
  EXPECT_EQ(s.last_error(), "marked dead after 2 failed calls");
}

TEST(WorkerStateTest, ALostConnectionMakesItSuspect) {
  WorkerState s = Live();
  s.OnConnectionLost();
  EXPECT_EQ(s.liveness(), Liveness::kSuspect);
  EXPECT_FALSE(s.Routable(kNoFleet));
  WorkerState dead;
  dead.OnConnectionLost();
  EXPECT_EQ(dead.liveness(), Liveness::kDead);  // nothing to suspect
}

TEST(WorkerStateTest, MarkDeadKillsAtOnceAndAPassBringsItBack) {
  HealthThresholds t;
  t.failure_threshold = 3;
  WorkerState s = Live();
  EXPECT_EQ(s.MarkDead("missed its deadline", t), Change::kDied);
  EXPECT_EQ(s.liveness(), Liveness::kDead);
  EXPECT_EQ(s.last_error(), "missed its deadline");
  EXPECT_EQ(s.failures(), 3);
  // Dead already: the caller still cancels (a call may have registered since).
  EXPECT_EQ(s.MarkDead("again", t), Change::kDied);
  EXPECT_EQ(s.OnHealthCheck(Pass(0), t, kNoFleet, kNoneLive), Change::kRevived);
  EXPECT_EQ(s.failures(), 0);
}

// Without a fleet version a dead worker comes back only at the newest live version; with one,
// at any version (then behind: caught up or stale, never routed).
TEST(WorkerStateTest, ReadmissionFollowsTheVersionRule) {
  const HealthThresholds t;
  WorkerState old;
  EXPECT_EQ(old.OnHealthCheck(Pass(2), t, kNoFleet, /*newest_live=*/5), Change::kNone);
  EXPECT_FALSE(old.live());
  EXPECT_EQ(old.weight_version(), 2);  // recorded all the same
  EXPECT_EQ(old.OnHealthCheck(Pass(5), t, kNoFleet, 5), Change::kRevived);

  WorkerState behind;
  EXPECT_EQ(behind.OnHealthCheck(Pass(2), t, /*fleet_version=*/5, 5), Change::kRevived);
  EXPECT_TRUE(behind.live());
  EXPECT_TRUE(behind.Behind(5));
  EXPECT_FALSE(behind.Routable(5));
  behind.ReportVersion(5);
  EXPECT_TRUE(behind.Routable(5));
}

TEST(WorkerStateTest, NotServingAndUnknownVersions) {
  WorkerState s = Live(4);
  EXPECT_EQ(s.OnHealthCheck(Pass(4, /*serving=*/false), HealthThresholds{}, kNoFleet, 4),
            Change::kNone);
  EXPECT_TRUE(s.live());
  EXPECT_FALSE(s.serving());
  EXPECT_FALSE(s.Routable(kNoFleet));
  HealthReport unknown = Pass(0);
  unknown.weight_version.reset();  // GetLoad refused for want of a key
  EXPECT_EQ(s.OnHealthCheck(unknown, HealthThresholds{}, kNoFleet, 4), Change::kNone);
  EXPECT_EQ(s.weight_version(), 4);
  EXPECT_TRUE(s.Routable(kNoFleet));
}

TEST(WorkerStateTest, HoldsNest) {
  WorkerState s = Live();
  s.Hold();
  s.Hold();
  EXPECT_EQ(s.holds(), 2);
  s.Release();
  EXPECT_FALSE(s.Routable(kNoFleet));
  s.Release();
  EXPECT_TRUE(s.Routable(kNoFleet));
  s.Release();  // below zero is ignored
  EXPECT_EQ(s.holds(), 0);
  EXPECT_TRUE(s.Routable(kNoFleet));
}

TEST(WorkerStateTest, OperatorDisableAndPartialWeights) {
  WorkerState s = Live();
  s.DisablePartial("ReceiveWeights failed: stalled");
  EXPECT_FALSE(s.enabled());
  EXPECT_EQ(s.disabled_reason(), "ReceiveWeights failed: stalled");
  EXPECT_FALSE(s.Routable(kNoFleet));
  s.ClearPartial();  // a resync
  EXPECT_TRUE(s.enabled());
  EXPECT_EQ(s.disabled_reason(), "");
  s.SetEnabled(false);  // the operator's
  s.ClearPartial();     // does not undo it
  EXPECT_FALSE(s.enabled());
  s.DisablePartial("x");
  s.SetEnabled(true);  // enabling clears a partial disable too
  EXPECT_TRUE(s.enabled());
  EXPECT_EQ(s.disabled_reason(), "");
  EXPECT_TRUE(s.Routable(kNoFleet));
}

TEST(WorkerStateTest, CatchUpMarks) {
  WorkerState s = Live();  // just rejoined: handed over once
  EXPECT_TRUE(s.TakeForCatchUp(/*behind_replayable=*/false));
  EXPECT_TRUE(s.syncing());
  EXPECT_FALSE(s.rejoin_pending());
  EXPECT_FALSE(s.TakeForCatchUp(true));  // syncing already
  s.FinishSync();
  EXPECT_FALSE(s.TakeForCatchUp(false));  // nothing due
  EXPECT_TRUE(s.TakeForCatchUp(true));    // behind a replayable version
  s.FinishSync();
  // A worker that dies while syncing and comes back is due again once that sync is done.
  ASSERT_TRUE(s.TakeForCatchUp(true));
  EXPECT_EQ(s.MarkDead("hung", HealthThresholds{}), Change::kDied);
  EXPECT_FALSE(s.TakeForCatchUp(true));  // dead
  EXPECT_EQ(s.OnHealthCheck(Pass(0), HealthThresholds{}, kNoFleet, kNoneLive), Change::kRevived);
  EXPECT_FALSE(s.TakeForCatchUp(false));  // the old sync still runs
  s.FinishSync();
  EXPECT_TRUE(s.TakeForCatchUp(false));  // the rejoin
}

// A live worker answering with another instance_id restarted: kRestarted (once), its state the
// new process's, the digest forgotten, a rejoin pending; a dead one coming back with a new id
// is a revival (the same handling); an empty id is never a restart.
TEST(WorkerStateTest, ANewInstanceIdIsARestart) {
  HealthReport r = Pass(4);
  r.instance_id = "a";
  r.weights_sha256 = "d4";
  WorkerState s;
  EXPECT_EQ(s.OnHealthCheck(r, HealthThresholds{}, kNoFleet, kNoneLive), Change::kRevived);
  EXPECT_TRUE(s.TakeForCatchUp(false));
  s.FinishSync();
  EXPECT_EQ(s.weights_sha256(), "d4");
  EXPECT_EQ(s.OnHealthCheck(r, HealthThresholds{}, kNoFleet, 4), Change::kNone);
  r = Pass(0);
  r.instance_id = "b";
  EXPECT_EQ(s.OnHealthCheck(r, HealthThresholds{}, kNoFleet, 4), Change::kRestarted);
  EXPECT_EQ(s.instance_id(), "b");
  EXPECT_EQ(s.restarts(), 1);
  EXPECT_EQ(s.weight_version(), 0);
  EXPECT_EQ(s.weights_sha256(), "");
  EXPECT_TRUE(s.live());
  EXPECT_TRUE(s.TakeForCatchUp(false));  // the rejoin
  s.FinishSync();
  EXPECT_EQ(s.OnHealthCheck(r, HealthThresholds{}, kNoFleet, 4), Change::kNone);
  r.instance_id = "";
  EXPECT_EQ(s.OnHealthCheck(r, HealthThresholds{}, kNoFleet, 4), Change::kNone);
  EXPECT_EQ(s.instance_id(), "b");
  // Dead, then back as another process: a revival, counted as a restart.
  EXPECT_EQ(s.MarkDead("test", HealthThresholds{}), Change::kDied);
  r.instance_id = "c";
  EXPECT_EQ(s.OnHealthCheck(r, HealthThresholds{}, 0, kNoneLive), Change::kRevived);
  EXPECT_EQ(s.restarts(), 2);
  // A version reported by a response forgets the old version's digest.
  r.weights_sha256 = "d0";
  s.OnHealthCheck(r, HealthThresholds{}, 0, 0);
  s.ReportVersion(0);
  EXPECT_EQ(s.weights_sha256(), "d0");
  s.ReportVersion(1);
  EXPECT_EQ(s.weights_sha256(), "");
}

}  // namespace
}  // namespace rl::router
