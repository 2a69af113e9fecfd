// OutputProcessor on its own: appending and streaming a token, the stop conditions (EOS, stop
// ids, min_new_tokens, stop strings across tokens, max_new_tokens), R3 routing and the final
// result it delivers.
#include "services/worker/engine/output_processor.h"

#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace rl::engine {
namespace {

// Token t decodes to the letter 'a' + t % 26.
class LetterDecoder final : public TextDecoder {
 public:
  std::string Decode(absl::Span<const int32_t> ids) const override {
    std::string s;
    for (int32_t id : ids) s += static_cast<char>('a' + id % 26);
    return s;
  }
};

struct Harness {
  std::shared_ptr<RequestGroup> group = std::make_shared<RequestGroup>();
  std::vector<OutputChunk> chunks;
  std::vector<GenerateResult> results;
  std::unique_ptr<Sequence> seq;

  explicit Harness(SamplingParams p, int32_t prompt_len = 3) {
    group->request.id = "r";
    group->request.sampling = std::move(p);
    group->request.input_ids.assign(prompt_len, 0);
    group->submit_us = 100;
    group->callbacks.on_output = [this](const OutputChunk& c) { chunks.push_back(c); };
    group->callbacks.on_finish = [this](GenerateResult r) { results.push_back(std::move(r)); };
    seq = std::make_unique<Sequence>();
    seq->group = group;
    seq->prompt_len = prompt_len;
    seq->tokens = group->request.input_ids;
  }
};

SampledEntry Token(int32_t t) {
  SampledEntry e;
  e.token = t;
  return e;
}

TEST(OutputProcessorTest, AppendStreamsTheTokenAndTracksVersions) {
  SamplingParams p;
  p.max_new_tokens = 10;
  Harness h(p);
  h.group->request.return_logprob = true;
  OutputProcessor out(OutputProcessorOptions{{99}}, nullptr);
  SampledEntry e = Token(5);
  e.logprob = TokenLogprob{5, -0.5, {}};
  EXPECT_FALSE(out.Append(h.seq.get(), &e, /*weight_version=*/3, /*now_us=*/150).has_value());
  SampledEntry f = Token(5);
  f.logprob = TokenLogprob{5, -0.25, {}};
  EXPECT_FALSE(out.Append(h.seq.get(), &f, 4, 160).has_value());
  ASSERT_EQ(h.chunks.size(), 2u);
  EXPECT_EQ(h.chunks[0].token_ids, std::vector<int32_t>{5});
  ASSERT_EQ(h.chunks[1].logprobs.size(), 1u);
  EXPECT_DOUBLE_EQ(h.chunks[1].logprobs[0].logprob, -0.25);
  EXPECT_EQ(h.seq->output_len(), 2);
  EXPECT_EQ(h.seq->output_counts[5], 2);
  EXPECT_EQ(h.seq->version_segments,
            (std::vector<VersionSegment>{VersionSegment{3, 1}, VersionSegment{4, 1}}));
  EXPECT_EQ(h.seq->first_token_us, 150);
  EXPECT_EQ(out.generated_tokens(), 2);

  out.Finish(h.seq.get(), FinishReason{FinishKind::kLength, -1, "", ""}, 4, 200);
  ASSERT_EQ(h.results.size(), 1u);
  const GenerateResult& r = h.results[0];
  EXPECT_EQ(r.output_ids, (std::vector<int32_t>{5, 5}));
  EXPECT_EQ(r.output_logprobs.size(), 2u);
  EXPECT_EQ(r.completion_tokens, 2);
  EXPECT_EQ(r.prompt_tokens, 3);
  EXPECT_EQ(r.weight_version, 4);
  EXPECT_EQ(r.weight_version_segments.size(), 2u);
  EXPECT_EQ(r.timings.ttft_us, 50);
  EXPECT_EQ(r.timings.total_us, 100);
  EXPECT_EQ(out.num_finished(), 1);
  EXPECT_EQ(out.num_aborted(), 0);
}

TEST(OutputProcessorTest, EosAndStopIdsStopOnlyAfterMinNewTokens) {
  SamplingParams p;
  p.min_new_tokens = 2;
  p.stop_token_ids = {7};
  Harness h(p);
  OutputProcessor out(OutputProcessorOptions{{99}}, nullptr);
  SampledEntry a = Token(99);
  EXPECT_FALSE(out.Append(h.seq.get(), &a, 0, 0).has_value());  // 1 < min_new_tokens
  SampledEntry b = Token(7);
  std::optional<FinishReason> stop = out.Append(h.seq.get(), &b, 0, 0);
  ASSERT_TRUE(stop.has_value());
  EXPECT_EQ(stop->kind, FinishKind::kStop);
  EXPECT_EQ(stop->matched_token_id, 7);
  // EOS is ignored with ignore_eos; stop ids are not.
  SamplingParams q;
  q.ignore_eos = true;
  q.max_new_tokens = 2;
  Harness g(q);
  SampledEntry c = Token(99);
  EXPECT_FALSE(out.Append(g.seq.get(), &c, 0, 0).has_value());
  SampledEntry d = Token(1);
  stop = out.Append(g.seq.get(), &d, 0, 0);
  ASSERT_TRUE(stop.has_value());
  EXPECT_EQ(stop->kind, FinishKind::kLength);
}

TEST(OutputProcessorTest, StopStringsMatchAcrossTokens) {
  SamplingParams p;
  p.stop = {"zzz", "cd"};
  Harness h(p);
  LetterDecoder decoder;
  OutputProcessor out(OutputProcessorOptions{{}}, &decoder);
  SampledEntry a = Token(2);  // "c"
  EXPECT_FALSE(out.Append(h.seq.get(), &a, 0, 0).has_value());
  SampledEntry b = Token(3);  // "cd"
  std::optional<FinishReason> stop = out.Append(h.seq.get(), &b, 0, 0);
  ASSERT_TRUE(stop.has_value());
  EXPECT_EQ(stop->kind, FinishKind::kStop);
  EXPECT_EQ(stop->matched_token_id, -1);
  EXPECT_EQ(stop->matched_stop, "cd");
  // Without a decoder stop strings never match.
  Harness g(p);
  OutputProcessor blind(OutputProcessorOptions{{}}, nullptr);
  SampledEntry c = Token(2), d = Token(3);
  EXPECT_FALSE(blind.Append(g.seq.get(), &c, 0, 0).has_value());
  EXPECT_FALSE(blind.Append(g.seq.get(), &d, 0, 0).has_value());
}

// A decoder with cross-token state: a token's letter is held back until the next token (like
// a character split across tokens), and Decode must not be called once per step.
class HoldingDecoder final : public TextDecoder {
 public:
  std::string Decode(absl::Span<const int32_t> ids) const override {
    ++decode_calls;
    return std::string(ids.size(), '?');
  }
  std::unique_ptr<Stream> NewStream(absl::Span<const int32_t> prompt) const override {
    ++streams;
    EXPECT_EQ(prompt.size(), 3u);  // the prompt is the context
    struct Holding final : Stream {
      std::string Step(int32_t id) override {
        std::string out = held;
        held = std::string(1, static_cast<char>('a' + id % 26));
        return out;
      }
      std::string held;
    };
    return std::make_unique<Holding>();
  }
  mutable int decode_calls = 0;
  mutable int streams = 0;
};

TEST(OutputProcessorTest, StopStringsUseTheIncrementalTextOnly) {
  SamplingParams p;
  p.stop = {"bc"};
  Harness h(p);
  HoldingDecoder decoder;
  OutputProcessor out(OutputProcessorOptions{{}}, &decoder);
  // Text made final: "" after b, "b" after c, "bc" after d: the stop matches at token d.
  SampledEntry b = Token(1), c = Token(2), d = Token(3);
  EXPECT_FALSE(out.Append(h.seq.get(), &b, 0, 0).has_value());
  EXPECT_FALSE(out.Append(h.seq.get(), &c, 0, 0).has_value());
  std::optional<FinishReason> stop = out.Append(h.seq.get(), &d, 0, 0);
  ASSERT_TRUE(stop.has_value());
  EXPECT_EQ(stop->matched_stop, "bc");
  EXPECT_EQ(decoder.decode_calls, 0);
  EXPECT_EQ(decoder.streams, 1);
  EXPECT_LE(h.seq->stop_tail.size(), 1u);  // only what a stop string may still end in
}

TEST(OutputProcessorTest, StopStringMadeBeforeMinNewTokensMatchesWhenAllowed) {
  SamplingParams p;
  p.stop = {"ab"};
  p.min_new_tokens = 4;
  Harness h(p);
  LetterDecoder decoder;
  OutputProcessor out(OutputProcessorOptions{{}}, &decoder);
  const int32_t tokens[] = {0, 1, 5, 6};  // "ab" done at token 2, allowed from token 4
  for (int i = 0; i < 3; ++i) {
    SampledEntry e = Token(tokens[i]);
    EXPECT_FALSE(out.Append(h.seq.get(), &e, 0, 0).has_value()) << i;
  }
  SampledEntry last = Token(tokens[3]);
  std::optional<FinishReason> stop = out.Append(h.seq.get(), &last, 0, 0);
  ASSERT_TRUE(stop.has_value());
  EXPECT_EQ(stop->matched_stop, "ab");
}

TEST(OutputProcessorTest, RecordsRoutingOncePerPositionAndAbortsCount) {
  Harness h(SamplingParams{});
  h.group->request.return_routed_experts = true;
  h.group->request.return_expert_weights = true;
  OutputProcessor out(OutputProcessorOptions{{}, /*routing_width=*/2, 1, 2}, nullptr);
  SampledBatch step;
  step.routed_experts = {1, 2, 3, 4, 5, 6};  // 3 tokens x width 2
  step.routed_weights = {.1f, .2f, .3f, .4f, .5f, .6f};
  out.RecordRouting(BatchEntry{h.seq.get(), 0, 3, model::LogitsMode::kLast}, step, 0);
  EXPECT_EQ(h.seq->routing_next, 3);
  // A recomputation of positions 0..2 (after a retraction) records nothing again.
  out.RecordRouting(BatchEntry{h.seq.get(), 0, 3, model::LogitsMode::kLast}, step, 0);
  EXPECT_EQ(h.seq->routed_experts, (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
  out.Finish(h.seq.get(), FinishReason{FinishKind::kAbort, -1, "", "gone"}, 0, 0);
  ASSERT_EQ(h.results.size(), 1u);
  EXPECT_EQ(h.results[0].routed_experts.size(), 6u);
  EXPECT_EQ(h.results[0].expert_weights.size(), 6u);
  EXPECT_EQ(h.results[0].routed_num_layers, 1);
  EXPECT_EQ(h.results[0].routed_top_k, 2);
  EXPECT_EQ(h.results[0].finish_reason.message, "gone");
  EXPECT_EQ(out.num_aborted(), 1);
}

}  // namespace
}  // namespace rl::engine
