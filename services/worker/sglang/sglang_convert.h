// Translation between SGLang's gRPC scheduler protocol (sglang.grpc.scheduler, as the Shepherd
// Model Gateway speaks it) and the engine's domain structs. Pure functions, no state.
//
// proto3 zero values mean "unset" for several sampling fields, as SGLang's own servicer reads
// them: temperature 0 is greedy; top_p 0 → 1, top_k 0 → off, repetition_penalty 0 → 1, n 0 → 1;
// an unset max_new_tokens takes kDefaultMaxNewTokens clamped to what the context leaves. A prompt
// that, with its max_new_tokens, cannot fit the context or the KV pool is INVALID_ARGUMENT (the
// caller's mistake, a 400 at the gateway, never retried). What the engine has no counterpart
// for (constraints, LoRA, embeddings, hidden states, multimodal inputs, logit bias, custom
// logit processors, disaggregation) is INVALID_ARGUMENT naming the field. Cost: O(prompt).
//
// The per-request seed comes from `sampling_params.custom_params.seed` (direct gRPC clients) or
// from a `seed=N` token in the request id: the only free-form field SMG 1.13 forwards, from the
// request's `rid` or its `x-request-id` header (the gateway drops OpenAI's `seed` and every
// `custom_params`). Syntax and rationale: docs/smg.md. What rl-router reads the same way
// (input ids, unsupported fields, sampling defaults, the request id's tokens) is in
// common/sglang/sglang_request.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/sglang/sglang_request.h"
#include "services/worker/engine/request.h"
#include "sglang_scheduler.pb.h"

namespace rl::worker {

namespace sgl = ::sglang::grpc::scheduler;

inline constexpr int32_t kSglangDefaultMaxNewTokens = sglang::kDefaultMaxNewTokens;

// The engine request for `in`, with request id `id`, checked against `limits` for what only
// this protocol decides (defaults, unsupported fields, context fit); the engine validates the
// rest at Submit and names the field.
absl::StatusOr<engine::GenerateRequest> SglangToEngineRequest(const sgl::GenerateRequest& in,
                                                              std::string id,
                                                              const engine::EngineLimits& limits);

// The seed a request id carries (common/sglang/sglang_request.h).
using sglang::SeedFromRequestId;

// "stop", "length" or "abort" (OpenAI's words, as GenerateComplete.finish_reason carries them).
const char* SglangFinishReason(engine::FinishKind kind);

// Appends one entry per logprob (value, token id, top alternatives when asked).
void AppendOutputLogprobs(absl::Span<const engine::TokenLogprob> logprobs, bool with_top,
                          sgl::OutputLogProbs* out);

// Input logprobs as SGLang reports them: one entry per prompt position from
// `logprob_start_len`, the first prompt token (position 0) without a value.
void FillInputLogprobs(const engine::GenerateResult& result, absl::Span<const int32_t> input_ids,
                       int32_t logprob_start_len, bool with_top, sgl::InputLogProbs* out);

// The final message of one completion. `stream`: the tokens already went out in chunks, so
// output_ids and output logprobs are left empty (counts and input logprobs are still set).
void FillComplete(const engine::GenerateResult& result, const engine::GenerateRequest& request,
                  bool stream, sgl::GenerateComplete* out);

}  // namespace rl::worker
