// Seed interruptible-sampling §4.3 (test_engine_determine_generation): at temperature 0 a
// request's output does not depend on pause(retract)/continue, and an aborted request's
// partial output is a prefix of the uninterrupted one; single and many concurrent requests.
// The baseline is an uninterrupted engine run, itself checked against ReferenceGreedy.
#include "gtest/gtest.h"
#include "services/worker/engine/engine.h"
#include "tests/worker/engine/engine_test_util.h"

namespace rl::engine::testing {
namespace {

constexpr int32_t kMaxNew = 64;

FakeRunnerOptions Options() {
  FakeRunnerOptions fo;
  fo.page_size = 4;  // the seed's workaround config: small pages and chunks
  return fo;
}

EngineOptions SmallChunks() {
  EngineOptions eo;
  eo.scheduler.chunked_prefill_size = 4;
  return eo;
}

std::vector<std::vector<int32_t>> Prompts(int n) {
  std::vector<std::vector<int32_t>> p;
  for (int i = 0; i < n; ++i) p.push_back(Prompt(6 + 5 * i, 900 + i));
  return p;
}

std::vector<std::vector<int32_t>> Baseline(const std::vector<std::vector<int32_t>>& prompts) {
  Collector c;
  FakeEngine fe = MakeFakeEngine(Options(), SmallChunks());
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_TRUE(
        fe.engine->Submit(Greedy(absl::StrCat("b", i), prompts[i], kMaxNew), c.Callbacks()).ok());
  }
  EXPECT_TRUE(c.WaitFor(prompts.size()));
  std::vector<std::vector<int32_t>> out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    out.push_back(c.result(absl::StrCat("b", i)).output_ids);
    EXPECT_EQ(out.back(), ReferenceGreedy(Options(), prompts[i], kMaxNew));
  }
  return out;
}

// Runs `prompts` concurrently, interrupting with `mode` after `hold` steps (and again after
// `hold` more), and returns the outputs; with kAbort the requests are then re-generated.
struct Interrupted {
  std::vector<std::vector<int32_t>> first;   // outputs of the interrupted run
  std::vector<std::vector<int32_t>> second;  // re-generation after abort (kAbort only)
};

Interrupted RunInterrupted(const std::vector<std::vector<int32_t>>& prompts, PauseMode mode,
                           int64_t hold) {
  Collector c;
  FakeEngine fe = MakeFakeEngine(Options(), SmallChunks());
  fe.runner->SetStepBudget(hold);
  EXPECT_TRUE(fe.engine->Pause(PauseMode::kInPlace).ok());  // all start in the same step
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_TRUE(
        fe.engine->Submit(Greedy(absl::StrCat("r", i), prompts[i], kMaxNew), c.Callbacks()).ok());
  }
  EXPECT_TRUE(fe.engine->Continue().ok());
  fe.runner->WaitForSteps(hold);
  EXPECT_TRUE(PauseGated(*fe.engine, *fe.runner, mode).ok());
  if (mode != PauseMode::kAbort) {
    EXPECT_TRUE(fe.engine->Continue().ok());
    const int64_t steps = fe.runner->steps_done();
    fe.runner->AllowSteps(hold);
    fe.runner->WaitForSteps(steps + hold);
    EXPECT_TRUE(PauseGated(*fe.engine, *fe.runner, mode).ok());
  }
  fe.runner->SetStepBudget(-1);
  EXPECT_TRUE(fe.engine->Continue().ok());
  EXPECT_TRUE(c.WaitFor(prompts.size()));
  Interrupted out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const GenerateResult r = c.result(absl::StrCat("r", i));
    EXPECT_EQ(r.finish_reason.kind,
              mode == PauseMode::kAbort ? FinishKind::kAbort : FinishKind::kLength);
    out.first.push_back(r.output_ids);
  }
  if (mode == PauseMode::kAbort) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_TRUE(
          fe.engine->Submit(Greedy(absl::StrCat("again", i), prompts[i], kMaxNew), c.Callbacks())
              .ok());
    }
    EXPECT_TRUE(c.WaitFor(2 * prompts.size()));
    for (size_t i = 0; i < prompts.size(); ++i) {
      out.second.push_back(c.result(absl::StrCat("again", i)).output_ids);
    }
  }
  ExpectNoLeak(*fe.engine);
  return out;
}

bool IsPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

TEST(DeterministicGenerationTest, SingleRequestRetractVsNoPause) {
  const auto prompts = Prompts(1);
  const auto base = Baseline(prompts);
  for (int64_t hold : {1, 3, 20}) {  // mid-prefill, early decode, late decode
    EXPECT_EQ(RunInterrupted(prompts, PauseMode::kRetract, hold).first, base) << hold;
  }
}

TEST(DeterministicGenerationTest, SingleRequestInPlaceVsNoPause) {
  const auto prompts = Prompts(1);
  EXPECT_EQ(RunInterrupted(prompts, PauseMode::kInPlace, 5).first, Baseline(prompts));
}

TEST(DeterministicGenerationTest, SingleRequestAbortVsNoPause) {
  const auto prompts = Prompts(1);
  const auto base = Baseline(prompts);
  const Interrupted run = RunInterrupted(prompts, PauseMode::kAbort, 8);
  ASSERT_EQ(run.first.size(), 1u);
  EXPECT_TRUE(IsPrefix(run.first[0], base[0]));
  EXPECT_LT(run.first[0].size(), base[0].size());
  EXPECT_EQ(run.second, base);
}

TEST(DeterministicGenerationTest, MultipleRequestsRetractVsNoPause) {
  const auto prompts = Prompts(8);
  const auto base = Baseline(prompts);
  for (int64_t hold : {2, 12}) {
    EXPECT_EQ(RunInterrupted(prompts, PauseMode::kRetract, hold).first, base) << hold;
  }
}

TEST(DeterministicGenerationTest, MultipleRequestsAbortVsNoPause) {
  const auto prompts = Prompts(8);
  const auto base = Baseline(prompts);
  const Interrupted run = RunInterrupted(prompts, PauseMode::kAbort, 12);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_TRUE(IsPrefix(run.first[i], base[i])) << i;
    EXPECT_LT(run.first[i].size(), base[i].size()) << i;
  }
  EXPECT_EQ(run.second, base);
}

TEST(DeterministicGenerationTest, ManyConcurrentRequestsUnderKvPressureVsNoPause) {
  // 32 requests in a pool that holds a fraction of them: retraction from KV exhaustion and
  // from pause(retract) mix, and every output still matches.
  const auto prompts = Prompts(32);
  FakeRunnerOptions fo = Options();
  fo.num_kv_slots = 1024;
  Collector c;
  FakeEngine fe = MakeFakeEngine(fo, SmallChunks());
  fe.runner->SetStepBudget(30);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(
        fe.engine->Submit(Greedy(absl::StrCat("r", i), prompts[i], kMaxNew), c.Callbacks()).ok());
  }
  fe.runner->WaitForSteps(30);
  ASSERT_TRUE(PauseGated(*fe.engine, *fe.runner, PauseMode::kRetract).ok());
  fe.runner->SetStepBudget(-1);
  ASSERT_TRUE(fe.engine->Continue().ok());
  ASSERT_TRUE(c.WaitFor(prompts.size()));
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(c.result(absl::StrCat("r", i)).output_ids, ReferenceGreedy(fo, prompts[i], kMaxNew))
        << i;
  }
  EXPECT_GT(fe.engine->GetServerInfo().scheduler.num_retractions, 0);
  ExpectNoLeak(*fe.engine);
}

}  // namespace
}  // namespace rl::engine::testing
