// Hand-made inputs shared by the collector's unit tests: a router final with a trajectory and
// a sample record with every column filled.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "rl/v1/router.pb.h"
#include "services/collector/sample.h"

namespace rl::collector {

// A final of `prompt` + `out` tokens (logprobs -1, -2, ...), finish reason stop.
inline rl::v1::GenerateFinal MakeFinal(std::vector<int32_t> prompt, std::vector<int32_t> out) {
  rl::v1::GenerateFinal f;
  for (int32_t t : prompt) f.mutable_trajectory()->add_tokens(t);
  for (size_t i = 0; i < out.size(); ++i) {
    f.add_output_ids(out[i]);
    f.mutable_trajectory()->add_tokens(out[i]);
    f.add_output_logprobs()->set_logprob(-1.0f - static_cast<float>(i));
  }
  f.set_finish_reason(rl::v1::FINISH_REASON_STOP);
  return f;
}

// Sample `sample` of prompt `index`: `tokens` of which the first `prompt_len` are the prompt.
inline SampleRecord Record(int64_t index, int32_t sample, std::vector<int32_t> tokens,
                           int prompt_len) {
  SampleRecord r;
  r.key = {index, sample};
  r.group = index * 10;
  r.prompt_len = prompt_len;
  r.tokens = tokens;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const bool resp = static_cast<int>(i) >= prompt_len;
    r.loss_mask.push_back(resp ? 1 : 0);
    r.rollout_logprobs.push_back(resp ? -0.5f * i : NAN);
    r.weight_versions.push_back(resp ? 3 : -1);
  }
  r.finish_reason = "length";
  r.attempts = 1;
  r.weight_version = 3;
  r.metadata_json = R"({"source":"gsm8k","label":[1,2]})";
  return r;
}

}  // namespace rl::collector
