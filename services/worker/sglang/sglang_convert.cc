#include "services/worker/sglang/sglang_convert.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace rl::worker {
namespace {

absl::Status Unsupported(const char* field, const char* what) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", what, " is not supported by this worker (rlfleet)"));
}

bool HasMultimodalInput(const sgl::MultimodalInputs& mm) {
  return mm.image_urls_size() > 0 || mm.video_urls_size() > 0 || mm.audio_urls_size() > 0 ||
         mm.has_pixel_values() || mm.image_data_size() > 0 || mm.video_data_size() > 0 ||
         mm.audio_data_size() > 0 || !mm.model_specific_tensors().empty() ||
         mm.mm_placeholders_size() > 0;
}

absl::Status CheckSupported(const sgl::GenerateRequest& in) {
  const sgl::SamplingParams& sp = in.sampling_params();
  switch (sp.constraint_case()) {
    case sgl::SamplingParams::kRegex:
      return Unsupported("sampling_params.regex", "constrained decoding");
    case sgl::SamplingParams::kJsonSchema:
      return Unsupported("sampling_params.json_schema", "constrained decoding");
    case sgl::SamplingParams::kEbnfGrammar:
      return Unsupported("sampling_params.ebnf_grammar", "constrained decoding");
    case sgl::SamplingParams::kStructuralTag:
      return Unsupported("sampling_params.structural_tag", "constrained decoding");
    case sgl::SamplingParams::CONSTRAINT_NOT_SET:
      break;
  }
  if (!sp.logit_bias().empty()) return Unsupported("sampling_params.logit_bias", "logit bias");
  if (!in.lora_id().empty()) return Unsupported("lora_id", "LoRA");
  if (in.return_hidden_states()) return Unsupported("return_hidden_states", "hidden states");
  if (in.input_embeds_size() > 0) return Unsupported("input_embeds", "input embeddings");
  if (in.has_mm_inputs() && HasMultimodalInput(in.mm_inputs())) {
    return Unsupported("mm_inputs", "multimodal input");
  }
  if (!in.custom_logit_processor().empty()) {
    return Unsupported("custom_logit_processor", "a custom logit processor");
  }
  if (in.token_ids_logprob_size() > 0) {
    return Unsupported("token_ids_logprob", "logprobs of chosen token ids");
  }
  if (in.has_disaggregated_params() && !in.disaggregated_params().bootstrap_host().empty()) {
    return Unsupported("disaggregated_params", "prefill/decode disaggregation");
  }
  if (in.has_data_parallel_rank() && in.data_parallel_rank() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data_parallel_rank: this worker has one rank (0), got ", in.data_parallel_rank()));
  }
  return absl::OkStatus();
}

// custom_params: only a per-request seed ("seed" or "sampling_seed") has a counterpart.
absl::Status ApplyCustomParams(const google::protobuf::Struct& params, engine::SamplingParams* s) {
  for (const auto& [key, value] : params.fields()) {
    if (key != "seed" && key != "sampling_seed") {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling_params.custom_params.", key, ": not supported (only seed is)"));
    }
    if (value.kind_case() == google::protobuf::Value::kNullValue) continue;
    const double v = value.number_value();
    if (value.kind_case() != google::protobuf::Value::kNumberValue || v < 0 || v != std::floor(v) ||
        v > 9007199254740992.0) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling_params.custom_params.", key, ": must be a non-negative integer"));
    }
    s->seed = static_cast<uint64_t>(v);
  }
  return absl::OkStatus();
}

bool IsWordChar(char c) { return absl::ascii_isalnum(c) || c == '_'; }

}  // namespace

absl::StatusOr<std::optional<uint64_t>> SeedFromRequestId(absl::string_view id) {
  constexpr absl::string_view kToken = "seed=";
  constexpr absl::string_view kTerminators = "-/:;,|#&";
  std::optional<uint64_t> seed;
  for (size_t at = id.find(kToken); at != std::string_view::npos;
       at = id.find(kToken, at + kToken.size())) {
    if (at > 0 && IsWordChar(id[at - 1])) continue;  // "myseed=": not the token
    if (seed.has_value()) {
      return absl::InvalidArgumentError("request_id: more than one seed= token");
    }
    size_t end = at + kToken.size();
    uint64_t value = 0;
    size_t num_digits = 0;
    for (; end < id.size() && absl::ascii_isdigit(id[end]); ++end, ++num_digits) {
      const uint64_t digit = static_cast<uint64_t>(id[end] - '0');
      if (value > (std::numeric_limits<uint64_t>::max() - digit) / 10) {
        return absl::InvalidArgumentError(
            "request_id: the seed= value is out of range (at most 2^64 - 1)");
      }
      value = value * 10 + digit;
    }
    if (num_digits == 0 || (end < id.size() && kTerminators.find(id[end]) == kTerminators.npos)) {
      return absl::InvalidArgumentError(
          absl::StrCat("request_id: seed= must be followed by a decimal integer, then the id's "
                       "end or one of ",
                       kTerminators, " (got '", id.substr(at, 32), "')"));
    }
    seed = value;
  }
  return seed;
}

absl::StatusOr<engine::GenerateRequest> SglangToEngineRequest(const sgl::GenerateRequest& in,
                                                              std::string id,
                                                              const engine::EngineLimits& limits) {
  if (!in.has_tokenized()) {
    return absl::InvalidArgumentError("tokenized: required (this worker takes token ids only)");
  }
  if (in.tokenized().input_ids().empty()) {
    return absl::InvalidArgumentError("tokenized.input_ids: must not be empty");
  }
  RETURN_IF_ERROR(CheckSupported(in));
  engine::GenerateRequest r;
  r.id = std::move(id);
  r.input_ids.reserve(in.tokenized().input_ids_size());
  for (uint32_t t : in.tokenized().input_ids()) {
    if (t > static_cast<uint32_t>(std::numeric_limits<int32_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenized.input_ids: token id ", t, " is out of range"));
    }
    r.input_ids.push_back(static_cast<int32_t>(t));
  }
  const int64_t prompt_len = static_cast<int64_t>(r.input_ids.size());
  const int64_t room = std::min(limits.max_context_len, limits.max_kv_tokens) - prompt_len;
  if (room < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenized.input_ids: the prompt (", prompt_len, " tokens) is longer than the context (",
        limits.max_context_len, " tokens, KV pool ", limits.max_kv_tokens, ")"));
  }

  const sgl::SamplingParams& sp = in.sampling_params();
  engine::SamplingParams& s = r.sampling;
  s.temperature = sp.temperature();
  s.top_p = sp.top_p() == 0.0f ? 1.0 : sp.top_p();
  s.top_k = sp.top_k() == 0 ? -1 : sp.top_k();
  s.min_p = sp.min_p();
  s.repetition_penalty = sp.repetition_penalty() == 0.0f ? 1.0 : sp.repetition_penalty();
  s.frequency_penalty = sp.frequency_penalty();
  s.presence_penalty = sp.presence_penalty();
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
  s.ignore_eos = sp.ignore_eos();
  for (uint32_t t : sp.stop_token_ids()) {
    if (t > static_cast<uint32_t>(std::numeric_limits<int32_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling_params.stop_token_ids: token id ", t, " is out of range"));
    }
    s.stop_token_ids.push_back(static_cast<int32_t>(t));
  }
  // The gateway enforces stop strings on the text it decodes; the engine also stops on them
  // (saving the tokens after the match) when it has a tokenizer to decode with.
  if (limits.has_text_decoder) s.stop.assign(sp.stop().begin(), sp.stop().end());
  if (sp.n() > static_cast<uint32_t>(engine::kMaxSamplesPerRequest)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampling_params.n: must be in [1, ", engine::kMaxSamplesPerRequest, "], got ", sp.n()));
  }
  s.n = sp.n() == 0 ? 1 : static_cast<int32_t>(sp.n());
  if (sp.has_custom_params()) RETURN_IF_ERROR(ApplyCustomParams(sp.custom_params(), &s));
  ASSIGN_OR_RETURN(const std::optional<uint64_t> id_seed, SeedFromRequestId(in.request_id()));
  if (id_seed.has_value()) {
    if (s.seed.has_value() && *s.seed != *id_seed) {
      return absl::InvalidArgumentError(absl::StrCat("request_id: seed=", *id_seed,
                                                     " differs from custom_params.seed ", *s.seed));
    }
    s.seed = id_seed;
  }

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
