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

}  // namespace
}  // namespace rl::engine::testing
