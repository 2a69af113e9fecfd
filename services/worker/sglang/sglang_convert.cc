#include "services/worker/sglang/sglang_convert.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace rl::worker {

absl::StatusOr<engine::GenerateRequest> SglangToEngineRequest(const sgl::GenerateRequest& in,
                                                              std::string id,
                                                              const engine::EngineLimits& limits) {
  engine::GenerateRequest r;
  ASSIGN_OR_RETURN(r.input_ids, sglang::ReadInputIds(in));
  RETURN_IF_ERROR(sglang::CheckSupported(in));
  r.id = std::move(id);
  const int64_t prompt_len = static_cast<int64_t>(r.input_ids.size());
  const int64_t room = std::min(limits.max_context_len, limits.max_kv_tokens) - prompt_len;
  if (room < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenized.input_ids: the prompt (", prompt_len, " tokens) is longer than the context (",
        limits.max_context_len, " tokens, KV pool ", limits.max_kv_tokens, ")"));
  }

  const sgl::SamplingParams& sp = in.sampling_params();
  ASSIGN_OR_RETURN(const sglang::Sampling read,
                   sglang::ReadSampling(sp, engine::kMaxSamplesPerRequest));
  engine::SamplingParams& s = r.sampling;
  s.temperature = read.temperature;
  s.top_p = read.top_p;
  s.top_k = read.top_k;
  s.min_p = read.min_p;
  s.repetition_penalty = read.repetition_penalty;
  s.frequency_penalty = read.frequency_penalty;
  s.presence_penalty = read.presence_penalty;
  if (sp.has_max_new_tokens()) {
    if (sp.max_new_tokens() > static_cast<uint32_t>(std::numeric_limits<int32_t>::max()) ||
        static_cast<int64_t>(sp.max_new_tokens()) > room) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling_params.max_new_tokens: the prompt (", prompt_len, " tokens) + ",
                       sp.max_new_tokens(), " new tokens exceeds the context (",
                       limits.max_context_len, " tokens, KV pool ", limits.max_kv_tokens, ")"));
    }
    s.max_new_tokens = static_cast<int32_t>(sp.max_new_tokens());
  } else {
    s.max_new_tokens = static_cast<int32_t>(std::min<int64_t>(kSglangDefaultMaxNewTokens, room));
  }
  if (sp.min_new_tokens() > static_cast<uint32_t>(s.max_new_tokens)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling_params.min_new_tokens: ", sp.min_new_tokens(),
                     " exceeds max_new_tokens ", s.max_new_tokens));
  }
  s.min_new_tokens = static_cast<int32_t>(sp.min_new_tokens());
  s.ignore_eos = read.ignore_eos;
  s.stop_token_ids = read.stop_token_ids;
  // The gateway enforces stop strings on the text it decodes; the engine also stops on them
  // (saving the tokens after the match) when it has a tokenizer to decode with.
  if (limits.has_text_decoder) s.stop.assign(sp.stop().begin(), sp.stop().end());
  s.n = read.n;
  ASSIGN_OR_RETURN(s.seed, sglang::ReadSeed(in));

  r.return_logprob = in.return_logprob();
  if (r.return_logprob) {
    r.top_logprobs_num = in.top_logprobs_num();
    if (in.logprob_start_len() >= 0) {
      if (in.logprob_start_len() > prompt_len) {
        return absl::InvalidArgumentError(
            absl::StrCat("logprob_start_len: ", in.logprob_start_len(), " is past the prompt (",
                         prompt_len, " tokens)"));
      }
      // Positions past the last prompt token have no input logprob: none are asked for.
      r.logprob_start_len = in.logprob_start_len() < prompt_len ? in.logprob_start_len() : -1;
    }
  }
  return r;
}

const char* SglangFinishReason(engine::FinishKind kind) {
  switch (kind) {
    case engine::FinishKind::kStop:
      return "stop";
    case engine::FinishKind::kLength:
      return "length";
    case engine::FinishKind::kAbort:
    case engine::FinishKind::kStale:  // SGLang has no "stale": the text says it
      return "abort";
  }
  return "abort";
}

void AppendOutputLogprobs(absl::Span<const engine::TokenLogprob> logprobs, bool with_top,
                          sgl::OutputLogProbs* out) {
  for (const engine::TokenLogprob& lp : logprobs) {
    out->add_token_logprobs(static_cast<float>(lp.logprob));
    out->add_token_ids(static_cast<uint32_t>(lp.token_id));
    if (with_top) {
      sgl::TopLogProbs* top = out->add_top_logprobs();
      for (const engine::TopLogprob& t : lp.top) {
        top->add_values(static_cast<float>(t.logprob));
        top->add_token_ids(static_cast<uint32_t>(t.token_id));
      }
    }
  }
}

void FillInputLogprobs(const engine::GenerateResult& result, absl::Span<const int32_t> input_ids,
                       int32_t logprob_start_len, bool with_top, sgl::InputLogProbs* out) {
  if (logprob_start_len < 0) return;
  if (logprob_start_len == 0 && !input_ids.empty()) {
    out->add_token_logprobs();  // position 0: no value
    out->add_token_ids(static_cast<uint32_t>(input_ids[0]));
    if (with_top) out->add_top_logprobs();
  }
  for (const engine::TokenLogprob& lp : result.prompt_logprobs) {
    out->add_token_logprobs()->set_value(static_cast<float>(lp.logprob));
    out->add_token_ids(static_cast<uint32_t>(lp.token_id));
    if (with_top) {
      sgl::TopLogProbs* top = out->add_top_logprobs();
      for (const engine::TopLogprob& t : lp.top) {
        top->add_values(static_cast<float>(t.logprob));
        top->add_token_ids(static_cast<uint32_t>(t.token_id));
      }
    }
  }
}

void FillComplete(const engine::GenerateResult& result, const engine::GenerateRequest& request,
                  bool stream, sgl::GenerateComplete* out) {
  out->set_finish_reason(SglangFinishReason(result.finish_reason.kind));
  out->set_prompt_tokens(result.prompt_tokens);
  out->set_completion_tokens(result.completion_tokens);
  out->set_cached_tokens(result.cached_tokens);
  out->set_index(result.index);
  if (result.finish_reason.kind == engine::FinishKind::kStop) {
    if (!result.finish_reason.matched_stop.empty()) {
      out->set_matched_stop_str(result.finish_reason.matched_stop);
    } else if (result.finish_reason.matched_token_id >= 0) {
      out->set_matched_token_id(static_cast<uint32_t>(result.finish_reason.matched_token_id));
    }
  }
  const bool with_top = request.top_logprobs_num > 0;
  if (!stream) {
    out->mutable_output_ids()->Assign(result.output_ids.begin(), result.output_ids.end());
    if (request.return_logprob) {
      AppendOutputLogprobs(result.output_logprobs, with_top, out->mutable_output_logprobs());
    }
  }
  if (request.return_logprob && request.logprob_start_len >= 0) {
    FillInputLogprobs(result, request.input_ids, request.logprob_start_len, with_top,
                      out->mutable_input_logprobs());
  }
}

}  // namespace rl::worker
