#include "common/sglang/sglang_request.h"

#include <cmath>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace rl::sglang {
namespace {

constexpr absl::string_view kTerminators = "-/:;,|#&";

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

bool IsWordChar(char c) { return absl::ascii_isalnum(c) || c == '_'; }

// Positions of `token` in `id` where it starts a token: at the start or after a non-word char.
template <typename Fn>
absl::Status ForEachToken(absl::string_view id, absl::string_view token, Fn fn) {
  for (size_t at = id.find(token); at != absl::string_view::npos;
       at = id.find(token, at + token.size())) {
    if (at > 0 && IsWordChar(id[at - 1])) continue;  // "myseed=": not the token
    RETURN_IF_ERROR(fn(at + token.size()));
  }
  return absl::OkStatus();
}

// custom_params: only a per-request seed ("seed" or "sampling_seed") has a counterpart.
absl::StatusOr<std::optional<uint64_t>> SeedFromCustomParams(
    const google::protobuf::Struct& params) {
  std::optional<uint64_t> seed;
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
    seed = static_cast<uint64_t>(v);
  }
  return seed;
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> ReadInputIds(const sgl::GenerateRequest& in) {
  if (!in.has_tokenized()) {
    return absl::InvalidArgumentError("tokenized: required (this worker takes token ids only)");
  }
  if (in.tokenized().input_ids().empty()) {
    return absl::InvalidArgumentError("tokenized.input_ids: must not be empty");
  }
  std::vector<int32_t> ids;
  ids.reserve(in.tokenized().input_ids_size());
  for (uint32_t t : in.tokenized().input_ids()) {
    if (t > static_cast<uint32_t>(std::numeric_limits<int32_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenized.input_ids: token id ", t, " is out of range"));
    }
    ids.push_back(static_cast<int32_t>(t));
  }
  return ids;
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

absl::StatusOr<Sampling> ReadSampling(const sgl::SamplingParams& sp, int32_t max_n) {
  Sampling s;
  s.temperature = sp.temperature();
  s.top_p = sp.top_p() == 0.0f ? 1.0 : sp.top_p();
  s.top_k = sp.top_k() == 0 ? -1 : sp.top_k();
  s.min_p = sp.min_p();
  s.repetition_penalty = sp.repetition_penalty() == 0.0f ? 1.0 : sp.repetition_penalty();
  s.frequency_penalty = sp.frequency_penalty();
  s.presence_penalty = sp.presence_penalty();
  s.ignore_eos = sp.ignore_eos();
  for (uint32_t t : sp.stop_token_ids()) {
    if (t > static_cast<uint32_t>(std::numeric_limits<int32_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling_params.stop_token_ids: token id ", t, " is out of range"));
    }
    s.stop_token_ids.push_back(static_cast<int32_t>(t));
  }
  if (sp.n() > static_cast<uint32_t>(max_n)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling_params.n: must be in [1, ", max_n, "], got ", sp.n()));
  }
  s.n = sp.n() == 0 ? 1 : static_cast<int32_t>(sp.n());
  return s;
}

absl::StatusOr<std::optional<uint64_t>> SeedFromRequestId(absl::string_view id) {
  std::optional<uint64_t> seed;
  RETURN_IF_ERROR(ForEachToken(id, "seed=", [&](size_t start) -> absl::Status {
    if (seed.has_value()) {
      return absl::InvalidArgumentError("request_id: more than one seed= token");
    }
    size_t end = start;
    uint64_t value = 0;
    for (; end < id.size() && absl::ascii_isdigit(id[end]); ++end) {
      const uint64_t digit = static_cast<uint64_t>(id[end] - '0');
      if (value > (std::numeric_limits<uint64_t>::max() - digit) / 10) {
        return absl::InvalidArgumentError(
            "request_id: the seed= value is out of range (at most 2^64 - 1)");
      }
      value = value * 10 + digit;
    }
    if (end == start || (end < id.size() && kTerminators.find(id[end]) == kTerminators.npos)) {
      return absl::InvalidArgumentError(
          absl::StrCat("request_id: seed= must be followed by a decimal integer, then the id's "
                       "end or one of ",
                       kTerminators, " (got '", id.substr(start - 5, 32), "')"));
    }
    seed = value;
    return absl::OkStatus();
  }));
  return seed;
}

absl::StatusOr<std::optional<uint64_t>> ReadSeed(const sgl::GenerateRequest& in) {
  std::optional<uint64_t> seed;
  if (in.sampling_params().has_custom_params()) {
    ASSIGN_OR_RETURN(seed, SeedFromCustomParams(in.sampling_params().custom_params()));
  }
  ASSIGN_OR_RETURN(const std::optional<uint64_t> id_seed, SeedFromRequestId(in.request_id()));
  if (id_seed.has_value()) {
    if (seed.has_value() && *seed != *id_seed) {
      return absl::InvalidArgumentError(
          absl::StrCat("request_id: seed=", *id_seed, " differs from custom_params.seed ", *seed));
    }
    seed = id_seed;
  }
  return seed;
}

absl::StatusOr<std::optional<std::string>> EpisodeFromRequestId(absl::string_view id) {
  std::optional<std::string> episode;
  RETURN_IF_ERROR(ForEachToken(id, "episode=", [&](size_t start) -> absl::Status {
    if (episode.has_value()) {
      return absl::InvalidArgumentError("request_id: more than one episode= token");
    }
    size_t end = start;
    while (end < id.size() && (IsWordChar(id[end]) || id[end] == '.')) ++end;
    if (end == start || end - start > kMaxEpisodeIdBytes ||
        (end < id.size() && kTerminators.find(id[end]) == kTerminators.npos)) {
      return absl::InvalidArgumentError(
          absl::StrCat("request_id: episode= must be followed by 1 to ", kMaxEpisodeIdBytes,
                       " letters, digits, '_' or '.', then the id's end or one of ", kTerminators,
                       " (got '", id.substr(start - 8, 48), "')"));
    }
    episode = std::string(id.substr(start, end - start));
    return absl::OkStatus();
  }));
  return episode;
}

}  // namespace rl::sglang
