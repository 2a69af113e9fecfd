// Domain structs of the engine's public API: what a generation request asks for, what the
// engine streams back while it runs, and the one final result it delivers when it ends.
//
// These are plain values with no protobuf: the worker service translates rl.v1 messages to and
// from them. `ValidateRequest` checks every field once, at submission, so the scheduler can
// trust what it receives. Cost: validation is O(prompt + stop strings).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/version_constraint.h"

namespace rl::engine {

struct SamplingParams {
  // 0 = greedy (argmax; logprobs reported at temperature 1).
  double temperature = 1.0;
  // Keep only the k most likely tokens; 0 or -1 = off.
  int32_t top_k = 0;
  // Nucleus mass in (0, 1]; 1 = off.
  double top_p = 1.0;
  // Drop tokens whose probability is below min_p * max probability; 0 = off.
  double min_p = 0.0;
  // Multiplicative penalty on tokens seen in the prompt or completion; 1 = off.
  double repetition_penalty = 1.0;
  // Additive penalty times a token's count in the completion; 0 = off.
  double frequency_penalty = 0.0;
  // Additive penalty for any token present in the completion; 0 = off.
  double presence_penalty = 0.0;
  // Per-request RNG seed. The same seed gives the same tokens however the batch is formed.
  // Unset: the engine draws one.
  std::optional<uint64_t> seed;
  // 0 runs the prompt only (prompt logprobs); the request then finishes with kLength.
  int32_t max_new_tokens = 128;
  // EOS and stop tokens are masked, and stop strings ignored, until this many tokens exist.
  int32_t min_new_tokens = 0;
  // Keep going past the model's EOS ids (stop_token_ids still stop).
  bool ignore_eos = false;
  std::vector<int32_t> stop_token_ids;
  // Matched on the decoded completion; needs a TextDecoder.
  std::vector<std::string> stop;
  // Number of completions; > 1 shares the prompt's KV through the prefix cache.
  int32_t n = 1;
};

// A run of consecutive output tokens sampled with the same weight version.
struct VersionSegment {
  int64_t weight_version = 0;
  int32_t num_tokens = 0;
  bool operator==(const VersionSegment&) const = default;
};

struct GenerateRequest {
  // Unique among in-flight requests; chosen by the caller.
  std::string id;
  std::vector<int32_t> input_ids;
  SamplingParams sampling;
  // Logprob of every output token.
  bool return_logprob = false;
  // With return_logprob: top-N alternatives per position (0..kMaxTopLogprobs).
  int32_t top_logprobs_num = 0;
  // With return_logprob: prompt logprobs for prompt positions >= max(logprob_start_len, 1)
  // (position 0 has no logprob). -1 = no prompt logprobs.
  int32_t logprob_start_len = -1;
  // Report logprobs at temperature 1 instead of the sampling temperature.
  bool logprobs_at_temperature_one = false;
  // R3 (MoE models, engine started with routing export): the experts every token was routed
  // to, from prompt position routed_experts_start_len on (0..prompt length), and with
  // return_expert_weights their routing weights.
  bool return_routed_experts = false;
  bool return_expert_weights = false;
  int32_t routed_experts_start_len = 0;
  // The weight versions the request accepts: the engine finishes it with kAbort (message naming
  // both versions) rather than run it on another version, e.g. after retract -> update ->
  // continue. Validated (VersionConstraint::Validate) by ValidateRequest.
  VersionConstraint versions;
  // Staleness bound: when the engine's version moves more than this past the version the
  // request was dispatched at, it finishes with kStale and its partial output. Unset: the
  // engine's default (EngineOptions::default_max_version_lag); -1: no bound.
  std::optional<int32_t> max_version_lag;
  // Resume within the budget (issue 34; docs/weight-updates.md, "Resume"): the output tokens of
  // an earlier partial sample of this prompt, continued here. They are output, not prompt: the
  // engine prefills prompt + resumed_ids, counts them against sampling.max_new_tokens (the
  // ORIGINAL budget) and min_new_tokens, and the result's output_ids / output_logprobs /
  // weight_version_segments start with them. resumed_logprobs: empty (unknown: NaN) or one per
  // id; resumed_segments: empty (unknown: one segment of version -1) or adding up to the ids.
  // Needs n == 1.
  std::vector<int32_t> resumed_ids;
  std::vector<double> resumed_logprobs;
  std::vector<VersionSegment> resumed_segments;
};

inline constexpr int32_t kMaxTopLogprobs = 20;
inline constexpr int32_t kMaxSamplesPerRequest = 64;

struct TopLogprob {
  int32_t token_id = 0;
  double logprob = 0.0;
};

// Logprob of one token: log_softmax(logits / T)[token_id] computed in double with
// max-subtraction, before penalties and top-k/top-p/min-p truncation.
struct TokenLogprob {
  int32_t token_id = 0;
  double logprob = 0.0;
  std::vector<TopLogprob> top;  // most likely first; empty unless top_logprobs_num > 0
};

// Incremental output of one completion: the tokens produced since the previous chunk.
struct OutputChunk {
  std::string id;
  int32_t index = 0;  // completion index, 0..n-1
  std::vector<int32_t> token_ids;
  std::vector<TokenLogprob> logprobs;  // one per token when return_logprob
};

// kStale: the weight version moved more than the request's max_version_lag past its dispatch
// version (issue 34); the result carries the partial output like kAbort.
enum class FinishKind { kStop, kLength, kAbort, kStale };

struct FinishReason {
  FinishKind kind = FinishKind::kLength;
  // kStop: the token id that matched (EOS or stop_token_ids), or -1 for a stop string.
  int32_t matched_token_id = -1;
  // kStop: the stop string that matched, empty otherwise.
  std::string matched_stop;
  // kAbort, kStale: why.
  std::string message;
};

struct RequestTimings {
  int64_t queue_us = 0;  // submission to first scheduling
  int64_t ttft_us = 0;   // submission to first output token (0 when none)
  int64_t total_us = 0;  // submission to finish
};

// The final result of one completion: totals of everything streamed, plus bookkeeping.
struct GenerateResult {
  std::string id;
  int32_t index = 0;
  FinishReason finish_reason;
  std::vector<int32_t> output_ids;
  std::vector<TokenLogprob> output_logprobs;  // one per output token when return_logprob
  // Prompt tokens at positions prompt_logprob_start .. prompt_tokens - 1.
  std::vector<TokenLogprob> prompt_logprobs;
  int32_t prompt_logprob_start = 0;
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_tokens = 0;  // prompt tokens served from the prefix cache at first admission
  int32_t num_retractions = 0;
  // Version of the weights that sampled the last output token (the version at finish when
  // there is no output token).
  int64_t weight_version = 0;
  // Version of the engine's weights when the request was added (dispatched to the engine).
  int64_t dispatch_weight_version = 0;
  // Run-length versions of the output tokens, in order; num_tokens add up to output_ids.size().
  // More than one segment only when the request crossed a weight update (retract -> update ->
  // continue).
  std::vector<VersionSegment> weight_version_segments;
  // An in-flight update (keep_kv) crossed the request while it held KV: the tokens sampled
  // after it attended to KV computed by weights of oldest_kv_weight_version (no recompute;
  // 0 when not set).
  bool kv_from_older_version = false;
  int64_t oldest_kv_weight_version = 0;
  // A resume (GenerateRequest::resumed_ids): how many leading output tokens came from the
  // earlier part (0: not a resume).
  int32_t resumed_tokens = 0;
  // With return_routed_experts: for every token the model processed from position
  // routed_experts_start on (prompt tokens, then every output token but the last, which was
  // never fed back), per MoE layer, per top-k slot, row-major [tokens, moe layers, top_k]; the
  // weights (return_expert_weights) have the same shape. Each token's routing is the one
  // recorded when it was first computed: a retract/continue never changes it.
  std::vector<int32_t> routed_experts;
  std::vector<float> expert_weights;
  int32_t routed_experts_start = 0;
  int32_t routed_num_layers = 0;
  int32_t routed_top_k = 0;
  RequestTimings timings;
};

// Callbacks run on the engine thread and must not block (hand work off to another thread).
// For n > 1 both receive the completion `index`; on_finish runs exactly once per completion,
// also on abort and engine shutdown, never before Submit returned OK.
struct RequestCallbacks {
  std::function<void(const OutputChunk&)> on_output;  // optional
  std::function<void(GenerateResult)> on_finish;      // required
};

// What this engine can serve (from its model, its KV pool and its options): the bounds
// ValidateRequest checks a request against. Not the client-side request limits of
// common/request_limits.h, which bound what a gRPC message may carry.
struct EngineLimits {
  int64_t vocab_size = 0;
  int64_t max_context_len = 0;    // prompt + max_new_tokens must fit
  int64_t max_kv_tokens = 0;      // one completion must fit in the KV pool on its own
  bool has_text_decoder = false;  // stop strings need one
  bool routing_export = false;    // return_routed_experts allowed (MoE model, flag on)
};

// Checks every field. INVALID_ARGUMENT names the field; a prompt plus max_new_tokens longer
// than the context or the KV pool is RESOURCE_EXHAUSTED.
absl::Status ValidateRequest(const GenerateRequest& request, const EngineLimits& limits);

// A resume's budget (issue 34): `earlier` output tokens already generated of an original
// budget `max_new_tokens` leave max_new_tokens - earlier to generate (<= 0: INVALID_ARGUMENT,
// nothing is left); prompt + earlier + that remainder must fit in `context`, else
// INVALID_ARGUMENT naming the three numbers, their sum and the context (slime #2260 asked for
// 19,202 + 24,576 tokens in a 40,960 context by passing the whole budget again).
absl::Status CheckResumeBudget(int64_t prompt, int64_t earlier, int64_t max_new_tokens,
                               int64_t context);

}  // namespace rl::engine
