// Engine-side controls for asynchronous RL (issue 34), on the fake runner whose steps the test
// releases one at a time, so what runs when is fixed by the test, not by timing:
// - drain pause: what was admitted before it finishes, what arrives meanwhile is held (bounded
//   by the queue limit, abortable) and runs after Continue; Drain returns drained, or after its
//   timeout with what is still active;
// - staleness bound: a long request crossed by two updates ends with kStale and its partial
//   output once the version moved more than its max_version_lag past its dispatch version;
// - aborts return what was generated, running or queued;
// - in-flight update (keep_kv): running requests keep their KV across a version change, are
//   never retracted, and their results say the prefix KV came from an older version.
#include <future>

#include "gtest/gtest.h"
#include "services/worker/engine/engine.h"
#include "tests/worker/engine/engine_test_util.h"

namespace rl::engine::testing {
namespace {

constexpr int32_t kLong = 48;

// Moves the engine to `version` the way an update does: retract (unless keep_kv), flush or
// keep the KV, bump. The engine must be paused (the test holds it there).
absl::Status BumpVersion(Engine& engine, int64_t version, bool keep_kv) {
  return engine.RunOnEngineThread([&](EngineContext& ctx) -> absl::Status {
    if (keep_kv) {
      ctx.set_weight_version(version);
      ctx.KeepKvThroughUpdate();
      return absl::OkStatus();
    }
    ctx.Pause(PauseMode::kRetract);
    absl::Status s = ctx.FlushCache();
    ctx.set_weight_version(version);
    return s;
  });
}

TEST(EngineDrainTest, RunningFinishArrivalsAreHeldAndRunAfterContinue) {
  FakeEngine fe = MakeFakeEngine();
  Collector collector;
  fe.runner->SetStepBudget(3);
  for (const char* id : {"a", "b"}) {
    ASSERT_TRUE(fe.engine->Submit(Greedy(id, Prompt(6, id[0]), kLong), collector.Callbacks()).ok());
  }
  fe.runner->WaitForSteps(3);  // both running, a few tokens in
  ASSERT_TRUE(PauseGated(*fe.engine, *fe.runner, PauseMode::kDrain).ok());
  // Arrivals during the drain: held, not admitted, not counted as waiting.
  for (const char* id : {"c", "d"}) {
    ASSERT_TRUE(fe.engine->Submit(Greedy(id, Prompt(7, id[0]), 8), collector.Callbacks()).ok());
  }
  fe.runner->SetStepBudget(-1);
  absl::StatusOr<DrainResult> r = fe.engine->Drain(kHangGuard);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->drained);
  EXPECT_EQ(r->num_still_active, 0);
  EXPECT_EQ(r->num_held, 2);
  EXPECT_TRUE(r->still_active_ids.empty());
  ASSERT_TRUE(collector.WaitFor(2));
  EXPECT_EQ(collector.result("a").finish_reason.kind, FinishKind::kLength);
  EXPECT_EQ(collector.result("b").output_ids.size(), static_cast<size_t>(kLong));
  EXPECT_EQ(collector.num_finished(), 2u);  // c and d wait for the continue
  const ServerInfo held = fe.engine->GetServerInfo();
  EXPECT_TRUE(held.paused);
  EXPECT_EQ(held.scheduler.num_held, 2);
  EXPECT_EQ(held.scheduler.num_waiting, 0);
  // An update (or a flush) does not wait for held requests: they hold no KV.
  ASSERT_TRUE(fe.engine->FlushCache().ok());
  ASSERT_TRUE(fe.engine->Continue().ok());
  ASSERT_TRUE(collector.WaitFor(4));
  for (const char* id : {"c", "d"}) {
    EXPECT_EQ(collector.result(id).finish_reason.kind, FinishKind::kLength) << id;
    EXPECT_EQ(collector.result(id).output_ids.size(), 8u) << id;
  }
  EXPECT_EQ(fe.engine->GetServerInfo().scheduler.num_held, 0);
  ExpectNoLeak(*fe.engine);
}

TEST(EngineDrainTest, TimeoutReturnsWhatIsStillActive) {
  FakeEngine fe = MakeFakeEngine();
  Collector collector;
  fe.runner->SetStepBudget(2);
  ASSERT_TRUE(fe.engine->Submit(Greedy("slow", Prompt(6, 1), 400), collector.Callbacks()).ok());
  fe.runner->WaitForSteps(2);  // running
  // One step per 2 ms while the call waits: at most ~25 of the 400 steps in its 50 ms.
  auto drain =
      std::async(std::launch::async, [&] { return fe.engine->Drain(absl::Milliseconds(50)); });
  while (drain.wait_for(std::chrono::milliseconds(2)) != std::future_status::ready) {
    fe.runner->AllowSteps(1);
  }
  absl::StatusOr<DrainResult> r = drain.get();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->drained);
  EXPECT_EQ(r->num_still_active, 1);
  EXPECT_EQ(r->still_active_ids, std::vector<std::string>{"slow"});
  EXPECT_TRUE(fe.engine->GetServerInfo().paused);
  // The drain goes on after the call returned; continue ends it.
  fe.runner->SetStepBudget(-1);
  ASSERT_TRUE(fe.engine->Continue().ok());
  ASSERT_TRUE(collector.WaitFor(1));
  EXPECT_EQ(collector.result("slow").output_ids.size(), 400u);
}

// Held requests are bounded by the engine's queue limit (RESOURCE_EXHAUSTED, retryable) and
// end like any other on an abort (their deadline passing is a cancel, i.e. an abort): never a
// request that hangs.
TEST(EngineDrainTest, HeldRequestsAreBoundedAndAbortable) {
  EngineOptions eo;
  eo.max_queued_requests = 2;
  FakeEngine fe = MakeFakeEngine({}, eo);
  Collector collector;
  ASSERT_TRUE(fe.engine->Pause(PauseMode::kDrain).ok());
  ASSERT_TRUE(fe.engine->Submit(Greedy("h1", Prompt(6, 2), 4), collector.Callbacks()).ok());
  ASSERT_TRUE(fe.engine->Submit(Greedy("h2", Prompt(6, 3), 4), collector.Callbacks()).ok());
  absl::Status full = fe.engine->Submit(Greedy("h3", Prompt(6, 4), 4), collector.Callbacks());
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  absl::StatusOr<int32_t> aborted = fe.engine->Abort("h1", "client deadline");
  ASSERT_TRUE(aborted.ok());
  EXPECT_EQ(*aborted, 1);
  ASSERT_TRUE(collector.WaitFor(1));
  const GenerateResult h1 = collector.result("h1");
  EXPECT_EQ(h1.finish_reason.kind, FinishKind::kAbort);
  EXPECT_EQ(h1.finish_reason.message, "client deadline");
  EXPECT_TRUE(h1.output_ids.empty());
  // The aborted one freed its place.
  ASSERT_TRUE(fe.engine->Submit(Greedy("h3", Prompt(6, 4), 4), collector.Callbacks()).ok());
  ASSERT_TRUE(CheckInvariants(*fe.engine).ok());  // an engine-thread call: the inbox ran first
  EXPECT_EQ(fe.engine->GetServerInfo().scheduler.num_held, 2);
  // A stronger pause keeps them held; an abort pause ends them.
  ASSERT_TRUE(fe.engine->Pause(PauseMode::kAbort).ok());
  ASSERT_TRUE(collector.WaitFor(3));
  EXPECT_EQ(collector.result("h2").finish_reason.kind, FinishKind::kAbort);
  EXPECT_EQ(collector.result("h3").finish_reason.kind, FinishKind::kAbort);
  ASSERT_TRUE(fe.engine->Continue().ok());
  ExpectNoLeak(*fe.engine);
}

// A drain asked while a stronger pause holds the engine would never drain: it answers at once.
TEST(EngineDrainTest, DrainUnderAStrongerPauseReturnsAtOnce) {
  FakeEngine fe = MakeFakeEngine();
  Collector collector;
  fe.runner->SetStepBudget(1);
  ASSERT_TRUE(fe.engine->Submit(Greedy("x", Prompt(6, 1), kLong), collector.Callbacks()).ok());
  fe.runner->WaitForSteps(1);
  ASSERT_TRUE(PauseGated(*fe.engine, *fe.runner, PauseMode::kInPlace).ok());
  absl::StatusOr<DrainResult> r = fe.engine->Drain(kHangGuard);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->drained);
  EXPECT_EQ(r->num_still_active, 1);
  EXPECT_EQ(fe.engine->GetServerInfo().pause_mode, PauseMode::kInPlace);
  fe.runner->SetStepBudget(-1);
  ASSERT_TRUE(fe.engine->Continue().ok());
  ASSERT_TRUE(collector.WaitFor(1));
}

// Issue 34's test: a long request crossed by two updates. With max_version_lag 1 it survives
// the first update and ends with kStale at the second, carrying its partial output (tokens,
// logprobs, per-token versions); with lag 2, and without a bound, it runs to its end.
TEST(EngineStalenessTest, ALongRequestCrossedByTwoUpdatesEndsStale) {
  FakeEngine fe = MakeFakeEngine();
  Collector collector;
  const int64_t v0 = fe.engine->weight_version();
  fe.runner->SetStepBudget(4);
  GenerateRequest lag1 = Greedy("lag1", Prompt(6, 1), kLong);
  lag1.max_version_lag = 1;
  lag1.return_logprob = true;
  GenerateRequest lag2 = Greedy("lag2", Prompt(6, 2), kLong);
  lag2.max_version_lag = 2;
  GenerateRequest none = Greedy("none", Prompt(6, 3), kLong);
  for (const GenerateRequest* r : {&lag1, &lag2, &none}) {
    ASSERT_TRUE(fe.engine->Submit(*r, collector.Callbacks()).ok());
  }
  fe.runner->WaitForSteps(4);
  ASSERT_TRUE(PauseGated(*fe.engine, *fe.runner, PauseMode::kInPlace).ok());
  ASSERT_TRUE(BumpVersion(*fe.engine, v0 + 1, /*keep_kv=*/false).ok());
  fe.runner->SetStepBudget(4);
  ASSERT_TRUE(fe.engine->Continue().ok());
  fe.runner->WaitForSteps(8);
  ASSERT_TRUE(PauseGated(*fe.engine, *fe.runner, PauseMode::kInPlace).ok());
  EXPECT_EQ(collector.num_finished(), 0u);  // one version past dispatch: within every bound
  const size_t streamed = collector.streamed("lag1").size();
  ASSERT_GT(streamed, 0u);
  ASSERT_TRUE(BumpVersion(*fe.engine, v0 + 2, /*keep_kv=*/false).ok());
  fe.runner->SetStepBudget(-1);
  ASSERT_TRUE(fe.engine->Continue().ok());
  ASSERT_TRUE(collector.WaitFor(3));
  const GenerateResult stale = collector.result("lag1");
  EXPECT_EQ(stale.finish_reason.kind, FinishKind::kStale);
  EXPECT_NE(stale.finish_reason.message.find("max_version_lag 1"), std::string::npos)
      << stale.finish_reason.message;
  EXPECT_EQ(stale.output_ids, collector.streamed("lag1"));
  EXPECT_EQ(stale.output_ids.size(), streamed);  // no token on the version past the bound
  EXPECT_EQ(stale.output_logprobs.size(), stale.output_ids.size());
  int32_t total = 0;
  for (const VersionSegment& seg : stale.weight_version_segments) {
    EXPECT_LE(seg.weight_version, v0 + 1);
    total += seg.num_tokens;
  }
  EXPECT_EQ(total, static_cast<int32_t>(streamed));
  EXPECT_EQ(stale.dispatch_weight_version, v0);
  for (const char* id : {"lag2", "none"}) {
    const GenerateResult r = collector.result(id);
    EXPECT_EQ(r.finish_reason.kind, FinishKind::kLength) << id;
    EXPECT_EQ(r.weight_version, v0 + 2) << id;
  }
  EXPECT_EQ(fe.engine->GetServerInfo().scheduler.num_stale, 1);
  ExpectNoLeak(*fe.engine);
}

// The engine's default bound applies to requests that set none; -1 opts out of it; a lag below
// -1 is refused at submission.
TEST(EngineStalenessTest, DefaultBoundAndOptOut) {
  EngineOptions eo;
  eo.scheduler.default_max_version_lag = 0;
  FakeEngine fe = MakeFakeEngine({}, eo);
  Collector collector;
  fe.runner->SetStepBudget(2);
  GenerateRequest unbounded = Greedy("unbounded", Prompt(6, 2), 16);
  unbounded.max_version_lag = -1;
  ASSERT_TRUE(fe.engine->Submit(Greedy("dflt", Prompt(6, 1), 16), collector.Callbacks()).ok());
  ASSERT_TRUE(fe.engine->Submit(unbounded, collector.Callbacks()).ok());
  fe.runner->WaitForSteps(2);
  ASSERT_TRUE(PauseGated(*fe.engine, *fe.runner, PauseMode::kInPlace).ok());
  ASSERT_TRUE(BumpVersion(*fe.engine, fe.engine->weight_version() + 1, /*keep_kv=*/false).ok());
  fe.runner->SetStepBudget(-1);
  ASSERT_TRUE(fe.engine->Continue().ok());
  ASSERT_TRUE(collector.WaitFor(2));
  EXPECT_EQ(collector.result("dflt").finish_reason.kind, FinishKind::kStale);
  EXPECT_EQ(collector.result("unbounded").finish_reason.kind, FinishKind::kLength);
  GenerateRequest bad = Greedy("bad", Prompt(6, 3), 4);
  bad.max_version_lag = -2;
  absl::Status s = fe.engine->Submit(bad, collector.Callbacks());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("max_version_lag"), std::string::npos) << s;
}

// Aborts return what was generated: a running request its tokens and logprobs so far, a queued
// one (never admitted) an empty output with the abort's reason; both exactly once.
TEST(EngineAbortTest, RunningAndQueuedAbortsReturnTheirOutput) {
  SchedulerOptions so;
  so.max_running_requests = 1;  // the second request stays queued
  EngineOptions eo;
  eo.scheduler = so;
  FakeEngine fe = MakeFakeEngine({}, eo);
  Collector collector;
  fe.runner->SetStepBudget(5);
  GenerateRequest running = Greedy("running", Prompt(6, 1), kLong);
  running.return_logprob = true;
  ASSERT_TRUE(fe.engine->Submit(running, collector.Callbacks()).ok());
  ASSERT_TRUE(fe.engine->Submit(Greedy("queued", Prompt(6, 2), kLong), collector.Callbacks()).ok());
  fe.runner->WaitForSteps(5);
  ASSERT_TRUE(PauseGated(*fe.engine, *fe.runner, PauseMode::kInPlace).ok());
  ASSERT_EQ(fe.engine->GetServerInfo().scheduler.num_waiting, 1);
  ASSERT_TRUE(fe.engine->Abort("running", "trainer has enough").ok());
  ASSERT_TRUE(fe.engine->Abort("queued", "trainer has enough").ok());
  ASSERT_TRUE(collector.WaitFor(2));
  const GenerateResult r = collector.result("running");
  EXPECT_EQ(r.finish_reason.kind, FinishKind::kAbort);
  EXPECT_FALSE(r.output_ids.empty());
  EXPECT_EQ(r.output_ids, collector.streamed("running"));
  EXPECT_EQ(r.output_logprobs.size(), r.output_ids.size());
  const GenerateResult q = collector.result("queued");
  EXPECT_EQ(q.finish_reason.kind, FinishKind::kAbort);
  EXPECT_EQ(q.finish_reason.message, "trainer has enough");
  EXPECT_TRUE(q.output_ids.empty());
  EXPECT_EQ(q.prompt_tokens, 6);
  EXPECT_EQ(collector.finish_calls("running"), 1);
  EXPECT_EQ(collector.finish_calls("queued"), 1);
  fe.runner->SetStepBudget(-1);
  ASSERT_TRUE(fe.engine->Continue().ok());
  ExpectNoLeak(*fe.engine);
}

// In-flight update: a version change with keep_kv while requests run in place. Nothing is
// retracted or recomputed; every request runs to its end; its segments split exactly at the
// update; its result says the prefix KV came from the older version; and since the fake
// runner's logits are a function of the KV history, the outputs equal an uninterrupted run's.
TEST(EngineKeepKvTest, RunningRequestsKeepTheirKvAcrossTheUpdate) {
  constexpr int kNum = 3;
  auto id = [](int i) { return absl::StrCat("k", i); };
  FakeRunnerOptions fo;
  fo.page_size = 4;
  std::map<std::string, std::vector<int32_t>> reference;
  {
    FakeEngine fe = MakeFakeEngine(fo);
    Collector c;
    for (int i = 0; i < kNum; ++i) {
      ASSERT_TRUE(
          fe.engine->Submit(Greedy(id(i), Prompt(7 + i, 50 + i), kLong), c.Callbacks()).ok());
    }
    ASSERT_TRUE(c.WaitFor(kNum));
    for (int i = 0; i < kNum; ++i) reference[id(i)] = c.result(id(i)).output_ids;
  }
  FakeEngine fe = MakeFakeEngine(fo);
  Collector collector;
  const int64_t v0 = fe.engine->weight_version();
  fe.runner->SetStepBudget(6);
  for (int i = 0; i < kNum; ++i) {
    ASSERT_TRUE(
        fe.engine->Submit(Greedy(id(i), Prompt(7 + i, 50 + i), kLong), collector.Callbacks()).ok());
  }
  fe.runner->WaitForSteps(6);
  ASSERT_TRUE(PauseGated(*fe.engine, *fe.runner, PauseMode::kInPlace).ok());
  std::vector<size_t> before(kNum);
  for (int i = 0; i < kNum; ++i) before[i] = collector.streamed(id(i)).size();
  const int64_t cached_before = fe.engine->GetServerInfo().scheduler.tree_cache_tokens;
  int32_t kept = -1;
  ASSERT_TRUE(fe.engine
                  ->RunOnEngineThread([&](EngineContext& ctx) {
                    ctx.set_weight_version(v0 + 1);
                    kept = ctx.KeepKvThroughUpdate();
                    return ctx.CheckInvariants();
                  })
                  .ok());
  EXPECT_EQ(kept, kNum);
  // Only prefixes the running requests pin may stay; nothing unlocked survives.
  const ServerInfo mid = fe.engine->GetServerInfo();
  EXPECT_EQ(mid.scheduler.evictable_kv_tokens, 0);
  EXPECT_LE(mid.scheduler.tree_cache_tokens, cached_before);
  EXPECT_EQ(mid.scheduler.num_running, kNum);
  fe.runner->SetStepBudget(-1);
  ASSERT_TRUE(fe.engine->Continue().ok());
  ASSERT_TRUE(collector.WaitFor(kNum));
  for (int i = 0; i < kNum; ++i) {
    const GenerateResult r = collector.result(id(i));
    EXPECT_EQ(r.finish_reason.kind, FinishKind::kLength);
    EXPECT_EQ(r.num_retractions, 0) << id(i);
    EXPECT_TRUE(r.kv_from_older_version) << id(i);
    EXPECT_EQ(r.oldest_kv_weight_version, v0);
    EXPECT_EQ(r.output_ids, reference[id(i)]) << id(i);
    ASSERT_EQ(r.weight_version_segments.size(), 2u) << id(i);
    EXPECT_EQ(r.weight_version_segments[0], (VersionSegment{v0, static_cast<int32_t>(before[i])}));
    EXPECT_EQ(r.weight_version_segments[1],
              (VersionSegment{v0 + 1, kLong - static_cast<int32_t>(before[i])}));
  }
  // A request admitted after the update computes its KV with the new weights only.
  ASSERT_TRUE(fe.engine->Submit(Greedy("after", Prompt(7, 50), 4), collector.Callbacks()).ok());
  ASSERT_TRUE(collector.WaitFor(kNum + 1));
  EXPECT_FALSE(collector.result("after").kv_from_older_version);
  EXPECT_EQ(collector.result("after").cached_tokens, 0);  // the old prefix is never reused
  ExpectNoLeak(*fe.engine);
}

}  // namespace
}  // namespace rl::engine::testing
