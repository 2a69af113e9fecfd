// The engine over the real CPU runner on stories260K: the golden greedy continuation, logprobs
// against the golden logits, prefix caching, batch invariance and pause/continue determinism
// with real KV.
#include <cmath>
#include <fstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/worker/engine/engine.h"
#include "services/worker/model/cpu_model_runner.h"
#include "tests/testing/test_data.h"
#include "tests/worker/engine/engine_test_util.h"

namespace rl::engine::testing {
namespace {

std::string ModelDir() { return rl::testing::Stories(); }

struct Golden {
  std::vector<int32_t> prompt;
  std::vector<int32_t> generated;
  std::vector<double> first_step_logits;
};

Golden LoadGolden() {
  std::ifstream f(ModelDir() + "/golden_greedy.json");
  const nlohmann::json j = nlohmann::json::parse(f);
  Golden g;
  g.prompt = j["prompt_ids"].get<std::vector<int32_t>>();
  g.generated = j["generated_ids"].get<std::vector<int32_t>>();
  g.first_step_logits = j["first_step_logits"].get<std::vector<double>>();
  return g;
}

class EngineCpuTest : public ::testing::Test {
 protected:
  void SetUp() override { golden_ = LoadGolden(); }

  // `gate`, when given, receives the step gate wrapped around the runner.
  std::unique_ptr<Engine> MakeEngine(int32_t page_size, int64_t num_kv_slots, EngineOptions eo = {},
                                     GatedRunner** gate = nullptr) {
    model::RunnerOptions ro;
    ro.model_dir = ModelDir();
    ro.page_size = page_size;
    ro.num_kv_slots = num_kv_slots;
    ro.num_threads = 1;
    auto runner = model::CreateCpuModelRunner(ro);
    EXPECT_TRUE(runner.ok()) << runner.status();
    eo.check_invariants = true;
    auto gated = std::make_unique<GatedRunner>(std::move(runner).value());
    if (gate != nullptr) *gate = gated.get();
    auto engine = Engine::Create(std::move(gated), eo);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return std::move(engine).value();
  }

  // Story-like prompts: BOS followed by tokens of the golden continuation, varied.
  std::vector<int32_t> StoryPrompt(int i) const {
    std::vector<int32_t> p = golden_.prompt;
    for (int k = 0; k < i % 7; ++k) p.push_back(golden_.generated[(k + i) % 20]);
    return p;
  }

  Golden golden_;
};

TEST_F(EngineCpuTest, GreedyMatchesTheGolden) {
  Collector c;
  std::unique_ptr<Engine> engine = MakeEngine(4, 2048);
  GenerateRequest r = Greedy("g", golden_.prompt, 20);
  r.sampling.ignore_eos = true;
  r.return_logprob = true;
  r.top_logprobs_num = 2;
  ASSERT_TRUE(engine->Submit(r, c.Callbacks()).ok());
  ASSERT_TRUE(c.WaitFor(1));
  const GenerateResult res = c.result("g");
  EXPECT_EQ(res.output_ids, golden_.generated);
  // Greedy requests report temperature-1 logprobs: log_softmax of the golden first-step logits.
  double m = -1e300, s = 0;
  for (double x : golden_.first_step_logits) m = std::max(m, x);
  for (double x : golden_.first_step_logits) s += std::exp(x - m);
  const double expect = golden_.first_step_logits[golden_.generated[0]] - m - std::log(s);
  ASSERT_FALSE(res.output_logprobs.empty());
  EXPECT_NEAR(res.output_logprobs[0].logprob, expect, 1e-3);
  EXPECT_EQ(res.output_logprobs[0].top[0].token_id, golden_.generated[0]);
  ExpectNoLeak(*engine);
}

TEST_F(EngineCpuTest, PromptLogprobsEqualOutputLogprobsOfTheSameTokens) {
  // The logprobs the engine reports while generating equal the prompt logprobs it computes
  // when the completion is fed back as a prompt: what a trainer recomputing them sees.
  Collector c;
  std::unique_ptr<Engine> engine = MakeEngine(4, 2048);
  GenerateRequest r = Greedy("gen", golden_.prompt, 20);
  r.sampling.temperature = 0.8;
  r.sampling.seed = 3;
  r.sampling.ignore_eos = true;
  r.return_logprob = true;
  ASSERT_TRUE(engine->Submit(r, c.Callbacks()).ok());
  ASSERT_TRUE(c.WaitFor(1));
  const GenerateResult gen = c.result("gen");
  std::vector<int32_t> full = golden_.prompt;
  full.insert(full.end(), gen.output_ids.begin(), gen.output_ids.end());
  GenerateRequest score = Greedy("score", full, 0);
  score.sampling.temperature = 0.8;
  score.return_logprob = true;
  score.logprob_start_len = static_cast<int32_t>(golden_.prompt.size());
  ASSERT_TRUE(engine->Submit(score, c.Callbacks()).ok());
  ASSERT_TRUE(c.WaitFor(2));
  const GenerateResult sc = c.result("score");
  ASSERT_EQ(sc.prompt_logprobs.size(), gen.output_logprobs.size());
  for (size_t i = 0; i < sc.prompt_logprobs.size(); ++i) {
    EXPECT_EQ(sc.prompt_logprobs[i].token_id, gen.output_ids[i]);
    EXPECT_NEAR(sc.prompt_logprobs[i].logprob, gen.output_logprobs[i].logprob, 1e-5) << i;
  }
  ExpectNoLeak(*engine);
}

TEST_F(EngineCpuTest, BatchedAndCachedRunsEqualSoloRuns) {
  const int n = 12;
  std::vector<std::vector<int32_t>> solo(n);
  std::vector<std::vector<double>> solo_lp(n);
  {
    Collector c;
    std::unique_ptr<Engine> engine = MakeEngine(4, 4096);
    for (int i = 0; i < n; ++i) {
      GenerateRequest r = Greedy(absl::StrCat("s", i), StoryPrompt(i), 24);
      r.return_logprob = true;
      ASSERT_TRUE(engine->Submit(r, c.Callbacks()).ok());
      ASSERT_TRUE(c.WaitFor(i + 1));
      ASSERT_TRUE(engine->FlushCache().ok());
      const GenerateResult res = c.result(absl::StrCat("s", i));
      solo[i] = res.output_ids;
      for (const TokenLogprob& lp : res.output_logprobs) solo_lp[i].push_back(lp.logprob);
    }
  }
  Collector c;
  EngineOptions eo;
  eo.scheduler.chunked_prefill_size = 7;
  std::unique_ptr<Engine> engine = MakeEngine(4, 4096, eo);
  for (int i = 0; i < n; ++i) {
    GenerateRequest r = Greedy(absl::StrCat("b", i), StoryPrompt(i), 24);
    r.return_logprob = true;
    ASSERT_TRUE(engine->Submit(r, c.Callbacks()).ok());
  }
  ASSERT_TRUE(c.WaitFor(n));
  for (int i = 0; i < n; ++i) {
    const GenerateResult res = c.result(absl::StrCat("b", i));
    EXPECT_EQ(res.output_ids, solo[i]) << i;
    std::vector<double> lp;
    for (const TokenLogprob& l : res.output_logprobs) lp.push_back(l.logprob);
    EXPECT_EQ(lp, solo_lp[i]) << "batch-invariant CPU kernels give bit-identical logprobs";
  }
  EXPECT_GT(engine->GetServerInfo().scheduler.cache_hit_tokens, 0);
  ExpectNoLeak(*engine);
}

TEST_F(EngineCpuTest, RetractAndAbortAreDeterministicWithRealKv) {
  const int n = 6;
  std::vector<std::vector<int32_t>> base(n);
  {
    Collector c;
    std::unique_ptr<Engine> engine = MakeEngine(4, 4096);
    for (int i = 0; i < n; ++i) {
      ASSERT_TRUE(
          engine->Submit(Greedy(absl::StrCat("b", i), StoryPrompt(i), 60), c.Callbacks()).ok());
    }
    ASSERT_TRUE(c.WaitFor(n));
    for (int i = 0; i < n; ++i) base[i] = c.result(absl::StrCat("b", i)).output_ids;
  }
  // Retract while running (after 8 steps), flush, abort one, continue, compare.
  Collector c;
  GatedRunner* gate = nullptr;
  std::unique_ptr<Engine> engine = MakeEngine(4, 4096, {}, &gate);
  gate->SetStepBudget(8);
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(
        engine->Submit(Greedy(absl::StrCat("r", i), StoryPrompt(i), 60), c.Callbacks()).ok());
  }
  GenerateRequest aborted = Greedy("abort_me", StoryPrompt(3), 60);
  ASSERT_TRUE(engine->Submit(aborted, c.Callbacks()).ok());
  gate->WaitForSteps(8);
  ASSERT_TRUE(PauseGated(*engine, *gate, PauseMode::kRetract).ok());
  gate->SetStepBudget(-1);
  const ServerInfo paused = engine->GetServerInfo();
  EXPECT_EQ(paused.scheduler.num_running, 0);
  EXPECT_EQ(paused.scheduler.available_kv_tokens + paused.scheduler.tree_cache_tokens,
            paused.scheduler.total_kv_tokens);
  ASSERT_TRUE(engine->FlushCache().ok());
  ASSERT_TRUE(*engine->Abort("abort_me") == 1);
  ASSERT_TRUE(engine->Continue().ok());
  ASSERT_TRUE(c.WaitFor(n + 1));
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(c.result(absl::StrCat("r", i)).output_ids, base[i]) << i;
  }
  const GenerateResult a = c.result("abort_me");
  EXPECT_EQ(a.finish_reason.kind, FinishKind::kAbort);
  ASSERT_LE(a.output_ids.size(), base[3].size());
  EXPECT_TRUE(std::equal(a.output_ids.begin(), a.output_ids.end(), base[3].begin()));
  ExpectNoLeak(*engine);
}

TEST_F(EngineCpuTest, KvExhaustionWithRealKvFinishesEveryRequest) {
  const int n = 16;
  Collector c;
  // 256 slots for 16 requests of up to ~90 tokens each: retraction is unavoidable.
  std::unique_ptr<Engine> engine = MakeEngine(4, 256);
  std::vector<std::vector<int32_t>> base(n);
  for (int i = 0; i < n; ++i) {
    GenerateRequest r = Greedy(absl::StrCat("r", i), StoryPrompt(i), 80);
    r.sampling.ignore_eos = true;
    ASSERT_TRUE(engine->Submit(r, c.Callbacks()).ok());
  }
  ASSERT_TRUE(c.WaitFor(n));
  EXPECT_GT(engine->GetServerInfo().scheduler.num_retractions, 0);
  // Same prompts run one by one give the same tokens.
  for (int i = 0; i < n; i += 5) {
    GenerateRequest r = Greedy(absl::StrCat("solo", i), StoryPrompt(i), 80);
    r.sampling.ignore_eos = true;
    ASSERT_TRUE(engine->Submit(r, c.Callbacks()).ok());
    ASSERT_TRUE(c.WaitFor(n + 1 + i / 5));
    EXPECT_EQ(c.result(absl::StrCat("solo", i)).output_ids,
              c.result(absl::StrCat("r", i)).output_ids);
  }
  ExpectNoLeak(*engine);
}

}  // namespace
}  // namespace rl::engine::testing
