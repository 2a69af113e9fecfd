// Sampler: the sampling stage of an engine step. Sample(batch, out, sampled) turns the runner's
// logits for a ScheduledBatch into a SampledBatch (batch.h): the next token of every sequence
// that completed its prefill this step, its logprob, and the prompt logprobs asked for. It only
// reads the sequences (the scheduler applies the result in Update), and checks the logits' shape
// against the batch (INTERNAL when the runner returned the wrong rows). The single-row
// Sample(SampleInput) and Logprob below are its building blocks.
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
// asked. The exponentials run vectorized (kernels/cpu/vec_ops.h: Highway's Exp in double, within
// 1 ULP of std::exp; the normalizer summed in per-lane partial sums): two loops of std::exp over
// the vocabulary were 7% of a CPU worker's time in a multi-turn decode (32k vocabulary).
// Cost: O(vocab) per token, O(vocab log vocab) with top-p / min-p without top-k.
// Thread safety: none (scratch buffers); one Sampler per engine thread.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "services/worker/engine/batch.h"
#include "services/worker/engine/request.h"
#include "services/worker/model/forward_batch.h"

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

struct SamplerOptions {
  int64_t vocab_size = 0;
  std::vector<int32_t> eos_token_ids;  // masked before min_new_tokens unless ignore_eos
};

// The temperature logprobs are reported at: 1 for greedy requests or when asked, else the
// sampling temperature.
double LogprobTemperature(const Sequence& seq);

class Sampler {
 public:
  Sampler() = default;
  explicit Sampler(SamplerOptions options) : options_(std::move(options)) {}

  // The stage: fills `sampled` (one entry per batch entry) from the runner's output for
  // `batch`, and moves the runner's routing (R3) into it. INTERNAL when the logits do not have
  // the rows the batch asked for; `sampled` is then unspecified.
  absl::Status Sample(const ScheduledBatch& batch, model::ForwardOutput* out,
                      SampledBatch* sampled);

  int32_t Sample(const SampleInput& in);

  // log_softmax(logits / temperature)[token] and, when top_n > 0, the top_n most likely
  // tokens (ties to the lower id).
  TokenLogprob Logprob(const float* logits, int64_t vocab, double temperature, int32_t token,
                       int32_t top_n);

 private:
  absl::Status CheckShape(const ScheduledBatch& batch, const model::ForwardOutput& out) const;
  void SampleEntry(const BatchEntry& entry, const float* rows, int64_t num_rows,
                   SampledEntry* result);

  SamplerOptions options_;
  std::vector<int32_t> banned_;
  std::vector<double> z_;
  std::vector<int32_t> order_;
  std::vector<char> seen_;
};

}  // namespace rl::engine
