#include "services/worker/engine/request.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace rl::engine {
namespace {

absl::Status Invalid(const char* field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

bool Finite(double x) { return std::isfinite(x); }

}  // namespace

absl::Status ValidateRequest(const GenerateRequest& r, const EngineLimits& limits) {
  const SamplingParams& s = r.sampling;
  if (r.id.empty()) return Invalid("id", "must not be empty");
  if (r.input_ids.empty()) return Invalid("input_ids", "the prompt must not be empty");
  if (absl::Status s = r.versions.Validate(); !s.ok()) return s;
  if (r.max_version_lag.has_value() && *r.max_version_lag < -1) {
    return Invalid("max_version_lag", "must be >= 0, or -1 for no bound");
  }
  for (size_t i = 0; i < r.input_ids.size(); ++i) {
    const int32_t t = r.input_ids[i];
    if (t < 0 || t >= limits.vocab_size) {
      return Invalid("input_ids",
                     absl::StrCat("token ", t, " at position ", i,
                                  " is outside the vocabulary [0, ", limits.vocab_size, ")"));
    }
  }
  if (!Finite(s.temperature) || s.temperature < 0) {
    return Invalid("temperature", "must be finite and >= 0");
  }
  if (s.top_k < -1) return Invalid("top_k", "must be >= -1 (0 and -1 mean off)");
  if (!Finite(s.top_p) || s.top_p <= 0 || s.top_p > 1) {
    return Invalid("top_p", "must be in (0, 1]");
  }
  if (!Finite(s.min_p) || s.min_p < 0 || s.min_p > 1) return Invalid("min_p", "must be in [0, 1]");
  if (!Finite(s.repetition_penalty) || s.repetition_penalty <= 0) {
    return Invalid("repetition_penalty", "must be > 0");
  }
  if (!Finite(s.frequency_penalty) || std::fabs(s.frequency_penalty) > 2) {
    return Invalid("frequency_penalty", "must be in [-2, 2]");
  }
  if (!Finite(s.presence_penalty) || std::fabs(s.presence_penalty) > 2) {
    return Invalid("presence_penalty", "must be in [-2, 2]");
  }
  if (s.max_new_tokens < 0) return Invalid("max_new_tokens", "must be >= 0");
  if (s.min_new_tokens < 0) return Invalid("min_new_tokens", "must be >= 0");
  if (s.min_new_tokens > s.max_new_tokens) {
    return Invalid("min_new_tokens", "must not exceed max_new_tokens");
  }
  for (int32_t t : s.stop_token_ids) {
    if (t < 0 || t >= limits.vocab_size) {
      return Invalid("stop_token_ids", absl::StrCat("token ", t, " is outside the vocabulary"));
    }
  }
  for (const std::string& stop : s.stop) {
    if (stop.empty()) return Invalid("stop", "stop strings must not be empty");
  }
  if (!s.stop.empty() && !limits.has_text_decoder) {
    return Invalid("stop", "stop strings need a text decoder, and this engine has none");
  }
  if (s.n < 1 || s.n > kMaxSamplesPerRequest) {
    return Invalid("n", absl::StrCat("must be in [1, ", kMaxSamplesPerRequest, "]"));
  }
  if (r.top_logprobs_num < 0 || r.top_logprobs_num > kMaxTopLogprobs) {
    return Invalid("top_logprobs_num", absl::StrCat("must be in [0, ", kMaxTopLogprobs, "]"));
  }
  const int64_t prompt_len = static_cast<int64_t>(r.input_ids.size());
  if (r.logprob_start_len < -1 || r.logprob_start_len > prompt_len) {
    return Invalid("logprob_start_len", absl::StrCat("must be -1 or in [0, ", prompt_len, "]"));
  }
  if (r.return_routed_experts && !limits.routing_export) {
    return absl::FailedPreconditionError(
        "return_routed_experts: needs an MoE model and a worker started with "
        "--enable-return-routed-experts");
  }
  if (r.return_expert_weights && !r.return_routed_experts) {
    return Invalid("return_expert_weights", "needs return_routed_experts");
  }
  if (r.routed_experts_start_len < 0 || r.routed_experts_start_len > prompt_len) {
    return Invalid("routed_experts_start_len", absl::StrCat("must be in [0, ", prompt_len, "]"));
  }
  if (!r.resumed_ids.empty()) {
    if (s.n != 1) return Invalid("n", "a resume continues one sample: n must be 1");
    for (size_t i = 0; i < r.resumed_ids.size(); ++i) {
      const int32_t t = r.resumed_ids[i];
      if (t < 0 || t >= limits.vocab_size) {
        return Invalid("resume_from.output_ids",
                       absl::StrCat("token ", t, " at position ", i,
                                    " is outside the vocabulary [0, ", limits.vocab_size, ")"));
      }
    }
    if (!r.resumed_logprobs.empty() && r.resumed_logprobs.size() != r.resumed_ids.size()) {
      return Invalid("resume_from.output_logprobs",
                     absl::StrCat(r.resumed_logprobs.size(), " logprobs for ", r.resumed_ids.size(),
                                  " output ids (one per id, or none)"));
    }
    int64_t covered = 0;
    for (const VersionSegment& seg : r.resumed_segments) {
      if (seg.num_tokens <= 0) {
        return Invalid("resume_from.weight_version_segments", "num_tokens must be > 0");
      }
      covered += seg.num_tokens;
    }
    if (!r.resumed_segments.empty() && covered != static_cast<int64_t>(r.resumed_ids.size())) {
      return Invalid("resume_from.weight_version_segments",
                     absl::StrCat("cover ", covered, " tokens, not the ", r.resumed_ids.size(),
                                  " output ids (or send none: unknown)"));
    }
    const int64_t earlier = static_cast<int64_t>(r.resumed_ids.size());
    RETURN_IF_ERROR(
        CheckResumeBudget(prompt_len, earlier, s.max_new_tokens, limits.max_context_len));
    if (prompt_len + s.max_new_tokens > limits.max_kv_tokens) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "prompt (", prompt_len, " tokens) + earlier output (", earlier, ") + remaining budget (",
          s.max_new_tokens - earlier, ") exceeds the KV cache capacity ", limits.max_kv_tokens));
    }
    return absl::OkStatus();
  }
  const int64_t total = prompt_len + s.max_new_tokens;
  if (total > limits.max_context_len) {
    return absl::ResourceExhaustedError(
        absl::StrCat("prompt (", prompt_len, " tokens) + max_new_tokens (", s.max_new_tokens,
                     ") exceeds the context length ", limits.max_context_len));
  }
  if (total > limits.max_kv_tokens) {
    return absl::ResourceExhaustedError(
        absl::StrCat("prompt (", prompt_len, " tokens) + max_new_tokens (", s.max_new_tokens,
                     ") exceeds the KV cache capacity ", limits.max_kv_tokens));
  }
  return absl::OkStatus();
}

absl::Status CheckResumeBudget(int64_t prompt, int64_t earlier, int64_t max_new_tokens,
                               int64_t context) {
  const int64_t remaining = max_new_tokens - earlier;
  if (remaining <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resume_from: the sample already has ", earlier,
        " output tokens of its max_new_tokens budget ", max_new_tokens,
        ": nothing is left to generate (sampling_params.max_new_tokens is the ORIGINAL budget)"));
  }
  const int64_t total = prompt + earlier + remaining;
  if (total > context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "resume_from: prompt (", prompt, " tokens) + earlier output (", earlier,
        ") + remaining budget (", remaining, " = max_new_tokens ", max_new_tokens, " - ", earlier,
        ") = ", total, " tokens exceeds the model's context of ", context, " tokens"));
  }
  return absl::OkStatus();
}

}  // namespace rl::engine
