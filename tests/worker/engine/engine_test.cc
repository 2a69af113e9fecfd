// Engine behaviour with the fake runner: correctness against the reference, prefix caching,
// KV exhaustion, leaks, sampling, logprobs, n > 1, stop conditions, aborts, errors.
#include "services/worker/engine/engine.h"

#include <cmath>
#include <set>

#include "absl/synchronization/notification.h"
#include "common/status.h"
#include "gtest/gtest.h"
#include "tests/worker/engine/engine_test_util.h"

namespace rl::engine::testing {
namespace {

// Hash of the history at every position of `tokens` (the fake model's hidden state).
std::vector<uint64_t> Hashes(const std::vector<int32_t>& tokens) {
  std::vector<uint64_t> h;
  uint64_t x = 0;
  for (size_t p = 0; p < tokens.size(); ++p) {
    x = FakeChain(x, tokens[p], static_cast<int64_t>(p));
    h.push_back(x);
  }
  return h;
}

double RefLogprob(const FakeRunnerOptions& o, uint64_t h, int32_t token, double t) {
  std::vector<float> logits(o.vocab_size);
  FakeLogits(h, o, logits.data());
  double m = -1e300, s = 0;
  for (float x : logits) m = std::max(m, x / t);
  for (float x : logits) s += std::exp(x / t - m);
  return logits[token] / t - m - std::log(s);
}

class CharDecoder : public TextDecoder {
 public:
  std::string Decode(absl::Span<const int32_t> ids) const override {
    std::string s;
    for (int32_t t : ids) s += Char(t);
    return s;
  }
  static char Char(int32_t t) {
    return t < 26   ? static_cast<char>('a' + t)
           : t < 52 ? static_cast<char>('A' + t - 26)
                    : static_cast<char>('0' + (t - 52) % 10);
  }
};

class EngineGreedyTest : public ::testing::TestWithParam<int32_t> {};

TEST_P(EngineGreedyTest, ConcurrentRequestsMatchTheReference) {
  FakeRunnerOptions fo;
  fo.page_size = GetParam();
  EngineOptions eo;
  eo.scheduler.chunked_prefill_size = 16;  // forces chunked prefill of the longer prompts
  Collector c;
  FakeEngine fe = MakeFakeEngine(fo, eo);
  std::vector<std::vector<int32_t>> prompts;
  const std::vector<int32_t> shared = Prompt(21, 99);
  for (int i = 0; i < 40; ++i) {
    std::vector<int32_t> p = i % 2 == 0 ? shared : std::vector<int32_t>();
    const std::vector<int32_t> tail = Prompt(1 + i % 37, i);
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(p);
    ASSERT_TRUE(fe.engine->Submit(Greedy(absl::StrCat("r", i), p, 5 + i % 20), c.Callbacks()).ok());
  }
  ASSERT_TRUE(c.WaitFor(prompts.size()));
  for (int i = 0; i < 40; ++i) {
    const std::string id = absl::StrCat("r", i);
    const GenerateResult r = c.result(id);
    EXPECT_EQ(r.output_ids, ReferenceGreedy(fo, prompts[i], 5 + i % 20)) << id;
    EXPECT_EQ(c.streamed(id), r.output_ids);
    EXPECT_EQ(r.finish_reason.kind, FinishKind::kLength);
    EXPECT_EQ(r.prompt_tokens, static_cast<int32_t>(prompts[i].size()));
    EXPECT_EQ(r.completion_tokens, static_cast<int32_t>(r.output_ids.size()));
    EXPECT_EQ(c.finish_calls(id), 1);
  }
  EXPECT_GT(fe.engine->GetServerInfo().scheduler.cache_hit_tokens, 0);
  ExpectNoLeak(*fe.engine);
}

INSTANTIATE_TEST_SUITE_P(PageSizes, EngineGreedyTest, ::testing::Values(1, 4, 16));

TEST(EngineTest, SharedPrefixIsComputedOnce) {
  FakeRunnerOptions fo;
  fo.page_size = 4;
  Collector c;
  FakeEngine fe = MakeFakeEngine(fo);
  const std::vector<int32_t> prompt = Prompt(41, 5);
  ASSERT_TRUE(fe.engine->Submit(Greedy("a", prompt, 4), c.Callbacks()).ok());
  ASSERT_TRUE(c.WaitFor(1));
  EXPECT_EQ(c.result("a").cached_tokens, 0);
  const int64_t before = fe.runner->tokens_processed();
  ASSERT_TRUE(fe.engine->Submit(Greedy("b", prompt, 4), c.Callbacks()).ok());
  ASSERT_TRUE(c.WaitFor(2));
  // 40 of the 41 prompt tokens are cached (page-aligned, the last one is recomputed).
  EXPECT_EQ(c.result("b").cached_tokens, 40);
  EXPECT_EQ(c.result("b").output_ids, c.result("a").output_ids);
  EXPECT_EQ(fe.runner->tokens_processed() - before, 1 + 3);
  ExpectNoLeak(*fe.engine);
}

TEST(EngineTest, KvExhaustionUnderLoadFinishesEveryRequest) {
  FakeRunnerOptions fo;
  fo.page_size = 4;
  fo.num_kv_slots = 320;  // 80 pages; the load below needs ~10x that at once
  EngineOptions eo;
  eo.scheduler.chunked_prefill_size = 64;
  Collector c;
  FakeEngine fe = MakeFakeEngine(fo, eo);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 48; ++i) {
    prompts.push_back(Prompt(10 + i % 30, 1000 + i));
    ASSERT_TRUE(
        fe.engine->Submit(Greedy(absl::StrCat("r", i), prompts[i], 60), c.Callbacks()).ok());
  }
  ASSERT_TRUE(c.WaitFor(prompts.size()));
  for (int i = 0; i < 48; ++i) {
    const GenerateResult r = c.result(absl::StrCat("r", i));
    EXPECT_EQ(r.finish_reason.kind, FinishKind::kLength) << r.finish_reason.message;
    EXPECT_EQ(r.output_ids, ReferenceGreedy(fo, prompts[i], 60)) << i;
  }
  EXPECT_GT(fe.engine->GetServerInfo().scheduler.num_retractions, 0);
  ExpectNoLeak(*fe.engine);
}

TEST(EngineTest, TenThousandShortRequestsLeaveNoLeak) {
  FakeRunnerOptions fo;
  fo.page_size = 2;
  fo.num_kv_slots = 2048;
  EngineOptions eo;
  eo.scheduler.max_running_requests = 128;
  Collector c;
  FakeEngine fe = MakeFakeEngine(fo, eo);
  const int n = 10000;
  for (int i = 0; i < n; ++i) {
    GenerateRequest r = Greedy(absl::StrCat("r", i), Prompt(2 + i % 7, i % 500), i % 5);
    if (i % 3 == 0) {
      r.sampling.temperature = 1.0;
      r.sampling.seed = i;
    }
    if (i % 7 == 0) {
      r.return_logprob = true;
      r.logprob_start_len = 0;
    }
    ASSERT_TRUE(fe.engine->Submit(std::move(r), c.Callbacks()).ok());
    if (i % 1000 == 999) fe.engine->AbortAsync(absl::StrCat("r", i - 3));
  }
  ASSERT_TRUE(c.WaitFor(n));
  ExpectNoLeak(*fe.engine);
  ASSERT_TRUE(fe.engine->FlushCache().ok());
  const ServerInfo info = fe.engine->GetServerInfo();
  EXPECT_EQ(info.scheduler.available_kv_tokens, info.scheduler.total_kv_tokens);
  EXPECT_EQ(info.scheduler.num_finished, n);
}

TEST(EngineTest, PrefillOnlyRequestsMixedWithDecodingLeakNothing) {
  FakeRunnerOptions fo;
  fo.page_size = 4;
  EngineOptions eo;
  eo.scheduler.max_running_requests = 6;  // a leaked row would soon block everything
  Collector c;
  FakeEngine fe = MakeFakeEngine(fo, eo);
  std::vector<std::vector<int32_t>> long_prompts;
  for (int i = 0; i < 4; ++i) {
    long_prompts.push_back(Prompt(9, 50 + i));
    ASSERT_TRUE(
        fe.engine->Submit(Greedy(absl::StrCat("d", i), long_prompts[i], 200), c.Callbacks()).ok());
  }
  ASSERT_TRUE(c.WaitForTokens("d0", 3));
  const int num_prefill_only = 300;
  for (int i = 0; i < num_prefill_only; ++i) {
    GenerateRequest r = Greedy(absl::StrCat("p", i), Prompt(3 + i % 11, 7000 + i), 0);
    r.return_logprob = true;
    r.logprob_start_len = i % 3;
    ASSERT_TRUE(fe.engine->Submit(std::move(r), c.Callbacks()).ok());
  }
  ASSERT_TRUE(c.WaitFor(4 + num_prefill_only));
  for (int i = 0; i < num_prefill_only; ++i) {
    const GenerateResult r = c.result(absl::StrCat("p", i));
    EXPECT_EQ(r.finish_reason.kind, FinishKind::kLength);
    EXPECT_TRUE(r.output_ids.empty());
    EXPECT_EQ(r.prompt_logprobs.size(), static_cast<size_t>(r.prompt_tokens - std::max(i % 3, 1)));
  }
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(c.result(absl::StrCat("d", i)).output_ids, ReferenceGreedy(fo, long_prompts[i], 200));
  }
  ExpectNoLeak(*fe.engine);
}

TEST(EngineTest, PromptLogprobsMatchLogSoftmax) {
  FakeRunnerOptions fo;
  fo.page_size = 4;
  EngineOptions eo;
  eo.scheduler.chunked_prefill_size = 8;
  Collector c;
  FakeEngine fe = MakeFakeEngine(fo, eo);
  const std::vector<int32_t> prompt = Prompt(30, 3);
  const std::vector<uint64_t> h = Hashes(prompt);
  // Cache the prompt first: prompt logprobs must still be computed, not skipped.
  ASSERT_TRUE(fe.engine->Submit(Greedy("warm", prompt, 2), c.Callbacks()).ok());
  ASSERT_TRUE(c.WaitFor(1));
  size_t expected = 1;
  for (int32_t start : {0, 1, 13, 29, 30}) {
    GenerateRequest r = Greedy(absl::StrCat("s", start), prompt, 1);
    r.sampling.temperature = 0.5;
    r.sampling.seed = 1;
    r.return_logprob = true;
    r.logprob_start_len = start;
    r.top_logprobs_num = 3;
    ASSERT_TRUE(fe.engine->Submit(std::move(r), c.Callbacks()).ok());
    ASSERT_TRUE(c.WaitFor(++expected));
    const GenerateResult res = c.result(absl::StrCat("s", start));
    const int32_t first = std::max(start, 1);
    EXPECT_EQ(res.prompt_logprob_start, first);
    ASSERT_EQ(res.prompt_logprobs.size(), static_cast<size_t>(30 - first)) << start;
    for (size_t i = 0; i < res.prompt_logprobs.size(); ++i) {
      const int32_t pos = first + static_cast<int32_t>(i);
      EXPECT_EQ(res.prompt_logprobs[i].token_id, prompt[pos]);
      EXPECT_NEAR(res.prompt_logprobs[i].logprob, RefLogprob(fo, h[pos - 1], prompt[pos], 0.5),
                  1e-9);
      EXPECT_EQ(res.prompt_logprobs[i].top.size(), 3u);
    }
  }
  ExpectNoLeak(*fe.engine);
}

TEST(EngineTest, OutputLogprobsAreTemperatureScaledBeforeTruncation) {
  FakeRunnerOptions fo;
  Collector c;
  FakeEngine fe = MakeFakeEngine(fo);
  const std::vector<int32_t> prompt = Prompt(7, 11);
  struct Case {
    std::string id;
    double temperature;
    bool at_one;
    double expect_t;
  };
  const std::vector<Case> cases = {
      {"t07", 0.7, false, 0.7}, {"t07_at_one", 0.7, true, 1.0}, {"greedy", 0.0, false, 1.0}};
  for (const Case& k : cases) {
    GenerateRequest r = Greedy(k.id, prompt, 12);
    r.sampling.temperature = k.temperature;
    r.sampling.top_k = 5;
    r.sampling.top_p = 0.8;
    r.sampling.seed = 123;
    r.return_logprob = true;
    r.top_logprobs_num = 4;
    r.logprobs_at_temperature_one = k.at_one;
    ASSERT_TRUE(fe.engine->Submit(std::move(r), c.Callbacks()).ok());
  }
  ASSERT_TRUE(c.WaitFor(cases.size()));
  for (const Case& k : cases) {
    const GenerateResult r = c.result(k.id);
    ASSERT_EQ(r.output_logprobs.size(), r.output_ids.size());
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), r.output_ids.begin(), r.output_ids.end());
    const std::vector<uint64_t> h = Hashes(all);
    for (size_t i = 0; i < r.output_ids.size(); ++i) {
      const TokenLogprob& lp = r.output_logprobs[i];
      EXPECT_EQ(lp.token_id, r.output_ids[i]);
      EXPECT_NEAR(lp.logprob, RefLogprob(fo, h[prompt.size() - 1 + i], lp.token_id, k.expect_t),
                  1e-9)
          << k.id << " " << i;
      ASSERT_EQ(lp.top.size(), 4u);
      EXPECT_GE(lp.top[0].logprob, lp.top[3].logprob);
      EXPECT_GE(lp.top[0].logprob, lp.logprob);
    }
  }
  // Both 0.7 requests share the seed, so they sampled the same tokens.
  EXPECT_EQ(c.result("t07").output_ids, c.result("t07_at_one").output_ids);
}

TEST(EngineTest, SeededSamplingDoesNotDependOnTheBatch) {
  FakeRunnerOptions fo;
  auto make = [](const std::string& id, uint64_t seed) {
    GenerateRequest r = Greedy(id, Prompt(12, 77), 40);
    r.sampling.temperature = 1.0;
    r.sampling.top_k = 20;
    r.sampling.top_p = 0.95;
    r.sampling.min_p = 0.01;
    r.sampling.repetition_penalty = 1.1;
    r.sampling.frequency_penalty = 0.2;
    r.sampling.presence_penalty = 0.1;
    r.sampling.seed = seed;
    return r;
  };
  std::vector<int32_t> alone;
  {
    Collector c;
    FakeEngine fe = MakeFakeEngine(fo);
    ASSERT_TRUE(fe.engine->Submit(make("x", 42), c.Callbacks()).ok());
    ASSERT_TRUE(c.WaitFor(1));
    alone = c.result("x").output_ids;
  }
  FakeRunnerOptions fo4 = fo;
  fo4.page_size = 4;
  EngineOptions eo;
  eo.scheduler.chunked_prefill_size = 5;
  Collector c;
  FakeEngine fe = MakeFakeEngine(fo4, eo);
  for (int i = 0; i < 30; ++i) {
    GenerateRequest other = make(absl::StrCat("o", i), 1000 + i);
    other.input_ids = Prompt(3 + i, i);
    ASSERT_TRUE(fe.engine->Submit(std::move(other), c.Callbacks()).ok());
    if (i == 17) ASSERT_TRUE(fe.engine->Submit(make("x", 42), c.Callbacks()).ok());
  }
  ASSERT_TRUE(fe.engine->Submit(make("y", 43), c.Callbacks()).ok());
  ASSERT_TRUE(c.WaitFor(32));
  EXPECT_EQ(c.result("x").output_ids, alone);
  EXPECT_NE(c.result("y").output_ids, alone);
}

TEST(EngineTest, NGreaterThanOneForksThePromptKv) {
  FakeRunnerOptions fo;
  fo.page_size = 4;
  Collector c;
  FakeEngine fe = MakeFakeEngine(fo);
  const std::vector<int32_t> prompt = Prompt(45, 9);
  GenerateRequest r = Greedy("n", prompt, 16);
  r.sampling.temperature = 1.0;
  r.sampling.seed = 5;
  r.sampling.n = 4;
  ASSERT_TRUE(fe.engine->Submit(r, c.Callbacks()).ok());
  ASSERT_TRUE(c.WaitFor(4));
  std::set<std::vector<int32_t>> distinct;
  for (int i = 0; i < 4; ++i) {
    const GenerateResult res = c.result(Key("n", i));
    EXPECT_EQ(res.index, i);
    EXPECT_EQ(res.output_ids.size(), 16u);
    distinct.insert(res.output_ids);
    if (i > 0) EXPECT_EQ(res.cached_tokens, 44) << i;
  }
  EXPECT_EQ(distinct.size(), 4u);
  // The prompt ran once (45) plus one recomputed token per fork (3) plus 4 x 15 decode steps.
  EXPECT_EQ(fe.runner->tokens_processed(), 45 + 3 + 4 * 15);
  // Completion 0 is what n = 1 with the same seed gives.
  r.id = "single";
  r.sampling.n = 1;
  ASSERT_TRUE(fe.engine->Submit(r, c.Callbacks()).ok());
  ASSERT_TRUE(c.WaitFor(5));
  EXPECT_EQ(c.result("single").output_ids, c.result("n").output_ids);
  // Aborting a request aborts all of its completions.
  r.id = "m";
  r.sampling.n = 3;
  r.sampling.max_new_tokens = 400;
  const int64_t base = fe.runner->steps_done();
  fe.runner->SetStepBudget(3);
  ASSERT_TRUE(fe.engine->Submit(r, c.Callbacks()).ok());
  fe.runner->WaitForSteps(base + 3);
  auto aborted = std::async(std::launch::async, [&] { return fe.engine->Abort("m"); });
  while (aborted.wait_for(std::chrono::milliseconds(2)) != std::future_status::ready) {
    fe.runner->AllowSteps(1);
  }
  ASSERT_TRUE(aborted.get().ok());
  fe.runner->SetStepBudget(-1);
  ASSERT_TRUE(c.WaitFor(8));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(c.result(Key("m", i)).finish_reason.kind, FinishKind::kAbort);
  }
  ExpectNoLeak(*fe.engine);
}

TEST(EngineTest, StopStringsStopTokensAndEos) {
  FakeRunnerOptions fo;
  Collector c;
  FakeEngine fe = MakeFakeEngine(fo, {}, std::make_unique<CharDecoder>());
  const std::vector<int32_t> prompt = Prompt(6, 21);
  const std::vector<int32_t> ref = ReferenceGreedy(fo, prompt, 30);
  CharDecoder dec;
  const std::string text = dec.Decode(ref);

  // A stop string ending at output token 8 (the first occurrence of that text).
  const std::string stop = text.substr(6, 3);
  const size_t first = text.find(stop);
  GenerateRequest r = Greedy("stop", prompt, 30);
  r.sampling.stop = {"zzzzzzzzzz", stop};
  ASSERT_TRUE(fe.engine->Submit(r, c.Callbacks()).ok());

  // A stop token id: the first occurrence of ref[5].
  r = Greedy("stop_id", prompt, 30);
  r.sampling.stop_token_ids = {ref[5]};
  const size_t first_id = std::find(ref.begin(), ref.end(), ref[5]) - ref.begin();
  ASSERT_TRUE(fe.engine->Submit(r, c.Callbacks()).ok());

  // min_new_tokens masks the stop token id until it is reached.
  r = Greedy("min_new", prompt, 30);
  r.sampling.stop_token_ids = {ref[0]};
  r.sampling.min_new_tokens = 3;
  ASSERT_TRUE(fe.engine->Submit(r, c.Callbacks()).ok());

  ASSERT_TRUE(c.WaitFor(3));
  GenerateResult s = c.result("stop");
  EXPECT_EQ(s.finish_reason.kind, FinishKind::kStop);
  EXPECT_EQ(s.finish_reason.matched_stop, stop);
  EXPECT_EQ(s.finish_reason.matched_token_id, -1);
  EXPECT_EQ(s.output_ids, std::vector<int32_t>(ref.begin(), ref.begin() + first + 3));

  s = c.result("stop_id");
  EXPECT_EQ(s.finish_reason.kind, FinishKind::kStop);
  EXPECT_EQ(s.finish_reason.matched_token_id, ref[5]);
  EXPECT_EQ(s.output_ids, std::vector<int32_t>(ref.begin(), ref.begin() + first_id + 1));

  s = c.result("min_new");
  EXPECT_GE(s.output_ids.size(), 3u);
  EXPECT_NE(s.output_ids[0], ref[0]);
}

TEST(EngineTest, EosStopsUnlessIgnored) {
  FakeRunnerOptions fo;
  fo.eos_bias = 2.5;  // EOS is likely but not certain at each step
  Collector c;
  FakeEngine fe = MakeFakeEngine(fo);
  const std::vector<int32_t> prompt = Prompt(5, 4);
  const std::vector<int32_t> ref = ReferenceGreedy(fo, prompt, 50);
  ASSERT_EQ(ref.back(), 2) << "the fake should produce EOS within 50 tokens";
  ASSERT_TRUE(fe.engine->Submit(Greedy("eos", prompt, 50), c.Callbacks()).ok());
  GenerateRequest r = Greedy("ignore", prompt, 50);
  r.sampling.ignore_eos = true;
  ASSERT_TRUE(fe.engine->Submit(r, c.Callbacks()).ok());
  ASSERT_TRUE(c.WaitFor(2));
  EXPECT_EQ(c.result("eos").output_ids, ref);
  EXPECT_EQ(c.result("eos").finish_reason.kind, FinishKind::kStop);
  EXPECT_EQ(c.result("eos").finish_reason.matched_token_id, 2);
  EXPECT_EQ(c.result("ignore").output_ids, ReferenceGreedy(fo, prompt, 50, /*ignore_eos=*/true));
  EXPECT_EQ(c.result("ignore").finish_reason.kind, FinishKind::kLength);
}

TEST(EngineTest, SubmitRejectsBadRequestsWithoutCallbacks) {
  Collector c;
  FakeEngine fe = MakeFakeEngine();
  GenerateRequest r = Greedy("bad", {1, 2, 64}, 4);
  EXPECT_EQ(fe.engine->Submit(r, c.Callbacks()).code(), absl::StatusCode::kInvalidArgument);
  r = Greedy("long", Prompt(10, 1), 2040);
  EXPECT_EQ(fe.engine->Submit(r, c.Callbacks()).code(), absl::StatusCode::kResourceExhausted);
  r = Greedy("stop", Prompt(10, 1), 4);
  r.sampling.stop = {"x"};  // no decoder
  EXPECT_EQ(fe.engine->Submit(r, c.Callbacks()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fe.engine->Submit(Greedy("x", Prompt(3, 1), 4), {}).code(),
            absl::StatusCode::kInvalidArgument);
  fe.runner->SetStepBudget(0);
  ASSERT_TRUE(fe.engine->Submit(Greedy("dup", Prompt(3, 1), 4), c.Callbacks()).ok());
  EXPECT_EQ(fe.engine->Submit(Greedy("dup", Prompt(3, 1), 4), c.Callbacks()).code(),
            absl::StatusCode::kAlreadyExists);
  fe.runner->SetStepBudget(-1);
  ASSERT_TRUE(c.WaitFor(1));
  EXPECT_EQ(c.num_finished(), 1u);
  // Once finished the id can be reused.
  EXPECT_TRUE(fe.engine->Submit(Greedy("dup", Prompt(3, 1), 4), c.Callbacks()).ok());
  ASSERT_TRUE(c.WaitFor(1));
}

TEST(EngineTest, AbortedOutputIsAPrefixOfTheFullOne) {
  FakeRunnerOptions fo;
  Collector c;
  FakeEngine fe = MakeFakeEngine(fo);
  const std::vector<int32_t> prompt = Prompt(8, 31);
  fe.runner->SetStepBudget(10);
  ASSERT_TRUE(fe.engine->Submit(Greedy("a", prompt, 100), c.Callbacks()).ok());
  fe.runner->WaitForSteps(10);
  auto aborted = std::async(std::launch::async, [&] { return fe.engine->Abort("a", "stop it"); });
  while (aborted.wait_for(std::chrono::milliseconds(2)) != std::future_status::ready) {
    fe.runner->AllowSteps(1);
  }
  ASSERT_TRUE(aborted.get().ok());
  ASSERT_TRUE(c.WaitFor(1));
  const GenerateResult r = c.result("a");
  EXPECT_EQ(r.finish_reason.kind, FinishKind::kAbort);
  EXPECT_EQ(r.finish_reason.message, "stop it");
  const std::vector<int32_t> ref = ReferenceGreedy(fo, prompt, 100);
  ASSERT_GE(r.output_ids.size(), 9u);
  ASSERT_LT(r.output_ids.size(), ref.size());
  EXPECT_EQ(r.output_ids, std::vector<int32_t>(ref.begin(), ref.begin() + r.output_ids.size()));
  EXPECT_EQ(*fe.engine->Abort("a"), 0);
  EXPECT_EQ(*fe.engine->Abort("unknown"), 0);
  fe.runner->SetStepBudget(-1);
  ExpectNoLeak(*fe.engine);
}

TEST(EngineTest, ForwardFailureAbortsTheBatchAndTheEngineGoesOn) {
  FakeRunnerOptions fo;
  Collector c;
  FakeEngine fe = MakeFakeEngine(fo);
  ASSERT_TRUE(fe.engine->Pause(PauseMode::kInPlace).ok());  // both start in the same step
  ASSERT_TRUE(fe.engine->Submit(Greedy("a", Prompt(6, 1), 10), c.Callbacks()).ok());
  ASSERT_TRUE(fe.engine->Submit(Greedy("b", Prompt(6, 2), 10), c.Callbacks()).ok());
  fe.runner->FailNextForward();
  ASSERT_TRUE(fe.engine->Continue().ok());
  ASSERT_TRUE(c.WaitFor(2));
  for (const char* id : {"a", "b"}) {
    EXPECT_EQ(c.result(id).finish_reason.kind, FinishKind::kAbort);
    EXPECT_NE(c.result(id).finish_reason.message.find("injected"), std::string::npos);
  }
  ASSERT_TRUE(fe.engine->Submit(Greedy("c", Prompt(6, 3), 10), c.Callbacks()).ok());
  ASSERT_TRUE(c.WaitFor(3));
  EXPECT_EQ(c.result("c").output_ids, ReferenceGreedy(fo, Prompt(6, 3), 10));
  ExpectNoLeak(*fe.engine);
}

TEST(EngineTest, ShutdownFinishesInFlightRequests) {
  Collector c;
  {
    FakeEngine fe = MakeFakeEngine();
    fe.runner->SetStepBudget(2);
    ASSERT_TRUE(fe.engine->Submit(Greedy("a", Prompt(6, 1), 100), c.Callbacks()).ok());
    ASSERT_TRUE(PauseGated(*fe.engine, *fe.runner, PauseMode::kInPlace).ok());
    ASSERT_TRUE(fe.engine->Submit(Greedy("b", Prompt(6, 2), 100), c.Callbacks()).ok());
    fe.runner->SetStepBudget(-1);
  }
  ASSERT_EQ(c.num_finished(), 2u);
  EXPECT_EQ(c.result("a").finish_reason.kind, FinishKind::kAbort);
  EXPECT_EQ(c.result("b").finish_reason.kind, FinishKind::kAbort);
}

TEST(EngineTest, WeightVersionNamespacesThePrefixCache) {
  FakeRunnerOptions fo;
  Collector c;
  FakeEngine fe = MakeFakeEngine(fo);
  const std::vector<int32_t> prompt = Prompt(20, 8);
  ASSERT_TRUE(fe.engine->Submit(Greedy("a", prompt, 3), c.Callbacks()).ok());
  ASSERT_TRUE(c.WaitFor(1));
  EXPECT_EQ(c.result("a").weight_version, 0);
  ASSERT_TRUE(fe.engine->SetWeightVersion(7).ok());
  EXPECT_EQ(fe.engine->weight_version(), 7);
  ASSERT_TRUE(fe.engine->Submit(Greedy("b", prompt, 3), c.Callbacks()).ok());
  ASSERT_TRUE(c.WaitFor(2));
  EXPECT_EQ(c.result("b").cached_tokens, 0);
  EXPECT_EQ(c.result("b").weight_version, 7);
  ASSERT_TRUE(fe.engine->Submit(Greedy("c", prompt, 3), c.Callbacks()).ok());
  ASSERT_TRUE(c.WaitFor(3));
  EXPECT_EQ(c.result("c").cached_tokens, 19);
  ExpectNoLeak(*fe.engine);
}

TEST(EngineTest, WeightUpdateRunsOnTheEngineThread) {
  FakeRunnerOptions fo;
  Collector c;
  FakeEngine fe = MakeFakeEngine(fo);
  const std::vector<int32_t> prompt = Prompt(10, 12);
  fe.runner->SetStepBudget(5);
  ASSERT_TRUE(fe.engine->Submit(Greedy("a", prompt, 50), c.Callbacks()).ok());
  fe.runner->WaitForSteps(5);
  ASSERT_TRUE(PauseGated(*fe.engine, *fe.runner, PauseMode::kRetract).ok());
  fe.runner->SetStepBudget(-1);
  // pause → swap → flush → bump version → resume, as the weight-update service does.
  absl::Status s = fe.engine->RunOnEngineThread([&](EngineContext& ctx) -> absl::Status {
    if (ctx.has_running() || !ctx.has_waiting()) return absl::InternalError("not retracted");
    RETURN_IF_ERROR(ctx.ReplaceRunner(std::make_unique<FakeRunner>(fo)));
    RETURN_IF_ERROR(ctx.FlushCache());
    ctx.set_weight_version(ctx.weight_version() + 1);
    ctx.Continue();
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_TRUE(c.WaitFor(1));
  EXPECT_EQ(c.result("a").output_ids, ReferenceGreedy(fo, prompt, 50));
  EXPECT_EQ(c.result("a").weight_version, 1);
  EXPECT_GE(c.result("a").num_retractions, 1);
  // A blocking call from the engine thread is refused instead of deadlocking.
  absl::Status inner;
  absl::Notification inner_done;  // the callback's result, published after it is written
  RequestCallbacks cb;
  cb.on_finish = [&](GenerateResult) {
    inner = fe.engine->Pause(PauseMode::kInPlace);
    inner_done.Notify();
  };
  ASSERT_TRUE(fe.engine->Submit(Greedy("cb", prompt, 1), cb).ok());
  ASSERT_TRUE(fe.engine->RunOnEngineThread([](EngineContext&) { return absl::OkStatus(); }).ok());
  ASSERT_TRUE(inner_done.WaitForNotificationWithTimeout(absl::Seconds(60)));
  EXPECT_EQ(inner.code(), absl::StatusCode::kFailedPrecondition);
  ExpectNoLeak(*fe.engine);
}

}  // namespace
}  // namespace rl::engine::testing
