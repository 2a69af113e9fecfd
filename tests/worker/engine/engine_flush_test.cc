// Seed interruptible-sampling §4.2 (test_engine_flush_cache): flush_cache empties the radix
// cache, the KV pool and req_to_token and resets the scheduling counters; it is refused while
// anything runs or waits, unless paused with retract.
#include "gtest/gtest.h"
#include "services/worker/engine/engine.h"
#include "tests/worker/engine/engine_test_util.h"

namespace rl::engine::testing {
namespace {

class FlushCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fo_.page_size = 4;
    fe_ = MakeFakeEngine(fo_, eo_);
    initial_ = fe_.engine->GetServerInfo();
  }
  void TearDown() override { fe_.runner->SetStepBudget(-1); }

  // Runs `n` requests to completion and returns their outputs.
  std::vector<std::vector<int32_t>> Generate(const std::string& tag, int n) {
    const size_t before = collector_.num_finished();
    for (int i = 0; i < n; ++i) {
      EXPECT_TRUE(
          fe_.engine
              ->Submit(Greedy(absl::StrCat(tag, i), Prompt(20 + i, i), 30), collector_.Callbacks())
              .ok());
    }
    EXPECT_TRUE(collector_.WaitFor(before + n));
    std::vector<std::vector<int32_t>> out;
    for (int i = 0; i < n; ++i) out.push_back(collector_.result(absl::StrCat(tag, i)).output_ids);
    return out;
  }

  void ExpectFlushed() {
    const ServerInfo info = fe_.engine->GetServerInfo();
    EXPECT_EQ(info.scheduler.available_kv_tokens, initial_.scheduler.available_kv_tokens);
    EXPECT_EQ(info.scheduler.available_kv_tokens, info.scheduler.total_kv_tokens);
    EXPECT_EQ(info.scheduler.tree_cache_tokens, 0);
    EXPECT_EQ(info.scheduler.req_to_token_used, 0);
    EXPECT_EQ(info.scheduler.forward_ct_decode, 0);
    EXPECT_DOUBLE_EQ(info.scheduler.new_token_ratio, initial_.scheduler.new_token_ratio);
    EXPECT_EQ(info.scheduler.num_running, 0);
    EXPECT_EQ(info.scheduler.num_waiting, 0);
    EXPECT_FALSE(info.scheduler.has_chunked_prefill);
    EXPECT_TRUE(CheckInvariants(*fe_.engine).ok());
  }

  Collector collector_;
  FakeRunnerOptions fo_;
  EngineOptions eo_;
  FakeEngine fe_;
  ServerInfo initial_;
};

TEST_F(FlushCacheTest, FlushCacheAfterGeneration) {
  EXPECT_EQ(initial_.scheduler.available_kv_tokens, initial_.scheduler.total_kv_tokens);
  Generate("a", 6);
  const ServerInfo used = fe_.engine->GetServerInfo();
  EXPECT_GT(used.scheduler.tree_cache_tokens, 0);
  EXPECT_LT(used.scheduler.available_kv_tokens, used.scheduler.total_kv_tokens);
  EXPECT_GT(used.scheduler.forward_ct_decode, 0);
  EXPECT_LT(used.scheduler.new_token_ratio, initial_.scheduler.new_token_ratio);
  ASSERT_TRUE(fe_.engine->FlushCache().ok());
  ExpectFlushed();
}

TEST_F(FlushCacheTest, FlushCacheClearsSchedulingState) {
  Generate("a", 3);
  ASSERT_TRUE(fe_.engine->FlushCache().ok());
  ExpectFlushed();
  // Nothing is left half-done: the next request starts from an empty cache.
  Generate("b", 1);
  EXPECT_EQ(collector_.result("b0").cached_tokens, 0);
}

TEST_F(FlushCacheTest, FlushRefusedWhileBusyUnlessRetracted) {
  fe_.runner->SetStepBudget(4);
  ASSERT_TRUE(fe_.engine->Submit(Greedy("r", Prompt(12, 1), 60), collector_.Callbacks()).ok());
  fe_.runner->WaitForSteps(4);
  absl::Status refused;
  auto flush = std::async(std::launch::async, [&] { return fe_.engine->FlushCache(); });
  while (flush.wait_for(std::chrono::milliseconds(2)) != std::future_status::ready) {
    fe_.runner->AllowSteps(1);
  }
  EXPECT_EQ(flush.get().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(PauseGated(*fe_.engine, *fe_.runner, PauseMode::kInPlace).ok());
  EXPECT_EQ(fe_.engine->FlushCache().code(), absl::StatusCode::kFailedPrecondition);
  // Waiting requests block a flush too, unless the engine is paused with retract.
  ASSERT_TRUE(fe_.engine->Submit(Greedy("w", Prompt(12, 2), 60), collector_.Callbacks()).ok());
  ASSERT_TRUE(fe_.engine->Pause(PauseMode::kRetract).ok());
  ASSERT_TRUE(fe_.engine->FlushCache().ok());
  const ServerInfo info = fe_.engine->GetServerInfo();
  EXPECT_EQ(info.scheduler.num_waiting, 2);
  EXPECT_EQ(info.scheduler.tree_cache_tokens, 0);
  EXPECT_EQ(info.scheduler.available_kv_tokens, info.scheduler.total_kv_tokens);
  fe_.runner->SetStepBudget(-1);
  ASSERT_TRUE(fe_.engine->Continue().ok());
  ASSERT_TRUE(collector_.WaitFor(2));
  EXPECT_EQ(collector_.result("r").output_ids, ReferenceGreedy(fo_, Prompt(12, 1), 60));
  EXPECT_EQ(collector_.result("w").output_ids, ReferenceGreedy(fo_, Prompt(12, 2), 60));
  // Only waiting requests (no running) with a plain pause: still refused.
  ASSERT_TRUE(fe_.engine->Pause(PauseMode::kInPlace).ok());
  ASSERT_TRUE(fe_.engine->Submit(Greedy("x", Prompt(5, 3), 3), collector_.Callbacks()).ok());
  EXPECT_EQ(fe_.engine->FlushCache().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(fe_.engine->Continue().ok());
  ASSERT_TRUE(collector_.WaitFor(3));
  ASSERT_TRUE(fe_.engine->FlushCache().ok());
  ExpectFlushed();
}

TEST_F(FlushCacheTest, GenerationWorksAfterFlush) {
  const auto before = Generate("a", 4);
  ASSERT_TRUE(fe_.engine->FlushCache().ok());
  const auto after = Generate("b", 4);
  EXPECT_EQ(before, after);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(after[i], ReferenceGreedy(fo_, Prompt(20 + i, i), 30));
  }
}

TEST_F(FlushCacheTest, MultipleFlushCycles) {
  std::vector<std::vector<int32_t>> first;
  for (int cycle = 0; cycle < 4; ++cycle) {
    const auto out = Generate(absl::StrCat("c", cycle, "_"), 5);
    if (cycle == 0) first = out;
    EXPECT_EQ(out, first);
    ASSERT_TRUE(fe_.engine->FlushCache().ok());
    ExpectFlushed();
  }
}

}  // namespace
}  // namespace rl::engine::testing
