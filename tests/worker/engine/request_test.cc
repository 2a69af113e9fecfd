#include "services/worker/engine/request.h"

#include <functional>

#include "gtest/gtest.h"

namespace rl::engine {
namespace {

EngineLimits Limits() {
  EngineLimits l;
  l.vocab_size = 100;
  l.max_context_len = 64;
  l.max_kv_tokens = 48;
  l.has_text_decoder = true;
  return l;
}

GenerateRequest Good() {
  GenerateRequest r;
  r.id = "r";
  r.input_ids = {1, 2, 3};
  r.sampling.max_new_tokens = 8;
  return r;
}

TEST(ValidateRequestTest, AcceptsAGoodRequest) {
  EXPECT_TRUE(ValidateRequest(Good(), Limits()).ok());
}

TEST(ValidateRequestTest, NamesTheBadField) {
  struct Case {
    std::function<void(GenerateRequest&)> mutate;
    absl::StatusCode code;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](auto& r) { r.id.clear(); }, absl::StatusCode::kInvalidArgument, "id"},
      {[](auto& r) { r.input_ids.clear(); }, absl::StatusCode::kInvalidArgument, "input_ids"},
      {[](auto& r) { r.input_ids[1] = 100; }, absl::StatusCode::kInvalidArgument, "input_ids"},
      {[](auto& r) { r.input_ids[1] = -1; }, absl::StatusCode::kInvalidArgument, "input_ids"},
      {[](auto& r) { r.sampling.temperature = -0.1; }, absl::StatusCode::kInvalidArgument,
       "temperature"},
      {[](auto& r) { r.sampling.top_p = 0; }, absl::StatusCode::kInvalidArgument, "top_p"},
      {[](auto& r) { r.sampling.top_p = 1.01; }, absl::StatusCode::kInvalidArgument, "top_p"},
      {[](auto& r) { r.sampling.top_k = -2; }, absl::StatusCode::kInvalidArgument, "top_k"},
      {[](auto& r) { r.sampling.min_p = 1.5; }, absl::StatusCode::kInvalidArgument, "min_p"},
      {[](auto& r) { r.sampling.repetition_penalty = 0; }, absl::StatusCode::kInvalidArgument,
       "repetition_penalty"},
      {[](auto& r) { r.sampling.frequency_penalty = 3; }, absl::StatusCode::kInvalidArgument,
       "frequency_penalty"},
      {[](auto& r) { r.sampling.presence_penalty = -3; }, absl::StatusCode::kInvalidArgument,
       "presence_penalty"},
      {[](auto& r) { r.sampling.max_new_tokens = -1; }, absl::StatusCode::kInvalidArgument,
       "max_new_tokens"},
      {[](auto& r) { r.sampling.min_new_tokens = 9; }, absl::StatusCode::kInvalidArgument,
       "min_new_tokens"},
      {[](auto& r) { r.sampling.stop_token_ids = {100}; }, absl::StatusCode::kInvalidArgument,
       "stop_token_ids"},
      {[](auto& r) { r.sampling.stop = {""}; }, absl::StatusCode::kInvalidArgument, "stop"},
      {[](auto& r) { r.sampling.n = 0; }, absl::StatusCode::kInvalidArgument, "n"},
      {[](auto& r) { r.top_logprobs_num = 21; }, absl::StatusCode::kInvalidArgument,
       "top_logprobs_num"},
      {[](auto& r) { r.logprob_start_len = 4; }, absl::StatusCode::kInvalidArgument,
       "logprob_start_len"},
      {[](auto& r) { r.sampling.max_new_tokens = 62; }, absl::StatusCode::kResourceExhausted,
       "context"},
      {[](auto& r) { r.sampling.max_new_tokens = 46; }, absl::StatusCode::kResourceExhausted,
       "KV cache"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    GenerateRequest r = Good();
    cases[i].mutate(r);
    const absl::Status s = ValidateRequest(r, Limits());
    EXPECT_EQ(s.code(), cases[i].code) << i << ": " << s;
    EXPECT_NE(std::string(s.message()).find(cases[i].field), std::string::npos) << i << ": " << s;
  }
}

TEST(ValidateRequestTest, StopStringsNeedADecoder) {
  GenerateRequest r = Good();
  r.sampling.stop = {"x"};
  EngineLimits l = Limits();
  l.has_text_decoder = false;
  EXPECT_EQ(ValidateRequest(r, l).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ValidateRequestTest, MaxNewTokensZeroAndPromptLogprobsAreFine) {
  GenerateRequest r = Good();
  r.sampling.max_new_tokens = 0;
  r.return_logprob = true;
  r.logprob_start_len = 0;
  EXPECT_TRUE(ValidateRequest(r, Limits()).ok());
}

// Issue 34: slime #2260 asked for 19,202 + 24,576 = 43,778 tokens in a 40,960 context by
// passing the whole budget again with a resume. The remaining budget is the original one minus
// what was generated: the same sample fits when its prompt does, and a prompt that leaves too
// little room is refused naming every number.
TEST(CheckResumeBudgetTest, Slime2260) {
  // prompt 10,000 + earlier 9,202 = 19,202 in the context; original budget 24,576: 15,374 left,
  // 34,576 in all (the naive 19,202 + 24,576 = 43,778 would not fit).
  EXPECT_TRUE(CheckResumeBudget(10'000, 9'202, 24'576, 40'960).ok());
  absl::Status s = CheckResumeBudget(19'202, 2'000, 24'576, 40'960);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("prompt (19202 tokens) + earlier output (2000) + remaining budget "
                             "(22576 = max_new_tokens 24576 - 2000) = 43778 tokens exceeds the "
                             "model's context of 40960 tokens"),
            std::string::npos)
      << s;
  EXPECT_TRUE(CheckResumeBudget(16'384, 2'000, 24'576, 40'960).ok());  // exactly 40,960
  absl::Status spent = CheckResumeBudget(100, 24'576, 24'576, 40'960);
  EXPECT_EQ(spent.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(spent.message().find("nothing is left to generate"), std::string::npos) << spent;
}

TEST(ValidateRequestTest, ResumeCountsTheEarlierOutputAgainstTheBudget) {
  GenerateRequest r = Good();  // prompt 3, max_new_tokens 8
  r.resumed_ids = {4, 5, 6};
  EXPECT_TRUE(ValidateRequest(r, Limits()).ok());
  r.resumed_logprobs = {-1.0, -2.0};
  EXPECT_NE(ValidateRequest(r, Limits()).message().find("resume_from.output_logprobs"),
            std::string::npos);
  r.resumed_logprobs.clear();
  r.resumed_segments = {{0, 2}};
  EXPECT_NE(ValidateRequest(r, Limits()).message().find("cover 2 tokens"), std::string::npos);
  r.resumed_segments = {{0, 1}, {1, 2}};
  EXPECT_TRUE(ValidateRequest(r, Limits()).ok());
  r.sampling.n = 2;
  EXPECT_EQ(ValidateRequest(r, Limits()).code(), absl::StatusCode::kInvalidArgument);
  r.sampling.n = 1;
  r.resumed_ids = {4, 200, 6};
  EXPECT_NE(ValidateRequest(r, Limits()).message().find("outside the vocabulary"),
            std::string::npos);
  r.resumed_ids = {4, 5, 6, 7, 8, 9, 10, 11};
  r.resumed_segments.clear();
  EXPECT_NE(ValidateRequest(r, Limits()).message().find("nothing is left"), std::string::npos);
  r.sampling.max_new_tokens = 62;  // 3 + 8 + 54 = 65 > 64
  EXPECT_NE(ValidateRequest(r, Limits()).message().find("exceeds the model's context of 64"),
            std::string::npos);
}

}  // namespace
}  // namespace rl::engine
