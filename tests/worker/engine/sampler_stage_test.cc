// The sampling stage of an engine step (Sampler::Sample on a whole ScheduledBatch), tested
// directly: which entries get a token, logprobs, prompt logprobs, EOS masking, the shape check
// and the routing hand-over. It only reads the sequences.
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "services/worker/engine/sampler.h"

namespace rl::engine {
namespace {

constexpr int64_t kVocab = 6;

struct Fixture {
  std::vector<std::unique_ptr<Sequence>> seqs;
  ScheduledBatch batch;
  model::ForwardOutput out;

  Fixture() {
    out.vocab_size = kVocab;
    out.row_begin = {0};
  }
  // A sequence with `prompt` tokens (+ `output` generated), `count` tokens processed this step
  // from `start`, and the given logits rows (one per row the mode asks for).
  Sequence* Add(GenerateRequest r, int32_t prompt, int32_t output, int64_t start, int64_t count,
                model::LogitsMode mode, const std::vector<std::vector<float>>& rows) {
    auto group = std::make_shared<RequestGroup>();
    r.input_ids.assign(prompt, 1);
    group->request = std::move(r);
    auto seq = std::make_unique<Sequence>();
    seq->group = group;
    seq->prompt_len = prompt;
    seq->tokens.assign(prompt + output, 1);
    seq->prompt_logprobs_done =
        !(group->request.return_logprob && group->request.logprob_start_len >= 0);
    batch.entries.push_back(BatchEntry{seq.get(), start, count, mode});
    batch.input.seqs.emplace_back();
    for (const auto& row : rows) out.logits.insert(out.logits.end(), row.begin(), row.end());
    out.row_begin.push_back(out.row_begin.back() + static_cast<int64_t>(rows.size()));
    seqs.push_back(std::move(seq));
    return seqs.back().get();
  }
};

GenerateRequest Greedy() {
  GenerateRequest r;
  r.id = "r";
  r.sampling.temperature = 0;
  r.sampling.max_new_tokens = 8;
  return r;
}

TEST(SamplerStageTest, SamplesOnlyEntriesThatFinishedTheirPrefill) {
  Fixture f;
  // Decode step: 4 prompt + 1 output, the last token computed now.
  f.Add(Greedy(), 4, 1, 4, 1, model::LogitsMode::kLast, {{0, 0, 0, 5, 0, 0}});
  // A middle prefill chunk: no logits, nothing sampled.
  f.Add(Greedy(), 10, 0, 0, 4, model::LogitsMode::kNone, {});
  // The last prefill chunk: sampled.
  f.Add(Greedy(), 10, 0, 4, 6, model::LogitsMode::kLast, {{0, 7, 0, 0, 0, 0}});
  Sampler s(SamplerOptions{kVocab, {}});
  SampledBatch sampled;
  ASSERT_TRUE(s.Sample(f.batch, &f.out, &sampled).ok());
  ASSERT_EQ(sampled.entries.size(), 3u);
  EXPECT_EQ(sampled.entries[0].token, 3);
  EXPECT_EQ(sampled.entries[1].token, -1);
  EXPECT_EQ(sampled.entries[2].token, 1);
  EXPECT_FALSE(sampled.entries[0].logprob.has_value());  // return_logprob off
  // The sequences are only read.
  EXPECT_EQ(f.seqs[0]->tokens.size(), 5u);
}

TEST(SamplerStageTest, NoTokenAtMaxNewTokens) {
  Fixture f;
  GenerateRequest r = Greedy();
  r.sampling.max_new_tokens = 1;
  f.Add(r, 4, 1, 4, 1, model::LogitsMode::kLast, {{0, 0, 0, 5, 0, 0}});
  Sampler s(SamplerOptions{kVocab, {}});
  SampledBatch sampled;
  ASSERT_TRUE(s.Sample(f.batch, &f.out, &sampled).ok());
  EXPECT_EQ(sampled.entries[0].token, -1);
}

TEST(SamplerStageTest, MasksEosBeforeMinNewTokens) {
  Fixture f;
  GenerateRequest r = Greedy();
  r.sampling.min_new_tokens = 2;
  f.Add(r, 4, 0, 0, 4, model::LogitsMode::kLast, {{0, 0, 9, 5, 0, 0}});
  GenerateRequest late = Greedy();
  late.sampling.min_new_tokens = 2;
  f.Add(late, 4, 2, 5, 1, model::LogitsMode::kLast, {{0, 0, 9, 5, 0, 0}});
  Sampler s(SamplerOptions{kVocab, {2}});  // EOS = 2
  SampledBatch sampled;
  ASSERT_TRUE(s.Sample(f.batch, &f.out, &sampled).ok());
  EXPECT_EQ(sampled.entries[0].token, 3);  // EOS masked
  EXPECT_EQ(sampled.entries[1].token, 2);  // min_new_tokens reached
}

TEST(SamplerStageTest, TokenAndPromptLogprobs) {
  Fixture f;
  GenerateRequest r = Greedy();
  r.return_logprob = true;
  r.logprob_start_len = 0;
  // The whole 3-token prompt in one step with every row: prompt logprobs of positions 1, 2.
  std::vector<std::vector<float>> rows = {
      {0, 1, 0, 0, 0, 0}, {0, 2, 0, 0, 0, 0}, {0, 0, 0, 0, 3, 0}};
  f.Add(r, 3, 0, 0, 3, model::LogitsMode::kAll, rows);
  Sampler s(SamplerOptions{kVocab, {}});
  SampledBatch sampled;
  ASSERT_TRUE(s.Sample(f.batch, &f.out, &sampled).ok());
  const SampledEntry& e = sampled.entries[0];
  EXPECT_EQ(e.token, 4);
  ASSERT_TRUE(e.logprob.has_value());
  Sampler ref;
  EXPECT_DOUBLE_EQ(e.logprob->logprob, ref.Logprob(rows[2].data(), kVocab, 1.0, 4, 0).logprob);
  ASSERT_EQ(e.prompt_logprobs.size(), 2u);  // the prompt is all token 1
  EXPECT_DOUBLE_EQ(e.prompt_logprobs[0].logprob,
                   ref.Logprob(rows[0].data(), kVocab, 1.0, 1, 0).logprob);
  EXPECT_DOUBLE_EQ(e.prompt_logprobs[1].logprob,
                   ref.Logprob(rows[1].data(), kVocab, 1.0, 1, 0).logprob);
}

TEST(SamplerStageTest, WrongLogitsShapeIsInternal) {
  Fixture f;
  f.Add(Greedy(), 4, 1, 4, 1, model::LogitsMode::kLast, {{0, 0, 0, 5, 0, 0}});
  f.out.row_begin.back() = 0;  // the runner "forgot" the row
  f.out.logits.clear();
  Sampler s(SamplerOptions{kVocab, {}});
  SampledBatch sampled;
  absl::Status st = s.Sample(f.batch, &f.out, &sampled);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_NE(st.message().find("wrong shape"), std::string::npos);

  Fixture g;
  g.Add(Greedy(), 4, 1, 4, 1, model::LogitsMode::kLast, {{0, 0, 0, 5, 0, 0}});
  g.out.vocab_size = kVocab + 1;
  EXPECT_EQ(s.Sample(g.batch, &g.out, &sampled).code(), absl::StatusCode::kInternal);
}

TEST(SamplerStageTest, RoutingMovesToTheSampledBatch) {
  Fixture f;
  f.Add(Greedy(), 4, 1, 4, 1, model::LogitsMode::kLast, {{0, 0, 0, 5, 0, 0}});
  f.out.routed_experts = {3, 1};
  f.out.routed_weights = {0.75f, 0.25f};
  Sampler s(SamplerOptions{kVocab, {}});
  SampledBatch sampled;
  ASSERT_TRUE(s.Sample(f.batch, &f.out, &sampled).ok());
  EXPECT_EQ(sampled.routed_experts, (std::vector<int32_t>{3, 1}));
  EXPECT_EQ(sampled.routed_weights, (std::vector<float>{0.75f, 0.25f}));
}

}  // namespace
}  // namespace rl::engine
