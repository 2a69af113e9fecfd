#include "common/request_limits.h"

#include <openssl/rand.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/flags.h"
#include "common/model_io/dtype.h"
#include "common/status.h"
#include "common/version_constraint.h"

namespace rl {

namespace {

absl::Status OverLimit(absl::string_view field, int64_t value, const char* flag, int64_t limit) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", value, " is more than --", flag, " (", limit, ")"));
}

}  // namespace

void RegisterRequestLimitFlags(FlagSet& f, RequestLimits* l) {
  f.Int("max-n", &l->max_n, "limit: samples per Generate request (sampling_params.n)");
  f.Int("max-prompt-bytes", &l->max_prompt_bytes, "limit: bytes of a text prompt");
  f.Int("max-prompt-tokens", &l->max_prompt_tokens, "limit: tokens of a prompt (ids or encoded)");
  f.Int("max-new-tokens-limit", &l->max_new_tokens,
        "limit: sampling_params.max_new_tokens (a worker also caps it at its context)");
  f.Int("max-stop-strings", &l->max_stop_strings, "limit: stop strings per request");
  f.Int("max-stop-string-bytes", &l->max_stop_string_bytes, "limit: bytes of one stop string");
  f.Int("max-stop-token-ids", &l->max_stop_token_ids, "limit: stop_token_ids per request");
  f.Int("max-top-logprobs", &l->max_top_logprobs, "limit: top_logprobs_num");
  f.Int("max-request-id-bytes", &l->max_request_id_bytes, "limit: bytes of a request_id");
  f.Int("max-tensor-chunk-bytes", &l->max_tensor_chunk_bytes,
        "limit: data bytes of one UpdateWeightsFromTensor chunk");
  f.Int("max-update-bytes", &l->max_update_bytes,
        "limit: bytes of all tensors of one UpdateWeightsFromTensor stream");
  f.Int("max-tensor-rank", &l->max_tensor_rank, "limit: dimensions of a tensor shape");
  f.Int("max-address-bytes", &l->max_address_bytes, "limit: bytes of a worker address");
  f.Int("max-path-bytes", &l->max_path_bytes, "limit: bytes of an UpdateWeightsFromDisk path");
}

absl::Status ValidateRequestLimits(const RequestLimits& l) {
  struct Range {
    const char* flag;
    int64_t value;
    int64_t lo;
    int64_t hi;
  };
  const Range ranges[] = {
      {"max-n", l.max_n, 1, 4096},
      {"max-prompt-bytes", l.max_prompt_bytes, 1, int64_t{1} << 30},
      {"max-prompt-tokens", l.max_prompt_tokens, 1, int64_t{1} << 26},
      {"max-new-tokens-limit", l.max_new_tokens, 1, int64_t{1} << 26},
      {"max-stop-strings", l.max_stop_strings, 0, 4096},
      {"max-stop-string-bytes", l.max_stop_string_bytes, 1, 1 << 20},
      {"max-stop-token-ids", l.max_stop_token_ids, 0, 1 << 20},
      {"max-top-logprobs", l.max_top_logprobs, 0, 1024},
      {"max-request-id-bytes", l.max_request_id_bytes, 1, 1 << 16},
      {"max-tensor-chunk-bytes", l.max_tensor_chunk_bytes, 1024, int64_t{2} << 30},
      {"max-update-bytes", l.max_update_bytes, 1024, int64_t{1} << 50},
      {"max-tensor-rank", l.max_tensor_rank, 1, 64},
      {"max-address-bytes", l.max_address_bytes, 8, 1 << 16},
      {"max-path-bytes", l.max_path_bytes, 16, 1 << 16},
  };
  for (const Range& r : ranges) {
    if (r.value < r.lo || r.value > r.hi) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", r.flag, ": ", r.value, " is not in [", r.lo, ", ", r.hi, "]"));
    }
  }
  return absl::OkStatus();
}

std::string QuoteForError(absl::string_view s, size_t max_bytes) {
  size_t keep = std::min(s.size(), max_bytes);
  // Do not cut a UTF-8 sequence: back up over continuation bytes.
  if (keep < s.size()) {
    while (keep > 0 && (static_cast<unsigned char>(s[keep]) & 0xC0) == 0x80) --keep;
  }
  std::string out = "'";
  for (size_t i = 0; i < keep; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7F || c == '\'' || c == '\\') {
      absl::StrAppend(&out, absl::StrFormat("\\x%02x", c));
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  out += "'";
  if (keep < s.size()) absl::StrAppend(&out, "... (", s.size(), " bytes)");
  return out;
}

absl::Status CheckGenerateRequest(const rl::v1::GenerateRequest& r, const RequestLimits& l,
                                  int64_t context_len) {
  if (static_cast<int64_t>(r.request_id().size()) > l.max_request_id_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id: ", r.request_id().size(), " bytes is more than --",
                     "max-request-id-bytes (", l.max_request_id_bytes, ")"));
  }
  if (absl::StartsWith(r.request_id(), kServerRequestIdPrefix)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request_id: the prefix '", kServerRequestIdPrefix,
        "' is reserved for ids the server assigns (leave request_id empty to get one)"));
  }
  if (r.prompt_case() == rl::v1::GenerateRequest::kText &&
      static_cast<int64_t>(r.text().size()) > l.max_prompt_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("text: ", r.text().size(),
                                                   " bytes is more than --max-prompt-bytes (",
                                                   l.max_prompt_bytes, ")"));
  }
  if (r.prompt_case() == rl::v1::GenerateRequest::kInputIds) {
    RETURN_IF_ERROR(CheckPromptTokens(r.input_ids().ids_size(), l));
  }
  const rl::v1::SamplingParams& sp = r.sampling_params();
  if (sp.has_n()) {
    if (sp.n() < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("n: ", sp.n(), " must be in [1, --max-n (", l.max_n, ")]"));
    }
    if (sp.n() > l.max_n) return OverLimit("n", sp.n(), "max-n", l.max_n);
  }
  if (sp.has_max_new_tokens()) {
    if (sp.max_new_tokens() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("max_new_tokens: ", sp.max_new_tokens(), " must be >= 0"));
    }
    // RESOURCE_EXHAUSTED, as for a prompt + max_new_tokens longer than the context (DESIGN.md).
    if (sp.max_new_tokens() > l.max_new_tokens) {
      return absl::ResourceExhaustedError(absl::StrCat("max_new_tokens: ", sp.max_new_tokens(),
                                                       " is more than --", "max-new-tokens-limit (",
                                                       l.max_new_tokens, ")"));
    }
    if (context_len > 0 && sp.max_new_tokens() > context_len) {
      return absl::ResourceExhaustedError(absl::StrCat("max_new_tokens: ", sp.max_new_tokens(),
                                                       " is more than the model's context (",
                                                       context_len, " tokens)"));
    }
  }
  if (sp.stop_size() > l.max_stop_strings) {
    return OverLimit("stop", sp.stop_size(), "max-stop-strings", l.max_stop_strings);
  }
  for (int i = 0; i < sp.stop_size(); ++i) {
    if (static_cast<int64_t>(sp.stop(i).size()) > l.max_stop_string_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop[", i, "]: ", sp.stop(i).size(), " bytes (", QuoteForError(sp.stop(i)),
                       ") is more than --max-stop-string-bytes (", l.max_stop_string_bytes, ")"));
    }
  }
  if (sp.stop_token_ids_size() > l.max_stop_token_ids) {
    return OverLimit("stop_token_ids", sp.stop_token_ids_size(), "max-stop-token-ids",
                     l.max_stop_token_ids);
  }
  if (r.has_logprob_start_len() && !r.return_logprob()) {
    return absl::InvalidArgumentError("logprob_start_len: needs return_logprob");
  }
  if (r.top_logprobs_num() != 0 && !r.return_logprob()) {
    return absl::InvalidArgumentError("top_logprobs_num: needs return_logprob");
  }
  if (r.top_logprobs_num() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_logprobs_num: ", r.top_logprobs_num(), " must be >= 0"));
  }
  if (r.top_logprobs_num() > l.max_top_logprobs) {
    return OverLimit("top_logprobs_num", r.top_logprobs_num(), "max-top-logprobs",
                     l.max_top_logprobs);
  }
  RETURN_IF_ERROR(VersionConstraintOf(r).Validate());
  if (r.has_resume_from()) {
    // Resume (issue 34): bounded here, checked against the model's context by the worker.
    const rl::v1::ResumeFrom& rf = r.resume_from();
    if (static_cast<int64_t>(rf.request_id().size()) > l.max_request_id_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "resume_from.request_id: ", rf.request_id().size(),
          " bytes is more than --max-request-id-bytes (", l.max_request_id_bytes, ")"));
    }
    if (rf.output_ids_size() > l.max_new_tokens) {
      return OverLimit("resume_from.output_ids", rf.output_ids_size(), "max-new-tokens-limit",
                       l.max_new_tokens);
    }
    if (rf.output_logprobs_size() != 0 && rf.output_logprobs_size() != rf.output_ids_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("resume_from.output_logprobs: ", rf.output_logprobs_size(), " logprobs for ",
                       rf.output_ids_size(), " output ids (one per id, or none)"));
    }
    if (rf.weight_version_segments_size() > rf.output_ids_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("resume_from.weight_version_segments: ", rf.weight_version_segments_size(),
                       " segments for ", rf.output_ids_size(), " output ids"));
    }
    if (!rf.request_id().empty() && rf.output_ids_size() > 0) {
      return absl::InvalidArgumentError(
          "resume_from: set request_id (the router keeps the sample) or output_ids, not both");
    }
    if (sp.has_n() && sp.n() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("n: ", sp.n(), ": a resume continues one sample, n must be 1"));
    }
  }
  return absl::OkStatus();
}

std::string NewServerRequestId(absl::string_view prefix) {
  uint8_t bytes[16];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    // No entropy source: fall back to a process-unique counter mixed with the clock (still in
    // the server namespace, so it cannot collide with client ids).
    static std::atomic<uint64_t> counter{0};
    const uint64_t a =
        counter.fetch_add(1) ^
        static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    std::memcpy(bytes, &a, sizeof(a));
    std::memset(bytes + 8, 0, 8);
  }
  std::string out(prefix);
  for (uint8_t b : bytes) absl::StrAppend(&out, absl::Hex(b, absl::kZeroPad2));
  return out;
}

absl::Status CheckPromptTokens(int64_t num_tokens, const RequestLimits& l) {
  if (num_tokens > l.max_prompt_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("prompt: ", num_tokens,
                                                   " tokens is more than --max-prompt-tokens (",
                                                   l.max_prompt_tokens, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckAddress(absl::string_view address, const RequestLimits& l) {
  if (address.empty()) return absl::InvalidArgumentError("address: must not be empty");
  if (static_cast<int64_t>(address.size()) > l.max_address_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("address: ", address.size(), " bytes (", QuoteForError(address),
                     ") is more than --max-address-bytes (", l.max_address_bytes, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckPath(absl::string_view field, absl::string_view path, const RequestLimits& l) {
  if (static_cast<int64_t>(path.size()) > l.max_path_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", path.size(), " bytes (", QuoteForError(path),
                     ") is more than --max-path-bytes (", l.max_path_bytes, ")"));
  }
  if (path.find('\0') != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": contains a NUL byte"));
  }
  return absl::OkStatus();
}

absl::Status CheckedNumElements(absl::Span<const int64_t> shape, int64_t max_rank, int64_t* out) {
  if (static_cast<int64_t>(shape.size()) > max_rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape: rank ", shape.size(), " is more than --max-tensor-rank (", max_rank, ")"));
  }
  ASSIGN_OR_RETURN(*out, model_io::CheckedNumElements(shape));
  return absl::OkStatus();
}

absl::Status CheckTensorChunk(const rl::v1::TensorChunk& c, const RequestLimits& l,
                              int64_t* num_bytes) {
  if (c.name().empty()) return absl::InvalidArgumentError("chunk.name: must not be empty");
  if (c.name().size() > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("chunk.name: ", c.name().size(), " bytes (",
                                                   QuoteForError(c.name()), ") is more than 1024"));
  }
  const std::optional<model_io::DType> dtype = model_io::ParseDType(c.dtype());
  if (!dtype || !model_io::IsFloatWeightDType(*dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("chunk.dtype: ", QuoteForError(c.dtype()),
                                                   " for ", QuoteForError(c.name()),
                                                   " (F32, BF16 or F16)"));
  }
  if (static_cast<int64_t>(c.data().size()) > l.max_tensor_chunk_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("chunk.data: ", c.data().size(),
                                                   " bytes is more than --max-tensor-chunk-bytes (",
                                                   l.max_tensor_chunk_bytes, ")"));
  }
  int64_t numel = 0;  // the rank is checked before the shape is read, without a copy
  if (absl::Status s = CheckedNumElements(c.shape(), l.max_tensor_rank, &numel); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk.", s.message(), " (tensor ", QuoteForError(c.name()), ")"));
  }
  const int64_t size = model_io::DTypeSize(*dtype);
  if (numel > l.max_update_bytes / size) {
    return absl::InvalidArgumentError(absl::StrCat("chunk.shape: tensor ", QuoteForError(c.name()),
                                                   " needs more than --max-update-bytes (",
                                                   l.max_update_bytes, ")"));
  }
  *num_bytes = numel * size;
  return absl::OkStatus();
}

}  // namespace rl
