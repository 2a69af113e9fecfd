// Sampler: turns one row of logits into the next token and reports logprobs.
//
// Sampling order: penalties (repetition over prompt + completion, frequency / presence over
// the completion) → masking of EOS / stop tokens while min_new_tokens is not reached →
// temperature (0 = argmax, ties to the lowest id) → top-k → top-p → min-p → one draw by
// inverse CDF over candidates ordered by (probability desc, id asc).
//
// Randomness is per request and counter-based: the uniform of step s is a hash of (seed, s), so
// a request's tokens do not depend on what else is in the batch, nor on retraction.
//
// Logprobs are log_softmax(logits / T) of the raw model logits (no penalties, no truncation) in
// double with max-subtraction: what a trainer recomputes. T = 1 for greedy requests or when
// asked. Cost: O(vocab) per token, O(vocab log vocab) with top-p / min-p without top-k.
// Thread safety: none (scratch buffers); one Sampler per engine thread.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "services/worker/engine/request.h"

namespace rl::engine {

struct SampleInput {
  const float* logits = nullptr;  // [vocab]
  int64_t vocab = 0;
  const SamplingParams* params = nullptr;
  // Prompt followed by the completion so far (repetition penalty).
  absl::Span<const int32_t> all_tokens;
  // Count of each token in the completion so far (frequency / presence penalties).
  const absl::flat_hash_map<int32_t, int32_t>* output_counts = nullptr;
  // Tokens that may not be chosen now (EOS / stop ids before min_new_tokens).
  absl::Span<const int32_t> banned;
  uint64_t seed = 0;
  int64_t step = 0;  // index of the output token being sampled
};

// A uniform double in [0, 1) that depends only on (seed, step).
double CounterUniform(uint64_t seed, uint64_t step);
// Derives the seed of completion `index` of a request with seed `seed` (index 0 keeps it).
uint64_t DeriveSeed(uint64_t seed, int32_t index);

class Sampler {
 public:
  int32_t Sample(const SampleInput& in);

  // log_softmax(logits / temperature)[token] and, when top_n > 0, the top_n most likely
  // tokens (ties to the lower id).
  TokenLogprob Logprob(const float* logits, int64_t vocab, double temperature, int32_t token,
                       int32_t top_n);

 private:
  std::vector<double> z_;
  std::vector<int32_t> order_;
  std::vector<char> seen_;
};

}  // namespace rl::engine
