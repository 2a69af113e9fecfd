// What rl-worker and rl-router both read from SGLang's gRPC scheduler protocol
// (sglang.grpc.scheduler, as the Shepherd Model Gateway speaks it): the prompt's token ids, the
// fields neither process has a counterpart for (refused by name), the sampling parameters with
// proto3 zeros read as SGLang reads them, and the facts carried by the request id, the only
// free-form field SMG 1.13 forwards (`rid` in the body, or the `x-request-id` header with
// "-<uuid>" appended): a `seed=N` token and an `episode=ID` token. docs/smg.md has the syntax and
// the reasons. Pure functions, no state; O(prompt) at most.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sglang_scheduler.pb.h"

namespace rl::sglang {

namespace sgl = ::sglang::grpc::scheduler;

// Tokens a request gets when it sets no max_new_tokens (clamped to what the context leaves).
inline constexpr int32_t kDefaultMaxNewTokens = 128;
// Longest episode id an `episode=` token may carry.
inline constexpr size_t kMaxEpisodeIdBytes = 128;

// `tokenized.input_ids` as int32: INVALID_ARGUMENT when absent, empty or out of range.
absl::StatusOr<std::vector<int32_t>> ReadInputIds(const sgl::GenerateRequest& in);

// INVALID_ARGUMENT naming the first field that neither rl-worker nor rl-router serves:
// constrained decoding, logit bias, LoRA, hidden states, input embeddings, multimodal input, a
// custom logit processor, logprobs of chosen ids, disaggregation, a data-parallel rank but 0.
absl::Status CheckSupported(const sgl::GenerateRequest& in);

// The sampling fields whose proto3 zero means "unset", read with SGLang's defaults:
// temperature 0 is greedy; top_p 0 -> 1, top_k 0 -> off (-1), repetition_penalty 0 -> 1, n 0 -> 1.
struct Sampling {
  double temperature = 0;
  double top_p = 1;
  int32_t top_k = -1;
  double min_p = 0;
  double repetition_penalty = 1;
  double frequency_penalty = 0;
  double presence_penalty = 0;
  bool ignore_eos = false;
  int32_t n = 1;
  std::vector<int32_t> stop_token_ids;
};
// INVALID_ARGUMENT for a stop token id out of range or n past `max_n`.
absl::StatusOr<Sampling> ReadSampling(const sgl::SamplingParams& sp, int32_t max_n);

// The seed a request id carries: `seed=N` (N decimal, < 2^64) at the id's start or after a
// character that is not a letter, digit or underscore, and followed by the id's end or one of
// `-/:;,|#&` (the gateway appends "-<uuid>" or "-p<i>" to ids it derives). nullopt when the id
// has no such token; INVALID_ARGUMENT for a malformed or out-of-range value, or two tokens.
absl::StatusOr<std::optional<uint64_t>> SeedFromRequestId(absl::string_view id);

// The request's seed: `sampling_params.custom_params.seed` (or `sampling_seed`, a non-negative
// integer; any other custom parameter is INVALID_ARGUMENT) and the request id's `seed=N`, which
// must agree when both are given. nullopt when neither is.
absl::StatusOr<std::optional<uint64_t>> ReadSeed(const sgl::GenerateRequest& in);

// The episode a request id names: `episode=ID` at the id's start or after a character that is
// not a letter, digit or underscore; ID is 1 to kMaxEpisodeIdBytes letters, digits, '_' or '.',
// and ends at the id's end or at one of `-/:;,|#&` (so "-<uuid>" appended by the gateway is not
// part of it). nullopt when the id has none; INVALID_ARGUMENT for an empty or over-long ID, an
// ID followed by another character, or two tokens.
absl::StatusOr<std::optional<std::string>> EpisodeFromRequestId(absl::string_view id);

// OpenAI's finish reason words as GenerateComplete.finish_reason carries them.
inline constexpr char kFinishStop[] = "stop";
inline constexpr char kFinishLength[] = "length";
inline constexpr char kFinishAbort[] = "abort";

}  // namespace rl::sglang
