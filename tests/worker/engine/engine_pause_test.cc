// Seed interruptible-sampling §4.1 (test_engine_pause_continue): pause with retract, in_place,
// multiple cycles and abort, with the fake runner gating the engine between known steps.
#include <set>

#include "gtest/gtest.h"
#include "services/worker/engine/engine.h"
#include "tests/worker/engine/engine_test_util.h"

namespace rl::engine::testing {
namespace {

constexpr int kNumRequests = 4;
constexpr int32_t kMaxNew = 80;

class PauseContinueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fo_.page_size = 4;
    fe_ = MakeFakeEngine(fo_);
    for (int i = 0; i < kNumRequests; ++i) prompts_.push_back(Prompt(10 + 3 * i, 300 + i));
  }
  void TearDown() override { fe_.runner->SetStepBudget(-1); }

  // Submits the requests and lets the engine run `steps` forward passes, then holds it.
  // The requests are queued while paused so that they all start in the same step.
  void StartAndHold(int64_t steps) {
    fe_.runner->SetStepBudget(steps);
    ASSERT_TRUE(fe_.engine->Pause(PauseMode::kInPlace).ok());
    for (int i = 0; i < kNumRequests; ++i) {
      ASSERT_TRUE(
          fe_.engine->Submit(Greedy(Id(i), prompts_[i], kMaxNew), collector_.Callbacks()).ok());
    }
    ASSERT_TRUE(fe_.engine->Continue().ok());
    fe_.runner->WaitForSteps(steps);
  }
  void Release() { fe_.runner->SetStepBudget(-1); }
  static std::string Id(int i) { return absl::StrCat("req", i); }
  std::set<std::string> AllIds() const {
    std::set<std::string> ids;
    for (int i = 0; i < kNumRequests; ++i) ids.insert(Id(i));
    return ids;
  }
  void ExpectAllMatchReference() {
    ASSERT_TRUE(collector_.WaitFor(kNumRequests));
    for (int i = 0; i < kNumRequests; ++i) {
      const GenerateResult r = collector_.result(Id(i));
      EXPECT_EQ(r.finish_reason.kind, FinishKind::kLength) << r.finish_reason.message;
      EXPECT_EQ(r.output_ids, ReferenceGreedy(fo_, prompts_[i], kMaxNew)) << Id(i);
      EXPECT_EQ(collector_.streamed(Id(i)), r.output_ids);
    }
  }

  Collector collector_;
  FakeRunnerOptions fo_;
  FakeEngine fe_;
  std::vector<std::vector<int32_t>> prompts_;
};

TEST_F(PauseContinueTest, PauseGenerationRetractMode) {
  StartAndHold(5);
  ASSERT_TRUE(PauseGated(*fe_.engine, *fe_.runner, PauseMode::kRetract).ok());
  const ServerInfo paused = fe_.engine->GetServerInfo();
  EXPECT_TRUE(paused.paused);
  EXPECT_EQ(paused.pause_mode, PauseMode::kRetract);
  EXPECT_EQ(paused.scheduler.num_running, 0);
  EXPECT_EQ(paused.scheduler.num_waiting, kNumRequests);
  EXPECT_EQ(paused.scheduler.req_to_token_used, 0);
  // The running requests' KV was freed: everything not in the radix cache is free.
  EXPECT_EQ(paused.scheduler.available_kv_tokens + paused.scheduler.tree_cache_tokens,
            paused.scheduler.total_kv_tokens);
  EXPECT_EQ(collector_.num_finished(), 0u);
  Release();
  ASSERT_TRUE(fe_.engine->Continue().ok());
  ExpectAllMatchReference();
  for (int i = 0; i < kNumRequests; ++i) EXPECT_GE(collector_.result(Id(i)).num_retractions, 1);
  ExpectNoLeak(*fe_.engine);
}

TEST_F(PauseContinueTest, RetractFreesKvThatInPlaceKeeps) {
  StartAndHold(5);
  ASSERT_TRUE(PauseGated(*fe_.engine, *fe_.runner, PauseMode::kInPlace).ok());
  const ServerInfo in_place = fe_.engine->GetServerInfo();
  ASSERT_TRUE(fe_.engine->Pause(PauseMode::kRetract).ok());
  const ServerInfo retracted = fe_.engine->GetServerInfo();
  EXPECT_GT(retracted.scheduler.available_kv_tokens, in_place.scheduler.available_kv_tokens);
  EXPECT_EQ(retracted.pause_mode, PauseMode::kRetract);
  Release();
  ASSERT_TRUE(fe_.engine->Continue().ok());
  ExpectAllMatchReference();
}

// The snapshot's running ids are rebuilt only when the running batch changes: they follow an
// abort and a retraction, and equal what the engine thread sees.
TEST_F(PauseContinueTest, RunningIdsFollowTheRunningBatch) {
  StartAndHold(5);
  ASSERT_TRUE(PauseGated(*fe_.engine, *fe_.runner, PauseMode::kInPlace).ok());
  ServerInfo a = fe_.engine->GetServerInfo();
  EXPECT_EQ(std::set<std::string>(a.running_ids.begin(), a.running_ids.end()), AllIds());
  ASSERT_EQ(fe_.engine->Abort(Id(0), "gone").value(), 1);
  ServerInfo b = fe_.engine->GetServerInfo();
  std::set<std::string> rest = AllIds();
  rest.erase(Id(0));
  EXPECT_EQ(std::set<std::string>(b.running_ids.begin(), b.running_ids.end()), rest);
  EXPECT_EQ(b.scheduler.num_running, kNumRequests - 1);
  std::vector<std::string> on_engine;
  ASSERT_TRUE(fe_.engine
                  ->RunOnEngineThread([&](EngineContext& ctx) {
                    on_engine = ctx.info().running_ids;
                    return absl::OkStatus();
                  })
                  .ok());
  EXPECT_EQ(on_engine, b.running_ids);
  ASSERT_TRUE(fe_.engine->Pause(PauseMode::kRetract).ok());
  const ServerInfo c = fe_.engine->GetServerInfo();
  EXPECT_TRUE(c.running_ids.empty());
  EXPECT_EQ(c.scheduler.num_running, 0);
  Release();
  ASSERT_TRUE(fe_.engine->Continue().ok());
  ASSERT_TRUE(collector_.WaitFor(kNumRequests));
  EXPECT_TRUE(fe_.engine->GetServerInfo().running_ids.empty());
}

TEST_F(PauseContinueTest, PauseGenerationInPlaceMode) {
  StartAndHold(5);
  ASSERT_TRUE(PauseGated(*fe_.engine, *fe_.runner, PauseMode::kInPlace).ok());
  const ServerInfo a = fe_.engine->GetServerInfo();
  EXPECT_TRUE(a.paused);
  EXPECT_EQ(a.pause_mode, PauseMode::kInPlace);
  EXPECT_EQ(a.scheduler.num_running, kNumRequests);
  EXPECT_EQ(std::set<std::string>(a.running_ids.begin(), a.running_ids.end()), AllIds());
  EXPECT_EQ(a.scheduler.num_waiting, 0);
  EXPECT_EQ(a.scheduler.req_to_token_used, kNumRequests);
  // KV is held by the running requests, and stays so while paused.
  EXPECT_LT(a.scheduler.available_kv_tokens + a.scheduler.tree_cache_tokens,
            a.scheduler.total_kv_tokens);
  fe_.runner->AllowSteps(100);  // nothing may run while paused
  ASSERT_TRUE(fe_.engine->RunOnEngineThread([](EngineContext&) { return absl::OkStatus(); }).ok());
  const ServerInfo b = fe_.engine->GetServerInfo();
  EXPECT_EQ(b.scheduler.available_kv_tokens, a.scheduler.available_kv_tokens);
  EXPECT_EQ(b.running_ids, a.running_ids);
  EXPECT_EQ(b.num_steps, a.num_steps);
  EXPECT_EQ(b.scheduler.generated_tokens, a.scheduler.generated_tokens);
  Release();
  ASSERT_TRUE(fe_.engine->Continue().ok());
  ExpectAllMatchReference();
  for (int i = 0; i < kNumRequests; ++i) EXPECT_EQ(collector_.result(Id(i)).num_retractions, 0);
  ExpectNoLeak(*fe_.engine);
}

TEST_F(PauseContinueTest, PauseContinueMultipleCycles) {
  StartAndHold(3);
  for (int cycle = 0; cycle < 6; ++cycle) {
    const PauseMode mode = cycle % 2 == 0 ? PauseMode::kRetract : PauseMode::kInPlace;
    ASSERT_TRUE(PauseGated(*fe_.engine, *fe_.runner, mode).ok());
    const ServerInfo info = fe_.engine->GetServerInfo();
    EXPECT_EQ(info.pause_mode, mode);
    if (mode == PauseMode::kRetract) {
      EXPECT_EQ(info.scheduler.num_running, 0);
    } else {
      EXPECT_GT(info.scheduler.num_running, 0);
    }
    ASSERT_TRUE(fe_.engine->Continue().ok());
    EXPECT_FALSE(fe_.engine->GetServerInfo().paused);
    const int64_t steps = fe_.runner->steps_done();
    fe_.runner->AllowSteps(4);
    fe_.runner->WaitForSteps(steps + 4);
  }
  Release();
  ExpectAllMatchReference();
  ExpectNoLeak(*fe_.engine);
}

TEST_F(PauseContinueTest, PauseGenerationAbortMode) {
  StartAndHold(5);
  ASSERT_TRUE(PauseGated(*fe_.engine, *fe_.runner, PauseMode::kAbort).ok());
  const ServerInfo info = fe_.engine->GetServerInfo();
  EXPECT_TRUE(info.paused);
  EXPECT_EQ(info.pause_mode, PauseMode::kAbort);
  EXPECT_EQ(info.scheduler.num_running, 0);
  EXPECT_EQ(info.scheduler.num_waiting, 0);
  ASSERT_EQ(collector_.num_finished(), static_cast<size_t>(kNumRequests));
  for (int i = 0; i < kNumRequests; ++i) {
    const GenerateResult r = collector_.result(Id(i));
    EXPECT_EQ(r.finish_reason.kind, FinishKind::kAbort);
    const std::vector<int32_t> ref = ReferenceGreedy(fo_, prompts_[i], kMaxNew);
    ASSERT_LE(r.output_ids.size(), ref.size());
    EXPECT_EQ(r.output_ids, std::vector<int32_t>(ref.begin(), ref.begin() + r.output_ids.size()));
  }
  Release();
  ExpectNoLeak(*fe_.engine);
}

TEST_F(PauseContinueTest, RequestsArrivingWhilePausedWait) {
  Release();
  ASSERT_TRUE(fe_.engine->Pause(PauseMode::kInPlace).ok());
  for (int i = 0; i < kNumRequests; ++i) {
    ASSERT_TRUE(
        fe_.engine->Submit(Greedy(Id(i), prompts_[i], kMaxNew), collector_.Callbacks()).ok());
  }
  ASSERT_TRUE(fe_.engine->RunOnEngineThread([](EngineContext&) { return absl::OkStatus(); }).ok());
  const ServerInfo info = fe_.engine->GetServerInfo();
  EXPECT_EQ(info.scheduler.num_waiting, kNumRequests);
  EXPECT_EQ(info.scheduler.num_running, 0);
  EXPECT_EQ(info.num_steps, 0);
  EXPECT_EQ(collector_.num_finished(), 0u);
  ASSERT_TRUE(fe_.engine->Continue().ok());
  ExpectAllMatchReference();
}

// NumLive counts a request from the moment Submit accepts it (still in the inbox, before any
// published snapshot shows it) until its final is delivered: what a worker's drain waits on.
TEST_F(PauseContinueTest, NumLiveCountsFromSubmitUntilTheFinal) {
  Release();
  ASSERT_TRUE(fe_.engine->Pause(PauseMode::kInPlace).ok());
  EXPECT_EQ(fe_.engine->NumLive(), 0);
  for (int i = 0; i < kNumRequests; ++i) {
    ASSERT_TRUE(
        fe_.engine->Submit(Greedy(Id(i), prompts_[i], kMaxNew), collector_.Callbacks()).ok());
    EXPECT_EQ(fe_.engine->NumLive(), i + 1);
  }
  ASSERT_TRUE(fe_.engine->Continue().ok());
  ASSERT_TRUE(collector_.WaitFor(kNumRequests));
  EXPECT_EQ(fe_.engine->NumLive(), 0);
}

TEST_F(PauseContinueTest, PausingAPausedEngineKeepsTheStrongerMode) {
  StartAndHold(5);
  ASSERT_TRUE(PauseGated(*fe_.engine, *fe_.runner, PauseMode::kInPlace).ok());
  EXPECT_EQ(fe_.engine->GetServerInfo().scheduler.num_running, kNumRequests);
  ASSERT_TRUE(fe_.engine->Pause(PauseMode::kRetract).ok());
  EXPECT_EQ(fe_.engine->GetServerInfo().pause_mode, PauseMode::kRetract);
  EXPECT_EQ(fe_.engine->GetServerInfo().scheduler.num_running, 0);
  ASSERT_TRUE(fe_.engine->Pause(PauseMode::kInPlace).ok());
  EXPECT_EQ(fe_.engine->GetServerInfo().pause_mode, PauseMode::kRetract);
  EXPECT_EQ(fe_.engine->GetServerInfo().scheduler.num_waiting, kNumRequests);
  ASSERT_TRUE(fe_.engine->Pause(PauseMode::kAbort).ok());
  EXPECT_EQ(fe_.engine->GetServerInfo().pause_mode, PauseMode::kAbort);
  EXPECT_EQ(fe_.engine->GetServerInfo().scheduler.num_waiting, 0);
  EXPECT_EQ(collector_.num_finished(), static_cast<size_t>(kNumRequests));
  ASSERT_TRUE(fe_.engine->Pause(PauseMode::kRetract).ok());
  EXPECT_EQ(fe_.engine->GetServerInfo().pause_mode, PauseMode::kAbort);
  EXPECT_EQ(fe_.engine->Pause(PauseMode::kNone).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(fe_.engine->Continue().ok());
  EXPECT_FALSE(fe_.engine->GetServerInfo().paused);
  EXPECT_EQ(fe_.engine->GetServerInfo().pause_mode, PauseMode::kNone);
  Release();
  ExpectNoLeak(*fe_.engine);
}

}  // namespace
}  // namespace rl::engine::testing
