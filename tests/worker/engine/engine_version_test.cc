// Per-token weight versions: a request that crosses a weight update (retract -> update ->
// continue) reports the version at dispatch and run-length version segments that split
// exactly where the update happened; weight_version is the version of the last token.
#include "gtest/gtest.h"
#include "services/worker/engine/engine.h"
#include "tests/worker/engine/engine_test_util.h"

namespace rl::engine::testing {
namespace {

constexpr int kNumRequests = 3;
constexpr int32_t kMaxNew = 40;

std::string Id(int i) { return absl::StrCat("v", i); }

TEST(EngineVersionTest, SegmentsSplitExactlyAtTheUpdate) {
  FakeRunnerOptions fo;
  fo.page_size = 4;
  FakeEngine fe = MakeFakeEngine(fo);
  Collector collector;
  const int64_t v0 = fe.engine->weight_version();
  fe.runner->SetStepBudget(6);
  ASSERT_TRUE(fe.engine->Pause(PauseMode::kInPlace).ok());
  for (int i = 0; i < kNumRequests; ++i) {
    ASSERT_TRUE(
        fe.engine->Submit(Greedy(Id(i), Prompt(8 + i, 100 + i), kMaxNew), collector.Callbacks())
            .ok());
  }
  ASSERT_TRUE(fe.engine->Continue().ok());
  fe.runner->WaitForSteps(6);
  ASSERT_TRUE(PauseGated(*fe.engine, *fe.runner, PauseMode::kRetract).ok());
  // Tokens produced before the update: everything streamed so far (callbacks run on the engine
  // thread, which is now paused).
  std::vector<size_t> before(kNumRequests);
  for (int i = 0; i < kNumRequests; ++i) {
    before[i] = collector.streamed(Id(i)).size();
    ASSERT_GT(before[i], 0u);
    ASSERT_LT(before[i], static_cast<size_t>(kMaxNew));
  }
  const int64_t v1 = v0 + 7;
  ASSERT_TRUE(fe.engine
                  ->RunOnEngineThread([&](EngineContext& ctx) {
                    absl::Status s = ctx.FlushCache();
                    ctx.set_weight_version(v1);
                    return s;
                  })
                  .ok());
  fe.runner->SetStepBudget(-1);
  ASSERT_TRUE(fe.engine->Continue().ok());
  ASSERT_TRUE(collector.WaitFor(kNumRequests));
  for (int i = 0; i < kNumRequests; ++i) {
    const GenerateResult r = collector.result(Id(i));
    ASSERT_EQ(r.output_ids.size(), static_cast<size_t>(kMaxNew));
    EXPECT_EQ(r.dispatch_weight_version, v0);
    EXPECT_EQ(r.weight_version, v1);
    ASSERT_EQ(r.weight_version_segments.size(), 2u) << Id(i);
    EXPECT_EQ(r.weight_version_segments[0], (VersionSegment{v0, static_cast<int32_t>(before[i])}));
    EXPECT_EQ(r.weight_version_segments[1],
              (VersionSegment{v1, kMaxNew - static_cast<int32_t>(before[i])}));
    EXPECT_GE(r.num_retractions, 1);
  }
}

TEST(EngineVersionTest, UninterruptedRequestHasOneSegment) {
  FakeRunnerOptions fo;
  FakeEngine fe = MakeFakeEngine(fo);
  Collector collector;
  ASSERT_TRUE(fe.engine->Submit(Greedy("one", Prompt(6, 7), 12), collector.Callbacks()).ok());
  ASSERT_TRUE(collector.WaitFor(1));
  const GenerateResult r = collector.result("one");
  ASSERT_EQ(r.weight_version_segments.size(), 1u);
  EXPECT_EQ(r.weight_version_segments[0].num_tokens, 12);
  EXPECT_EQ(r.weight_version_segments[0].weight_version, fe.engine->weight_version());
  EXPECT_EQ(r.dispatch_weight_version, fe.engine->weight_version());
}

// Versions a request accepts (issue 30): across retract -> update -> continue, a request whose
// constraint the new version breaks finishes with kAbort naming both versions and never gets a
// token from the new weights; one whose constraint still holds continues on them.
TEST(EngineVersionTest, UpdateToAVersionARequestRefusesFinishesItWithoutAToken) {
  FakeRunnerOptions fo;
  fo.page_size = 4;
  FakeEngine fe = MakeFakeEngine(fo);
  Collector collector;
  const int64_t v0 = fe.engine->weight_version();
  fe.runner->SetStepBudget(4);
  ASSERT_TRUE(fe.engine->Pause(PauseMode::kInPlace).ok());
  GenerateRequest exact = Greedy("exact", Prompt(8, 1), kMaxNew);
  exact.versions.exact = v0;
  GenerateRequest min = Greedy("min", Prompt(9, 2), kMaxNew);
  min.versions.min = v0;
  GenerateRequest any = Greedy("any", Prompt(10, 3), kMaxNew);
  GenerateRequest queued = Greedy("queued", Prompt(11, 4), kMaxNew);
  queued.versions.exact = v0;
  for (GenerateRequest* r : {&exact, &min, &any}) {
    ASSERT_TRUE(fe.engine->Submit(*r, collector.Callbacks()).ok());
  }
  ASSERT_TRUE(fe.engine->Continue().ok());
  fe.runner->WaitForSteps(4);
  ASSERT_TRUE(PauseGated(*fe.engine, *fe.runner, PauseMode::kRetract).ok());
  // One more, still waiting (never admitted) when the update lands.
  ASSERT_TRUE(fe.engine->Submit(queued, collector.Callbacks()).ok());
  const size_t exact_before = collector.streamed("exact").size();
  ASSERT_GT(exact_before, 0u);
  const int64_t v1 = v0 + 1;
  ASSERT_TRUE(fe.engine
                  ->RunOnEngineThread([&](EngineContext& ctx) {
                    absl::Status s = ctx.FlushCache();
                    ctx.set_weight_version(v1);
                    return s;
                  })
                  .ok());
  fe.runner->SetStepBudget(-1);
  ASSERT_TRUE(fe.engine->Continue().ok());
  ASSERT_TRUE(collector.WaitFor(4));
  for (const char* id : {"exact", "queued"}) {
    const GenerateResult r = collector.result(id);
    EXPECT_EQ(r.finish_reason.kind, FinishKind::kAbort) << id;
    EXPECT_NE(r.finish_reason.message.find(absl::StrCat("now serves version ", v1)),
              std::string::npos)
        << r.finish_reason.message;
    EXPECT_NE(r.finish_reason.message.find(absl::StrCat("== ", v0)), std::string::npos)
        << r.finish_reason.message;
    for (const VersionSegment& seg : r.weight_version_segments) {
      EXPECT_EQ(seg.weight_version, v0) << id << ": a token from a version it refuses";
    }
  }
  EXPECT_EQ(collector.result("exact").output_ids.size(), exact_before);
  EXPECT_TRUE(collector.result("queued").output_ids.empty());
  for (const char* id : {"min", "any"}) {
    const GenerateResult r = collector.result(id);
    EXPECT_EQ(r.finish_reason.kind, FinishKind::kLength) << id;
    EXPECT_EQ(r.weight_version, v1) << id;
    EXPECT_EQ(r.dispatch_weight_version, v0) << id;
  }
  ExpectNoLeak(*fe.engine);
}

// A request submitted straight to an engine below its minimum (the worker's door check raced
// an update) never runs a step: it finishes with kAbort and no token.
TEST(EngineVersionTest, RequestBelowItsMinimumNeverRuns) {
  FakeEngine fe = MakeFakeEngine();
  Collector collector;
  GenerateRequest r = Greedy("future", Prompt(6, 9), 8);
  r.versions.min = fe.engine->weight_version() + 3;
  ASSERT_TRUE(fe.engine->Submit(r, collector.Callbacks()).ok());
  ASSERT_TRUE(collector.WaitFor(1));
  const GenerateResult res = collector.result("future");
  EXPECT_EQ(res.finish_reason.kind, FinishKind::kAbort);
  EXPECT_TRUE(res.output_ids.empty());
  EXPECT_NE(res.finish_reason.message.find(">= "), std::string::npos) << res.finish_reason.message;
}

TEST(EngineVersionTest, InvalidConstraintsAreRefusedAtSubmission) {
  FakeEngine fe = MakeFakeEngine();
  Collector collector;
  GenerateRequest neg = Greedy("neg", Prompt(6, 9), 8);
  neg.versions.min = -1;
  absl::Status s = fe.engine->Submit(neg, collector.Callbacks());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("min_weight_version"), std::string::npos) << s;
  GenerateRequest both = Greedy("both", Prompt(6, 9), 8);
  both.versions.min = 5;
  both.versions.exact = 4;
  s = fe.engine->Submit(both, collector.Callbacks());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("exact_weight_version"), std::string::npos) << s;
}

}  // namespace
}  // namespace rl::engine::testing
